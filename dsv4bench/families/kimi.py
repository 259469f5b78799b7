"""Kimi (Moonshot): K2's tool calls in a section of bar tokens, K3's in XTML.

    <|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0
    <|tool_call_argument_begin|>{"path": "a.py"}<|tool_call_end|><|tool_calls_section_end|>

(SGLang and vLLM `kimi_k2`). Every one of these is a special token, as are the chat tokens
`<|im_user|>`, `<|im_assistant|>`, `<|im_system|>`, `<|im_middle|>`, `<|im_end|>`. Thinking
variants write `<think>` ... `</think>`.

Kimi K3 (SGLang `kimi_k3`) writes XTML: `<|open|>tools<|sep|><|open|>call tool="read_file"
index="1"<|sep|><|open|>argument key="path" type="string"<|sep|>a.py<|close|>argument<|sep|>
<|close|>call<|sep|><|close|>tools<|sep|>`, its thinking in `<|open|>think<|sep|>` ...
`<|close|>think<|sep|>`. Leaks seen in the wild glue the channel name to the call
(`<|open|>toolscall tool="Shell" index="1"<|sep|>`).
"""

from __future__ import annotations

import re

from dsv4bench.families.base import BARS, Family, Marker, json_call_at, tokens_marker

_B = f"[{re.escape(BARS)}]"
_I = re.IGNORECASE
_SECTION = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
)
_CALL = re.compile(
    rf"<\s*{_B}{{1,2}}\s*tool_call_begin\s*{_B}{{1,2}}\s*>\s*(?:functions\.)?[\w.\-]+:\d+\s*"
    rf"<\s*{_B}{{1,2}}\s*tool_call_argument_begin",
    _I,
)


def _call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    """A section or call token followed by `functions.NAME:N<|tool_call_argument_begin|>`."""
    return _CALL.search(text, m.start(), m.end() + 300) is not None


# A call whose tokens the detokenizer dropped: `functions.NAME:0{...}` (K2's call id, then its arguments).
_BARE_CALL = Marker(
    "Kimi call id without its tokens",
    re.compile(r"\bfunctions\.[\w\-]+:\d+\s*(?=\{)"),
    structural=lambda m, text, offered: json_call_at(text, m.end()) is not None,
)
_TOOLS = tokens_marker("Kimi tool-call token", _SECTION, tool_markup=True)
_TOOLS = Marker(_TOOLS.kind, _TOOLS.pattern, True, _call, _TOOLS.spellings)

_XTML_CALL = re.compile(r"<\|open\|>\s*(?:tools\s*(?:<\|sep\|>\s*<\|open\|>)?\s*)?call\s+tool\s*=\s*\"[^\"<>]+\"")
_XTML_TOOL = Marker(
    "Kimi K3 call markup",
    re.compile(
        r"<\|(?:open|close)\|>\s*(?:tools|call|argument|toolscall|toolsmessage)\b(?:\s+\w+\s*=\s*\"[^\"<>\n]*\")*"
        r"(?:\s*<\|sep\|>)?"
    ),
    structural=lambda m, text, offered: _XTML_CALL.match(text, m.start()) is not None,
)
_XTML_TOKENS = tokens_marker("Kimi K3 XTML token", ("<|open|>", "<|close|>", "<|sep|>"))

FAMILIES = (
    Family(
        name="kimi-k3",
        group="kimi",
        title="Kimi K3 (XTML <|open|>call tool=...)",
        models=re.compile(r"kimi[-_ ]?k3", _I),
        parsers=("kimi_k3",),
        markers=(_XTML_TOOL, _XTML_TOKENS),
        sglang_parsers=("kimi_k3",),
        reasoning_parser="kimi_k3",
        raw_signature=re.compile(r"<\|open\|>\s*(?:tools|call)"),
    ),
    Family(
        name="kimi-k2",
        group="kimi",
        title="Kimi K2 (<|tool_calls_section_begin|>)",
        models=re.compile(r"kimi|moonshot", _I),
        parsers=("kimi_k2",),
        markers=(
            _TOOLS,
            _BARE_CALL,
            tokens_marker(
                "Kimi special token",
                ("<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<|im_end|>"),
            ),
            tokens_marker("thinking marker", ("<think>", "</think>")),
        ),
        sglang_parsers=("kimi_k2",),
        reasoning_parser="kimi_k2",
        raw_signature=re.compile(r"<\|tool_calls_section_begin\|>"),
    ),
)
