"""gpt-oss (OpenAI's open-weight models): the harmony format.

A call is a commentary-channel message addressed to a function::

    <|start|>assistant<|channel|>commentary to=functions.read_file <|constrain|>json
    <|message|>{"path": "a.py"}<|call|>

(SGLang `gpt-oss`, vLLM `openai`). All of `<|start|>`, `<|channel|>`, `<|message|>`,
`<|constrain|>`, `<|end|>`, `<|call|>`, `<|return|>` are special tokens. When a server strips
them but misses the call, the text left behind still reads `commentary to=functions.NAME ...`:
that recipient is harmony's tool-call markup with or without the tokens. The analysis channel is
the reasoning; a server that strips the tokens but never splits the channels sends
`analysis...assistantfinal...`, a channel header glued to its role.
"""

from __future__ import annotations

import re

from dsv4bench.families.base import Family, Marker, json_call_at, tokens_marker

_I = re.IGNORECASE
_TOKENS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|return|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|endofprompt|>",
)
# Only a call uses these two: they are its markup, not stray tokens.
_CALL_TOKENS = ("<|constrain|>", "<|call|>")
# The header of a call message, from its start token (when kept) to the end of its recipient and
# content type: one finding, not one per token in it.
_RECIPIENT = re.compile(
    r"(?:<\|start\|>\s*assistant\s*)?(?:<\|channel\|>\s*\w+\s*)?"
    r"\bto=functions\.(?P<fname>[\w.\-]+)"
    r"(?P<ctype>\s*(?:<\|constrain\|>\s*)?(?:json|code)\b)?\s*(?:<\|message\|>)?"
)


def _recipient_call(m: re.Match[str], text: str, offered: frozenset[str]) -> bool:
    """`to=functions.NAME`, a JSON content type, then a JSON object: a call with its arguments. The
    match holds the header alone, so a marker quoted in prose is judged by itself."""
    return m.group("ctype") is not None and json_call_at(text, m.end()) is not None


# A channel header whose tokens the detokenizer dropped, as servers that strip harmony's tokens
# without parsing the channels leave it: `analysisWe need...assistantfinalfour` (the role glued to
# the channel, the channel to the text).
_BARE_HEADER = re.compile(
    r"(?<![A-Za-z])(?:<\|start\|>)?assistant(?:<\|channel\|>)?(?:final|analysis|commentary)"
    r"|\Aanalysis(?=[A-Z])"
)

FAMILIES = (
    Family(
        name="gpt-oss",
        group="gpt-oss",
        title="gpt-oss (harmony)",
        models=re.compile(r"gpt[-_]?oss", _I),
        parsers=("gpt-oss", "openai", "harmony"),
        markers=(
            Marker("harmony recipient to=functions.NAME", _RECIPIENT, structural=_recipient_call),
            tokens_marker("harmony call token", _CALL_TOKENS, tool_markup=True),
            Marker("harmony channel header without its tokens", _BARE_HEADER, tool_markup=False),
            tokens_marker("harmony special token", _TOKENS),
        ),
        sglang_parsers=("gpt-oss",),
        reasoning_parser="gpt-oss",
        raw_signature=re.compile(r"<\|channel\|>|<\|start\|>assistant"),
    ),
)
