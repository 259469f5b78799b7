"""Mistral: `[TOOL_CALLS]` control tokens (mistral-common renders and parses them).

- v3 tokenizers: `[TOOL_CALLS] [{"name": "read_file", "arguments": {"path": "a.py"}}]`;
- v11+ (tekken): `[TOOL_CALLS]read_file[ARGS]{"path": "a.py"}`.

(SGLang and vLLM `mistral`). The control tokens `[INST]`, `[/INST]`, `[AVAILABLE_TOOLS]`,
`[TOOL_RESULTS]`, `[THINK]` / `[/THINK]` (Magistral's reasoning) and the end of sequence `</s>`
never reach a client from a correct server. They are matched in upper case only, as the
tokenizer spells them: `[args]` in prose is not `[ARGS]`. `</s>` counts only with no `<s>`
before it in the text, since `<s>...</s>` is HTML's strikethrough.
"""

from __future__ import annotations

import re

from dsv4bench.families.base import Family, Marker, Markup, json_call_at, named_call

_CALLS = re.compile(r"\[TOOL_CALLS\]")
_COMPACT = re.compile(r"\[TOOL_CALLS\]\s*[\w.\-]+\s*(?:\[CALL_ID\]\s*\w+\s*)?\[ARGS\]\s*\{")


def _call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    """`[TOOL_CALLS]` then a JSON list of named calls, or the compact `NAME[ARGS]{...}`."""
    if _COMPACT.match(text, m.start()):
        return True
    rest = text[m.end() :].lstrip()
    if rest.startswith("["):
        return named_call(json_call_at(rest, 1))
    return named_call(json_call_at(text, m.end()))


_CONTROL = re.compile(r"\[/?(?:INST|AVAILABLE_TOOLS|TOOL_RESULTS|SYSTEM_PROMPT|THINK|TOOL_CONTENT)\]")
_CALL_PARTS = re.compile(r"\[ARGS\]|\[CALL_ID\]")  # only a call uses these: its markup


def unpaired_eos(text: str, offered: frozenset[str]) -> list[Markup]:
    """`</s>` with no `<s>` before it: the end-of-sequence token, not a strikethrough's close."""
    at = text.find("</s>")
    if at < 0 or "<s>" in text[:at]:
        return []
    return [Markup(at, at + 4, "mistral", "end-of-sequence token </s>", "</s>", False, False)]


FAMILIES = (
    Family(
        name="mistral",
        group="mistral",
        title="Mistral ([TOOL_CALLS])",
        models=re.compile(r"mistral|mixtral|magistral|devstral|codestral|ministral", re.IGNORECASE),
        parsers=("mistral",),
        markers=(
            Marker("[TOOL_CALLS]", _CALLS, structural=_call),
            Marker("Mistral call token", _CALL_PARTS),
            Marker("Mistral control token", _CONTROL, tool_markup=False),
        ),
        sglang_parsers=("mistral",),
        raw_signature=_CALLS,
        renderer="mistral-common",
        extra_finders=(unpaired_eos,),
    ),
)
