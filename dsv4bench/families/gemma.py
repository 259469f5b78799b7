"""Gemma (Google): turn tokens, and Gemma 4's tool-call tokens.

- Gemma 4 (SGLang `gemma4`): `<|tool_call>call:read_file{path:<|"|>a.py<|"|>}<tool_call|>`;
- FunctionGemma: `<start_function_call>call:read_file{path:<escape>a.py<escape>}<end_function_call>`;
- every Gemma: `<start_of_turn>`, `<end_of_turn>`, `<bos>`, `<eos>` are special tokens.
"""

from __future__ import annotations

import re

from dsv4bench.families.base import Family, Marker, tokens_marker

_I = re.IGNORECASE
_CALL = re.compile(r"(?:<\|tool_call>|<start_function_call>)\s*call\s*:\s*[\w.\-]+\s*\{")


def _call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    """The call opener followed by `call:NAME{`."""
    return _CALL.match(text, m.start()) is not None


FAMILIES = (
    Family(
        name="gemma",
        group="gemma",
        title="Gemma (<start_of_turn>; Gemma 4 <|tool_call>)",
        models=re.compile(r"gemma", _I),
        parsers=("gemma4", "gemma", "functiongemma"),
        markers=(
            Marker(
                "Gemma tool-call token",
                re.compile(
                    r"<\|tool_call>|<tool_call\|>|<start_function_call>|<end_function_call>|"
                    r"<start_function_response>|<end_function_response>|<\|\"\|>"
                ),
                structural=_call,
            ),
            tokens_marker("Gemma special token", ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>")),
        ),
        sglang_parsers=("gemma4",),
        raw_signature=re.compile(r"<\|tool_call>"),
    ),
)
