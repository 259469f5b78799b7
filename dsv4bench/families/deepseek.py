"""DeepSeek: V3 / R1, V3.1, V3.2 and V4 / V4.1, one family of formats.

Tool calls:
- V4 and V3.2 write DSML (V3.2's block is `function_calls`, V4's `tool_calls`)::

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="read_file">
    <｜DSML｜parameter name="path" string="true">main.py</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

  where `｜` is U+FF5C FULLWIDTH VERTICAL LINE;
- V3 / R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
  <｜tool▁call▁end｜><｜tool▁calls▁end｜>`;
- V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
  <｜tool▁calls▁end｜>`.

`find_dsml` knows these variants of the markup (case-insensitive):

- `DSML tag`: any tag carrying the DSML marker, opening or closing, with any bar character
  (base.BARS: ASCII `|`, U+FF5C, U+2223, U+01C0, U+2758, U+FFE8, U+2502, ...), single or
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
- `V3 tool token`: V3 / V3.1's tool tokens `<｜tool▁calls▁begin｜>`, `<｜tool▁call▁begin｜>`,
  `<｜tool▁sep｜>`, ... (`▁` or `_` between words, any bar).

A match is structural (a call on its own evidence) where a block or invoke tag is followed by
an invoke with a name, or a V3 call token by `<｜tool▁sep｜>` and a name.

Clean text stays clean: a full-width bar in Chinese prose or tables (`选项A｜选项B`), markdown
tables and shell pipelines (`|`), and prose that mentions "invoke" or "function calls" match
none of these patterns, because every pattern needs the DSML marker, a tag opener `<` directly
before a DSML tag name, or a DeepSeek-only token.

The regexes are the detector. deepseek-recipe's parser is not consulted as a second opinion
here: it recognises only the canonical bar and silently swallows every `<｜DSML｜` prefix it
meets (see checks/oracle.py), so it would miss every variant this module exists for.

Special tokens: the union of deepseek-recipe's `SpecialToken` kinds (as its default
`SpecialTokens` spells them) and the bundled engine's tokenizer's special added tokens, each
matched in every spelling (base.bar_token): `<|end_of_sentence|>` is `<｜end▁of▁sentence｜>`.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import NamedTuple

from dsv4bench.families.base import BARS, Family, Markup, tokens_marker

_B = f"[{re.escape(BARS)}]"
_WIDE_B = f"[{re.escape(BARS[1:])}]"  # the non-ASCII bars: one is enough to mark a fragment
_BLOCK = r"(?:tool|function)\s*_\s*calls"
_NAME = rf"(?P<name>{_BLOCK}|invoke|parameter)"
_FLAGS = re.IGNORECASE

_DSML_TAG = re.compile(rf"<\s*(?P<close>/)?\s*(?:{_B}{{1,2}}\s*dsml\s*{_B}{{1,2}}|dsml\b)\s*{_NAME}?", _FLAGS)
_MARKER = re.compile(rf"{_B}{{1,2}}dsml{_B}{{1,2}}|{_WIDE_B}{{1,2}}dsml\b|\bdsml{_WIDE_B}{{1,2}}", _FLAGS)
_TAIL_FRAGMENT = re.compile(rf"<\s*/?\s*(?:{_WIDE_B}{{1,2}}(?:d(?:s(?:ml?)?)?)?|\|{{1,2}}ds(?:ml?)?)\s*$", _FLAGS)
_BARE_TAG = re.compile(
    rf"(?:(?<!\w)<|<(?=\s*/))\s*(?P<close>/)?\s*"  # `Vec<tool_calls>` is code, `x</invoke>` is not
    rf"(?:(?P<tag>invoke|parameter)(?:\s+name\s*=|\s*>)|(?P<block>{_BLOCK})\s*>)",
    _FLAGS,
)
_STRING_ATTR = re.compile(r"\bstring\s*=\s*\\?[\"'](?:true|false)\\?[\"']\s*>", _FLAGS)
_V3_TOKEN = re.compile(rf"{_B}\s*tool(?:[\u2581_ ](?:calls?|outputs?))?[\u2581_ ](?:begin|end|sep){_B}", _FLAGS)
_BLOCK_OPEN = re.compile(rf"<\s*(?:{_B}{{0,2}}\s*dsml\s*{_B}{{0,2}}\s*)?{_BLOCK}\s*>", _FLAGS)
_BLOCK_CLOSE = re.compile(rf"<\s*/\s*(?:{_B}{{0,2}}\s*dsml\s*{_B}{{0,2}}\s*)?{_BLOCK}\s*>", _FLAGS)


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


_NAMED_INVOKE = re.compile(
    rf"<\s*(?:{_B}{{1,2}}\s*dsml\s*{_B}{{1,2}}\s*)?invoke\s+name\s*=\s*\\?[\"'][^\"'<>]+", _FLAGS
)
_V3_CALL = re.compile(
    rf"{_B}\s*tool[\u2581_ ]call[\u2581_ ]begin{_B}\s*(?:function\s*)?"
    rf"(?:<\s*{_B}\s*tool[\u2581_ ]sep{_B}\s*>)\s*[\w.-]+|"
    rf"{_B}\s*tool[\u2581_ ]call[\u2581_ ]begin{_B}\s*>\s*[\w.-]+\s*<\s*{_B}\s*tool[\u2581_ ]sep{_B}",
    _FLAGS,
)
_STRUCTURE_REACH = 400  # characters after a block or call tag within which its named invoke must follow


def _structural(d: DsmlMatch, text: str) -> bool:
    """A block / invoke tag followed by a named invoke, or a V3 call token with its name."""
    window = text[d.start : d.end + _STRUCTURE_REACH]
    if d.kind.startswith(
        ("DSML tag <tool", "DSML tag <function", "DSML tag <invoke", "unterminated block", "bare block", "bare invoke")
    ):
        return _NAMED_INVOKE.search(window) is not None
    if d.kind == "V3 tool token":
        return _V3_CALL.search(text, max(0, d.start - 2), d.end + _STRUCTURE_REACH) is not None
    return False


def find_markup(text: str, offered: frozenset[str] = frozenset()) -> list[Markup]:
    """find_dsml's matches as the registry's Markup (tool-call markup, structural where a call)."""
    return [
        Markup(
            d.start,
            d.end,
            "deepseek",
            d.kind,
            d.text,
            True,
            _structural(d, text),
            exact="\uff5c" in d.text or "\u2581" in d.text or "dsml" in d.text.lower(),
        )
        for d in find_dsml(text)
    ]


def recipe_tokens() -> dict[str, str]:
    """deepseek-recipe's special tokens, spelling -> kind name (`Eos`); {} when it is not installed."""
    try:
        import deepseek_recipe as dr
    except ImportError:
        return {}
    spelling = dr.SpecialTokens()
    kinds = {
        name: kind
        for name in dir(dr.SpecialToken)
        if isinstance(kind := getattr(dr.SpecialToken, name), dr.SpecialToken)
    }
    return {spelling.token(kind): name for name, kind in sorted(kinds.items())}


