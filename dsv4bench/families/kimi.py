"""Kimi K2 (Moonshot): tool calls in a section of bar tokens.

    <|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0
    <|tool_call_argument_begin|>{"path": "a.py"}<|tool_call_end|><|tool_calls_section_end|>

(SGLang and vLLM `kimi_k2`). Every one of these is a special token, as are the chat tokens
`<|im_user|>`, `<|im_assistant|>`, `<|im_system|>`, `<|im_middle|>`, `<|im_end|>`. Thinking
variants write `<think>` ... `</think>`.
"""

from __future__ import annotations

import re

from .base import BARS, Family, Marker, json_call_at, tokens_marker

_B = f"[{re.escape(BARS)}]"
_I = re.IGNORECASE
_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
            "<|tool_call_end|>", "<|tool_call_argument_begin|>")
_CALL = re.compile(rf"<\s*{_B}{{1,2}}\s*tool_call_begin\s*{_B}{{1,2}}\s*>\s*(?:functions\.)?[\w.\-]+:\d+\s*"
                   rf"<\s*{_B}{{1,2}}\s*tool_call_argument_begin", _I)


def _call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    """A section or call token followed by `functions.NAME:N<|tool_call_argument_begin|>`."""
    return _CALL.search(text, m.start(), m.end() + 300) is not None


# A call whose tokens the detokenizer dropped: `functions.NAME:0{...}` (K2's call id, then its arguments).
_BARE_CALL = Marker("Kimi call id without its tokens", re.compile(r"\bfunctions\.[\w\-]+:\d+\s*(?=\{)"),
                    structural=lambda m, text, offered: json_call_at(text, m.end()) is not None)
_TOOLS = tokens_marker("Kimi tool-call token", _SECTION, tool_markup=True)
_TOOLS = Marker(_TOOLS.kind, _TOOLS.pattern, True, _call, _TOOLS.spellings)

FAMILIES = (
    Family(name="kimi-k2", group="kimi",
           title="Kimi K2 (<|tool_calls_section_begin|>)",
           models=re.compile(r"kimi|moonshot", _I), parsers=("kimi_k2",),
           markers=(_TOOLS, _BARE_CALL, tokens_marker("Kimi special token", ("<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                                                                "<|im_middle|>", "<|im_end|>")),
                    tokens_marker("thinking marker", ("<think>", "</think>"))),
           sglang_parsers=("kimi_k2",), reasoning_parser="kimi",
           raw_signature=re.compile(r"<\|tool_calls_section_begin\|>")),
)
