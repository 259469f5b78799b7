"""Qwen: Hermes-style JSON calls (Qwen2.5 / Qwen3, and NousResearch's Hermes models) and
Qwen3-Coder's XML calls.

- Hermes: `<tool_call>\\n{"name": "read_file", "arguments": {"path": "a.py"}}\\n</tool_call>`
  (SGLang `qwen` / `qwen25` / `hermes`, vLLM `hermes`);
- Qwen3-Coder: `<tool_call>\\n<function=read_file>\\n<parameter=path>\\na.py\\n</parameter>\\n
  </function>\\n</tool_call>` (SGLang and vLLM `qwen3_coder`).

`<tool_call>` is an added, non-special token in Qwen's vocabulary: the detokenizer keeps it as
text, so a parser that misses a call leaves the whole block in `content`. ChatML's
`<|im_start|>` / `<|im_end|>` / `<|endoftext|>` are special and never reach a client from a
correct server. Thinking models write `<think>` ... `</think>`.
"""

from __future__ import annotations

import re

from dsv4bench.families.base import Family, Marker, json_call_at, named_call, tokens_marker

_I = re.IGNORECASE


def _hermes_call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    """`<tool_call>` followed by a JSON object that names a call."""
    return named_call(json_call_at(text, m.end()))


def _coder_call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    """`<function=NAME>` with a name: Qwen3-Coder's call opener."""
    return bool(m.group("fname"))


TOOL_CALL_TAG = Marker("<tool_call> tag", re.compile(r"<\s*tool_call\s*>", _I), structural=_hermes_call)
TOOL_CALL_CLOSE = Marker("</tool_call> tag", re.compile(r"<\s*/\s*tool_call\s*>", _I))
_CODER = (
    Marker("Qwen3-Coder <function=...>", re.compile(r"<function=(?P<fname>[\w.\-]+)>"), structural=_coder_call),
    Marker("Qwen3-Coder <parameter=...>", re.compile(r"<parameter=[\w.\-]+>")),
    Marker("Qwen3-Coder closing tag", re.compile(r"</(?:function|parameter)>")),
)
CHATML = tokens_marker("ChatML special token", ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
THINKING = tokens_marker("thinking marker", ("<think>", "</think>"))

FAMILIES = (
    Family(
        name="qwen3-coder",
        group="qwen",
        title="Qwen3-Coder (XML <function=...>)",
        models=re.compile(r"qwen3[-_.]?coder", _I),
        parsers=("qwen3_coder", "qwen3_xml"),
        markers=(TOOL_CALL_TAG, TOOL_CALL_CLOSE, *_CODER, CHATML, THINKING),
        sglang_parsers=("qwen3_coder",),
        reasoning_parser="qwen3",
        raw_signature=re.compile(r"<tool_call>\s*<function="),
    ),
    Family(
        name="qwen",
        group="qwen",
        title="Qwen / Hermes (<tool_call>{json}</tool_call>)",
        models=re.compile(r"qwen|qwq|hermes", _I),
        parsers=("qwen", "qwen25", "hermes"),
        markers=(TOOL_CALL_TAG, TOOL_CALL_CLOSE, CHATML, THINKING),
        sglang_parsers=("qwen25", "hermes"),
        reasoning_parser="qwen3",
        raw_signature=re.compile(r"<tool_call>\s*\{"),
    ),
)