def _bundled_tokenizer_path() -> Path | None:
    """Where the bundled engine's tokenizer.json lies, found without importing the engine."""
    spec = importlib.util.find_spec("dsv4bench.engine")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "assets" / "tokenizer.json"
        if path.is_file():
            return path
    return None


def bundled_tokens(path: Path | None = None) -> dict[str, str]:
    """The bundled tokenizer's special added tokens, spelling -> `added token <id>`; {} when absent."""
    path = path or _bundled_tokenizer_path()
    if path is None:
        return {}
    added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens") or []
    return {t["content"]: f"added token {t['id']}" for t in added if t.get("special") and t.get("content")}


def special_tokens() -> dict[str, str]:
    """Every DSV4 special token, spelling -> name: the union of both sources, deepseek-recipe's
    kind names winning where both name a token."""
    tokens = {**bundled_tokens(), **recipe_tokens()}
    if not tokens:
        raise RuntimeError("no DSV4 special-token definition found (deepseek-recipe or the bundled tokenizer)")
    return tokens


# The tokens the special-token code judges: all but the DSML marker and V3's tool tokens, which
# are tool-call markup (find_dsml's).
TOKENS: dict[str, str] = {
    s: name for s, name in special_tokens().items() if name != "Dsml" and "DSML" not in s and not _V3_TOKEN.search(s)
}
# V3 and R1's own sentence tokens (V4 shares them) and the thinking markers every version uses.
_V3_SPECIALS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜end▁of▁toolresults｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
_SPECIALS = tokens_marker("DeepSeek special token", {*TOKENS, *_V3_SPECIALS})
# A fullwidth-bar token cut at the end of the text (`<｜end▁of`, `<｜tool▁calls`): a token split
# across chunks that never got its second half. The fullwidth bar after `<` is DeepSeek's alone.
_CUT_TOKEN = re.compile(r"<\s*[\uff5c\u2223\u2758\uffe8]{1,2}\s*[\w\u2581]+\s*$")


