"""What one model family's output format is to the checkers: its markers (tool-call markup and
special tokens, in every spelling seen in the wild), and how a server says it serves the family.

A `Family` is data plus one finder. `find_markup` runs a family's markers over a text and says,
for each match, whether it is tool-call markup or a special token and whether it is structural:
a block that parses as a call (a name and arguments), the strongest evidence of a parser that
failed. The checkers (dsv4bench/checks/markup.py) decide what a match means for a turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeGuard

# Vertical bars seen in place of a token's bar: ASCII, fullwidth, divides, Latin dental click,
# ornament bar, halfwidth forms light vertical, box drawings light/heavy vertical, Hebrew paseq,
# double vertical line, parallel-to, vertical line extension, presentation forms. Tokenizers
# that lost the fullwidth bar (a bad conversion, a template copied by hand) write any of them.
BARS = "|\uff5c\u2223\u01c0\u2758\uffe8\u2502\u2503\u05c0\u2016\u2225\u23d0\ufe31\ufe32"
_BAR = f"[{re.escape(BARS)}]"
# Between a token's words: SentencePiece's `▁`, an underscore, a space, or nothing at all.
_SEP = "[\u2581_ ]?"


class Markup(NamedTuple):
    """One match of a family's marker in a text."""

    start: int
    end: int
    family: str
    kind: str  # what it is, e.g. "Hermes <tool_call> block", "special token <|im_end|>"
    text: str
    tool_markup: bool  # tool-call markup (the markup codes) rather than a special token
    structural: bool  # a block that parses as a call: evidence on its own
    exact: bool = True  # spelled as the family spells it (not a variant another family's token may share)


Structural = Callable[[re.Match[str], str, frozenset[str]], bool]


@dataclass(frozen=True)
class Marker:
    """One pattern of a family. `structural`, given the match, the whole text and the offered tool
    names, says whether this match is a block that parses as a call."""

    kind: str
    pattern: re.Pattern[str]
    tool_markup: bool = True
    structural: Structural | None = None
    spellings: frozenset[str] | None = None  # the family's own spellings; None: every match is one


def bar_token(spelling: str) -> str:
    """A regex for a bar-delimited token (`<｜end▁of▁sentence｜>`, `<|im_end|>`) in every spelling:
    any bar, one or two of them, spaces inside the angle brackets, `▁`, `_`, a space or nothing
    between its words, any letter case."""
    m = re.fullmatch(rf"<\s*/?{_BAR}+\s*(.+?)\s*{_BAR}+\s*>", spelling)
    if not m:
        return re.escape(spelling)
    closing = "/" if spelling.lstrip("<").lstrip().startswith("/") else ""
    words = [re.escape(w) for w in re.split(r"[\u2581_ ]", m.group(1)) if w]
    return rf"<\s*{re.escape(closing)}{_BAR}{{1,2}}\s*{_SEP.join(words)}\s*{_BAR}{{1,2}}\s*>"


def tokens_marker(kind: str, spellings: Iterable[str], *, tool_markup: bool = False, flags: int = 0) -> Marker:
    """One marker matching any of `spellings`, bar-delimited ones in every spelling (`bar_token`,
    any case), others literally (`Vec<Think>` is Rust, not `<think>`); longest first, so no token
    is matched by a shorter one's prefix."""
    spellings = frozenset(spellings)
    parts = sorted(
        {f"(?i:{bar_token(s)})" if _BAR_TOKEN.fullmatch(s) else re.escape(s) for s in spellings}, key=len, reverse=True
    )
    return Marker(kind, re.compile("|".join(parts), flags), tool_markup, spellings=spellings)


_BAR_TOKEN = re.compile(rf"<\s*/?{_BAR}.+{_BAR}\s*>")


def decodes_as_object(text: str) -> dict[str, Any] | None:
    """`text` (stripped) as a JSON object, else None."""
    try:
        value = json.loads(text.strip())
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def json_call_at(text: str, start: int) -> dict[str, Any] | None:
    """The JSON object that begins at the first `{` from `start`, if one does (raw_decode)."""
    at = text.find("{", start)
    if at < 0 or text[start:at].strip():
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text, at)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def named_call(value: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    """A decoded `{"name": ..., "arguments" | "parameters": {...}}`: the JSON shape of a call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return False
    args = value.get("arguments", value.get("parameters"))
    return isinstance(args, (dict, str))


@dataclass(frozen=True)
class Family:
    """One model family's output format.

    `models`: a regex over served model names (`/v1/models`, a response's `model`);
    `parsers`: the tool-call parser names SGLang and vLLM give the family (`--tool-call-parser`),
    so a server's own setting names its family; `sglang_parsers`: SGLang's detectors that read it,
    the first the reference; `reasoning_parser`: SGLang's reasoning parser for it, if it thinks;
    `raw_signature`: a regex whose match in a raw completion says it is in this format.
    """

    name: str
    group: str  # the family these formats belong to (one module each): "deepseek", "qwen", ...
    title: str
    models: re.Pattern[str]
    parsers: tuple[str, ...]
    markers: tuple[Marker, ...]
    sglang_parsers: tuple[str, ...] = ()
    reasoning_parser: str | None = None
    raw_signature: re.Pattern[str] | None = None
    renderer: str | None = None  # the vendor package that renders its prompts, where one does
    extra_finders: tuple[Callable[[str, frozenset[str]], list[Markup]], ...] = field(default=())

    def find(self, text: str, offered: frozenset[str] = frozenset(), seen: set[int] | None = None) -> list[Markup]:
        """Every match of this family's markers in `text`, in order (overlaps not yet resolved).
        `seen`: ids of markers and finders already run over this text (formats of one family
        share them), skipped and added to."""
        seen = set() if seen is None else seen
        found: list[Markup] = []
        for marker in self.markers:
            if id(marker) in seen:
                continue
            seen.add(id(marker))
            for m in marker.pattern.finditer(text):
                structural = bool(marker.structural and marker.structural(m, text, offered))
                exact = marker.spellings is None or m.group() in marker.spellings
                found.append(
                    Markup(
                        m.start(), m.end(), self.group, marker.kind, m.group(), marker.tool_markup, structural, exact
                    )
                )
        for finder in self.extra_finders:
            if id(finder) not in seen:
                seen.add(id(finder))
                found.extend(finder(text, offered))
        return found


def _rank(d: Markup) -> tuple[bool, bool]:
    return d.structural, d.exact


def resolve_overlaps(found: Iterable[Markup]) -> list[Markup]:
    """Matches in order; where two overlap, a structural one wins, then one spelled as its family
    spells it (Kimi's `<|tool_call_begin|>` is Kimi's, `<｜tool▁call▁begin｜>` DeepSeek's V3
    token), then the earliest and longest."""
    ordered = sorted(found, key=lambda d: (d.start, -(d.end - d.start)))
    kept: list[Markup] = []
    for d in ordered:
        if kept and d.start < kept[-1].end:
            if _rank(d) > _rank(kept[-1]):
                kept[-1] = d
            continue
        kept.append(d)
    return kept
