"""GLM-4.5 / 4.6 / 4.7 (Zhipu): `<tool_call>NAME` then key / value pairs.

    <tool_call>read_file
    <arg_key>path</arg_key>
    <arg_value>a.py</arg_value>
    </tool_call>

(SGLang `glm` / `glm45` / `glm47`, vLLM `glm45`). The chat tokens `<|user|>`, `<|assistant|>`,
`<|system|>`, `<|observation|>`, `<|endoftext|>`, `[gMASK]` and `<sop>` are special. Thinking:
`<think>` ... `</think>`.
"""

from __future__ import annotations

import re

from dsv4bench.families.base import Family, Marker, tokens_marker

_I = re.IGNORECASE
_CALL = re.compile(r"<\s*tool_call\s*>\s*[\w.\-]+\s*(?:<\s*arg_key\s*>|<\s*/\s*tool_call\s*>)", _I)


def _call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    """`<tool_call>NAME` followed by its first `<arg_key>` (or its close, for a call with none)."""
    return _CALL.match(text, m.start()) is not None


FAMILIES = (
    Family(
        name="glm",
        group="glm",
        title="GLM-4.5+ (<tool_call>NAME<arg_key>...)",
        models=re.compile(r"glm|chatglm|zai-org", _I),
        parsers=("glm", "glm45", "glm47", "glm4_moe"),
        markers=(
            Marker("GLM <tool_call> tag", re.compile(r"<\s*tool_call\s*>", _I), structural=_call),
            Marker("GLM </tool_call> tag", re.compile(r"<\s*/\s*tool_call\s*>", _I)),
            Marker("GLM argument tag", re.compile(r"<\s*/?\s*arg_(?:key|value)\s*>", _I)),
            tokens_marker(
                "GLM special token",
                (
                    "<|user|>",
                    "<|assistant|>",
                    "<|system|>",
                    "<|observation|>",
                    "<|endoftext|>",
                    "[gMASK]",
                    "<sop>",
                    "<eop>",
                ),
            ),
            tokens_marker("thinking marker", ("<think>", "</think>")),
        ),
        sglang_parsers=("glm45", "glm47"),
        reasoning_parser="glm45",
        raw_signature=re.compile(r"<tool_call>\s*[\w.\-]+\s*<arg_key>"),
    ),
)
