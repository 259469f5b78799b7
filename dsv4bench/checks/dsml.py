"""DSML leak detection: tool-call markup that reached the client as text.

DeepSeek-V4 writes tool calls as DSML; a server's tool parser turns that markup into
`tool_calls`. When the parser fails (a tag split across stream chunks, a corrupted token, a
variant spelling the parser does not know), the markup leaks into `content`, `reasoning`
or into another call's arguments. The canonical block is::

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="read_file">
    <｜DSML｜parameter name="path" string="true">main.py</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

where `｜` is U+FF5C FULLWIDTH VERTICAL LINE. `find_dsml` knows these variants (case-insensitive):

- `DSML tag`: any tag carrying the DSML marker, opening or closing, with any bar character
  (`BARS` below: ASCII `|`, U+FF5C, U+2223, U+01C0, U+2758, U+FFE8, U+2502, ...), single or
  doubled bars (`<｜｜DSML｜｜tool_calls>`), spaces inside the tag (`< ｜DSML｜invoke`,
  `<｜DSML｜ tool_calls>`, `tool _calls`), or no bars at all (`<DSML tool_calls>`);
  the block name `tool_calls` or V3.2's `function_calls`.
- `unterminated block`: an opening block tag with no closing block tag after it.
- `DSML marker`: a stray `｜DSML｜` / `DSML｜` / `｜DSML` fragment outside a tag, e.g. the
  prefix a streaming parser left behind beside a correctly parsed call (with ASCII bars
  only the two-sided `|DSML|`, so `grep dsml|wc` stays clean).
- `DSML fragment at end`: text ending in a cut tag (`<｜DS`, `</｜DSML`, `<｜`), the shape
  of a tag split across chunks; with an ASCII bar at least `<|DS` is needed.
- `bare invoke` / `bare parameter` / `bare block`: markup without the marker:
  `<invoke name=`, `<parameter name=`, `</invoke>`, `<tool_calls>`, `<function_calls>`, and
  the attribute `string="true|false">` that only DSML parameters carry.
- `V3 tool token`: DeepSeek V3's tool tokens `<｜tool▁calls▁begin｜>`,
  `<｜tool▁call▁begin｜>`, `<｜tool▁sep｜>`, ... (`▁` or `_` between words).

Clean text stays clean: a full-width bar in Chinese prose or tables (`选项A｜选项B`), markdown
tables and shell pipelines (`|`), `<|endoftext|>`-style tokens of other models, and prose
that mentions "invoke" or "function calls" match none of these patterns, because every
pattern needs the DSML marker, a tag opener `<` directly before a DSML tag name, or a
DSV4-only token.

The regexes are the detector. deepseek-recipe's parser is not consulted as a second
opinion: it recognises only the canonical bar and silently swallows every `<｜DSML｜`
prefix it meets (see oracle.py), so it would miss every variant this module exists for.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from dsv4bench.checks.common import argument_texts, excerpt, response_of
from dsv4bench.records import TurnContext, Verdict

# Vertical bars seen in place of U+FF5C: ASCII, fullwidth, divides, Latin dental click,
# ornament bar, halfwidth forms light vertical, box drawings light/heavy vertical, Hebrew
# paseq, double vertical line, parallel-to, vertical line extension, presentation forms.
BARS = "|\uff5c\u2223\u01c0\u2758\uffe8\u2502\u2503\u05c0\u2016\u2225\u23d0\ufe31\ufe32"
_B = f"[{re.escape(BARS)}]"
_WIDE_B = f"[{re.escape(BARS[1:])}]"  # the non-ASCII bars: one is enough to mark a fragment
_BLOCK = r"(?:tool|function)\s*_\s*calls"
_NAME = rf"(?P<name>{_BLOCK}|invoke|parameter)"
_FLAGS = re.IGNORECASE

_DSML_TAG = re.compile(
    rf"<\s*(?P<close>/)?\s*(?:{_B}{{1,2}}\s*dsml\s*{_B}{{1,2}}|dsml\b)\s*{_NAME}?", _FLAGS
)
_MARKER = re.compile(rf"{_B}{{1,2}}dsml{_B}{{1,2}}|{_WIDE_B}{{1,2}}dsml\b|\bdsml{_WIDE_B}{{1,2}}", _FLAGS)
_TAIL_FRAGMENT = re.compile(
    rf"<\s*/?\s*(?:{_WIDE_B}{{1,2}}(?:d(?:s(?:ml?)?)?)?|\|{{1,2}}ds(?:ml?)?)\s*$", _FLAGS
)
_BARE_TAG = re.compile(
    rf"(?:(?<!\w)<|<(?=\s*/))\s*(?P<close>/)?\s*"  # `Vec<tool_calls>` is code, `x</invoke>` is not
    rf"(?:(?P<tag>invoke|parameter)(?:\s+name\s*=|\s*>)|(?P<block>{_BLOCK})\s*>)",
    _FLAGS,
)
_STRING_ATTR = re.compile(r"\bstring\s*=\s*\\?[\"'](?:true|false)\\?[\"']\s*>", _FLAGS)
_V3_TOKEN = re.compile(
    rf"{_B}\s*tool(?:[\u2581_ ](?:calls?|outputs?))?[\u2581_ ](?:begin|end|sep){_B}", _FLAGS
)
_BLOCK_OPEN = re.compile(
    rf"<\s*(?:{_B}{{0,2}}\s*dsml\s*{_B}{{0,2}}\s*)?{_BLOCK}\s*>", _FLAGS
)
_BLOCK_CLOSE = re.compile(
    rf"<\s*/\s*(?:{_B}{{0,2}}\s*dsml\s*{_B}{{0,2}}\s*)?{_BLOCK}\s*>", _FLAGS
)


class DsmlMatch(NamedTuple):
    """One DSML finding in a text: its span, its variant, the matched text."""

    start: int
    end: int
    kind: str
    text: str


def _kind_of_tag(m: re.Match[str]) -> str:
    name = m.group("name")
    name = re.sub(r"\s+", "", name).lower() if name else "?"
    return f"DSML tag {'</' if m.group('close') else '<'}{name}>"


def _kind_of_bare(m: re.Match[str]) -> str:
    if m.group("block"):
        return "bare block"
    return f"bare {m.group('tag').lower()}"


def _candidates(text: str) -> list[DsmlMatch]:
    found: list[DsmlMatch] = []
    for m in _DSML_TAG.finditer(text):
        kind = _kind_of_tag(m)
        if _BLOCK_OPEN.match(text, m.start()) and not _BLOCK_CLOSE.search(text, m.end()):
            kind = "unterminated block " + kind.removeprefix("DSML tag ")
        found.append(DsmlMatch(m.start(), m.end(), kind, m.group()))
    for m in _BARE_TAG.finditer(text):
        found.append(DsmlMatch(m.start(), m.end(), _kind_of_bare(m), m.group()))
    for kind, rx in (("DSML marker", _MARKER), ("string attribute", _STRING_ATTR), ("V3 tool token", _V3_TOKEN)):
        found.extend(DsmlMatch(m.start(), m.end(), kind, m.group()) for m in rx.finditer(text))
    tail = _TAIL_FRAGMENT.search(text.rstrip())
    if tail:
        found.append(DsmlMatch(tail.start(), tail.end(), "DSML fragment at end", tail.group()))
    return found


def _may_hold_dsml(text: str) -> bool:
    """False only when no pattern can match: every one needs a `<`, `dsml`, `string` or a bar
    next to `tool`. Decided for ASCII text alone, where IGNORECASE folds nothing beyond
    ASCII's own letters (in other text it also folds `ſ` to `s`, the Kelvin sign to `k`)."""
    if not text.isascii():
        return True
    if "<" in text:
        return True
    low = text.lower()
    return "dsml" in low or "string" in low or ("|" in text and "tool" in low)