def cut_token(text: str, offered: frozenset[str] = frozenset()) -> list[Markup]:
    """A DeepSeek token cut off at the end of `text` (tool tokens are markup, others special)."""
    m = _CUT_TOKEN.search(text.rstrip())
    if m is None or "dsml" in m.group().lower():  # a cut DSML tag is find_dsml's
        return []
    tool = "tool" in m.group().lower()
    return [Markup(m.start(), m.end(), "deepseek", "token cut at the end", m.group(), tool, False)]


_DSML_SIGNATURE = re.compile(rf"{_B}{{1,2}}\s*dsml\s*{_B}{{1,2}}", _FLAGS)
_V3_SIGNATURE = re.compile(rf"{_B}\s*tool[\u2581_ ]call[\u2581_ ]begin{_B}\s*>\s*function\s*<", _FLAGS)
_V31_SIGNATURE = re.compile(
    rf"{_B}\s*tool[\u2581_ ]call[\u2581_ ]begin{_B}\s*>\s*(?!function\s*<)[\w.-]+\s*<\s*{_B}\s*tool[\u2581_ ]sep",
    _FLAGS,
)


# SGLang's reasoning parser for each version (sglang.srt.parser.reasoning_parser).
_REASONING = {
    "deepseek-v4": "deepseek-v4",
    "deepseek-v3.2": "deepseek-v3",
    "deepseek-v3.1": "deepseek-v3",
    "deepseek-v3": "deepseek-r1",
}


def _family(
    name: str,
    title: str,
    models: str,
    parsers: tuple[str, ...],
    signature: re.Pattern[str],
    renderer: str | None = None,
) -> Family:
    return Family(
        name=name,
        group="deepseek",
        title=title,
        models=re.compile(models, re.IGNORECASE),
        parsers=parsers,
        markers=(_SPECIALS,),
        sglang_parsers=parsers[:1],
        reasoning_parser=_REASONING[name],
        raw_signature=signature,
        renderer=renderer,
        extra_finders=(find_markup, cut_token),
    )


# Most specific first: the registry takes the first whose model pattern matches.
FAMILIES: tuple[Family, ...] = (
    _family(
        "deepseek-v4",
        "DeepSeek V4 / V4.1 (DSML)",
        r"deepseek[-_ ]?v4|\bdsv4",
        ("deepseekv4", "deepseekv41"),
        _DSML_SIGNATURE,
        renderer="deepseek-recipe",
    ),
    _family(
        "deepseek-v3.2",
        "DeepSeek V3.2 (DSML function_calls)",
        r"deepseek[-_ ]?v3[._-]?2",
        ("deepseekv32",),
        _DSML_SIGNATURE,
    ),
    _family(
        "deepseek-v3.1",
        "DeepSeek V3.1 (tool tokens, bare name)",
        r"deepseek[-_ ]?v3[._-]?1",
        ("deepseekv31",),
        _V31_SIGNATURE,
    ),
    _family(
        "deepseek-v3",
        "DeepSeek V3 / R1 (tool tokens, ```json)",
        r"deepseek[-_ ]?(?:v3|r1)",
        ("deepseekv3",),
        _V3_SIGNATURE,
    ),
)
