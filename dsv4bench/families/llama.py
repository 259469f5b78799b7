"""Llama 3.x (Meta): JSON calls, after `<|python_tag|>` or as the whole answer.

    <|python_tag|>{"name": "read_file", "parameters": {"path": "a.py"}}<|eom_id|>

(SGLang and vLLM `llama3_json`/`llama3`). Llama 3.1+ also answers a call as a bare JSON object
`{"name": ..., "parameters": {...}}`: content that is exactly such an object naming an offered
tool is a call its parser missed. `<|python_tag|>`, `<|eom_id|>`, `<|eot_id|>`,
`<|start_header_id|>`, `<|end_header_id|>`, `<|begin_of_text|>` are special tokens.
"""

from __future__ import annotations

import re

from dsv4bench.families.base import Family, Marker, Markup, decodes_as_object, json_call_at, named_call, tokens_marker

_I = re.IGNORECASE
_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
)
# `<|eom_id|>` ends the message of a call (the model waits for its result): the call's own markup.


def _tag_call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    return named_call(json_call_at(text, m.end()))


def bare_json_call(text: str, offered: frozenset[str]) -> list[Markup]:
    """The whole text is one JSON call object naming an offered tool (Llama's bare form)."""
    stripped = text.strip()
    if not offered or not stripped.startswith("{"):
        return []
    value = decodes_as_object(stripped)
    if not named_call(value) or value["name"] not in offered:
        return []
    start = text.index("{")
    return [Markup(start, start + len(stripped), "llama", "bare JSON call", stripped, True, True)]


FAMILIES = (
    Family(
        name="llama3",
        group="llama",
        title="Llama 3.x (<|python_tag|>, JSON calls)",
        models=re.compile(r"llama[-_ ]?3|llama[-_ ]?4", _I),
        parsers=("llama3", "llama3_json", "llama4_json"),
        markers=(
            Marker(
                "<|python_tag|>",
                tokens_marker("", ("<|python_tag|>",)).pattern,
                structural=_tag_call,
                spellings=frozenset({"<|python_tag|>"}),
            ),
            tokens_marker("Llama end of a call message", ("<|eom_id|>",), tool_markup=True),
            tokens_marker("Llama special token", _TOKENS),
        ),
        sglang_parsers=("llama3",),
        raw_signature=re.compile(r"<\|python_tag\|>"),
        extra_finders=(bare_json_call,),
    ),
)