def find_dsml(text: str) -> list[DsmlMatch]:
    """Every DSML leak in `text`, in order; overlapping findings keep the earliest, longest one."""
    if not text or not _may_hold_dsml(text):
        return []
    found = sorted(_candidates(text), key=lambda d: (d.start, -(d.end - d.start)))
    kept: list[DsmlMatch] = []
    for d in found:
        if kept and d.start < kept[-1].end:
            continue
        kept.append(d)
    return kept


def _describe(text: str, matches: list[DsmlMatch]) -> str:
    first = matches[0]
    kinds = ", ".join(sorted({d.kind for d in matches[1:]}))
    more = f" (+{len(matches) - 1} more: {kinds})" if len(matches) > 1 else ""
    return f"{first.kind} at {first.start}{more}: {excerpt(text, first.start, first.end)}"


def _leak_in(text: str, code: str, field: str) -> list[Verdict]:
    matches = find_dsml(text)
    if not matches:
        return []
    return [Verdict(code, _describe(text, matches), f"{field}@{matches[0].start}")]


def check_dsml_leak_content(ctx: TurnContext) -> list[Verdict]:
    """DSML markup (any variant `find_dsml` knows) in `content`: one verdict at the first match."""
    return _leak_in(response_of(ctx).content, "dsml_leak_content", "content")


def check_dsml_leak_reasoning(ctx: TurnContext) -> list[Verdict]:
    """DSML markup in `reasoning`: the parser let a tool call stay inside the thinking text."""
    return _leak_in(response_of(ctx).reasoning, "dsml_leak_reasoning", "reasoning")


def check_dsml_in_arguments(ctx: TurnContext) -> list[Verdict]:
    """DSML markup in a call's arguments: one verdict per call.

    The raw argument string is scanned first; when it decodes, its string leaves are
    scanned too, so a leak hidden behind JSON escapes (`\\uff5cDSML\\uff5c`) is seen.
    """
    verdicts: list[Verdict] = []
    for i, call in enumerate(response_of(ctx).tool_calls):
        for label, text in argument_texts(call.arguments):
            matches = find_dsml(text)
            if matches:
                detail = ("" if label == "raw" else f"in {label}: ") + _describe(text, matches)
                verdicts.append(Verdict("dsml_in_arguments", detail, f"tool_calls[{i}].arguments"))
                break
    return verdicts
