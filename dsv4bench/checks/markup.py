"""Markup in the text a client received, judged with evidence: tool-call markup and special
tokens of any model family (dsv4bench.families), in content, the reasoning and arguments.

A correct server sends markup too, when the task is about markup: a coding agent editing a
tool-call parser writes `</parameter>` or `<think>` into a file, an answer quotes `<|im_end|>`
from the user's question. So a match is a leak only with evidence (DESIGN.md section 8):

1. the text the request gave the model (its system, user and tool-result messages: GivenText)
   holds it: never a leak; for a structural match, its first `_COPIED_SPAN` characters;
2. it is structural (a block that parses as a call: a name and arguments): a leak;
3. the request's text is not known (an audit of answers recorded without their requests):
   the answer alone cannot decide, so it is `markup_unproven`, evidence in the report, never
   corruption; auditing with the request bodies, or `--raw`, decides;
4. otherwise it appears nowhere in what the model was given: a leak.

Which code a leak is: DeepSeek's tool-call markup (DSML, V3's tool tokens) is `dsml_leak_*` /
`dsml_in_arguments`, any other family's `markup_leak_*` / `markup_in_arguments`, and a special
token of any family `special_token_leak`. At most one verdict per code and owner (content,
reasoning, each call's arguments), at its first match, naming how many more there are.

Arguments are judged per string value (and key) where they decode, so a leak behind a JSON
escape (`\\uff5cDSML\\uff5c`) is seen and each value's evidence is its own; the raw string where
they do not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from dsv4bench.checks.common import decode_json, excerpt, response_of, string_leaves
from dsv4bench.families import Markup, find_markup
from dsv4bench.families.deepseek import TOKENS
from dsv4bench.history.records import TurnContext, Verdict

UNPROVEN = "markup_unproven"
_COPIED_SPAN = 200  # characters of a structural match that must appear in the request to be a copy


class Finding(NamedTuple):
    """One match that is a leak (`code`) or evidence (`UNPROVEN`), where it was found."""

    code: str
    where: str  # the owner: content, reasoning, tool_calls[i].arguments
    label: str  # the text within the owner: the owner itself, raw, or a JSON path
    text: str
    markup: Markup
    why: str


def _code(m: Markup, where: str) -> str:
    if not m.tool_markup:
        return "special_token_leak"
    base = "dsml" if m.family == "deepseek" else "markup"
    if where.startswith("tool_calls"):  # its arguments or its name
        return f"{base}_in_arguments"
    return f"{base}_leak_{where}"


def _texts(ctx: TurnContext) -> Iterator[tuple[str, str, str]]:
    """(owner, label, text) of every text the turn produced."""
    resp = response_of(ctx)
    yield "content", "content", resp.content
    yield "reasoning", "reasoning", resp.reasoning
    for i, call in enumerate(resp.tool_calls):
        if call.name:  # a name with markup in it (`read_file<|channel|>commentary`) is the call's own leak
            yield f"tool_calls[{i}].name", "name", call.name
        where = f"tool_calls[{i}].arguments"
        try:
            value = decode_json(call.arguments)
        except (ValueError, TypeError):
            yield where, "raw", call.arguments
            continue
        yield from ((where, path, text) for path, text in string_leaves(value, keys=True))


def _judge(ctx: TurnContext, where: str, text: str, m: Markup) -> tuple[str, str] | None:
    """(code, why) of one match, or None where it is text the task is about (see the docstring)."""
    given = ctx.given
    if given is not None:
        copied = text[m.start : m.start + _COPIED_SPAN] if m.structural else m.text
        if given.holds(copied) or given.holds(m.text.strip()) and not m.structural:
            return None
    code = _code(m, where)
    if m.structural:
        return code, "structural: it parses as a call"
    if given is None:
        return UNPROVEN, (
            f"the request's text is not known, so the answer alone cannot decide whether it is "
            f"quoted from the task ({code} if not); audit the exchange with its request body, or "
            "run with --raw"
        )
    return code, "it appears nowhere in the text the request gave the model"


def findings(ctx: TurnContext) -> list[Finding]:
    """Every leak and every unproven match in the turn, in owner order (cached for the turn:
    the markup checkers all read it)."""
    global _cache
    resp = response_of(ctx)
    if _cache is not None and _cache[0] is ctx and _cache[1] is resp and _cache[2] is ctx.given:
        return _cache[3]
    offered = frozenset(ctx.tools)
    found: list[Finding] = []
    for where, label, text in _texts(ctx):
        for m in find_markup(text, ctx.family, offered):
            judged = _judge(ctx, where, text, m)
            if judged is not None:
                found.append(Finding(judged[0], where, label, text, m, judged[1]))
    _cache = (ctx, resp, ctx.given, found)
    return found


# The last turn judged: run_checks calls each markup checker on one turn in a row.
_cache: tuple[TurnContext, object, object, list[Finding]] | None = None


def verdicts_of(ctx: TurnContext, code: str) -> list[Verdict]:
    """The verdicts of `code`: one per owner, at its first finding, counting the rest."""
    by_owner: dict[str, list[Finding]] = {}
    for f in findings(ctx):
        if f.code == code:
            by_owner.setdefault(f.where, []).append(f)
    verdicts = []
    for where, owned in by_owner.items():
        first = owned[0]
        m = first.markup
        kinds = ", ".join(sorted({f.markup.kind for f in owned[1:]}))
        more = (
            ""
            if len(owned) < 2
            else f" (+{len(owned) - 1} more: {kinds})"
            if m.tool_markup
            else f" (+{len(owned) - 1} more)"
        )
        inside = "" if first.label in (where, "raw", "name") else f"in {first.label}: "
        named = f" {TOKENS[m.text]}" if m.family == "deepseek" and m.text in TOKENS else ""
        detail = (
            f"{inside}{m.family} {m.kind}{named} {m.text!r}{_thinking_note(ctx, where, m)} at {m.start}{more}: "
            f"{excerpt(first.text, m.start, m.end)}; {first.why}"
        )
        at = f"{where}@{m.start}" if first.label == where else where
        verdicts.append(Verdict(code, detail, at))
    return verdicts


_THINKING = frozenset({"<think>", "</think>"})


def _thinking_note(ctx: TurnContext, where: str, m: Markup) -> str:
    """Why a thinking marker in content is wrong, where the request's thinking flag is known."""
    if where != "content" or m.text.strip().lower() not in _THINKING or ctx.thinking is None:
        return ""
    if ctx.thinking:
        return " (thinking on: the reasoning parser missed it)"
    return " (thinking off: the prompt had already closed the thinking)"


def check_markup_leak_content(ctx: TurnContext) -> list[Verdict]:
    """Another family's tool-call markup (not DeepSeek's) leaked into `content`."""
    return verdicts_of(ctx, "markup_leak_content")


def check_markup_leak_reasoning(ctx: TurnContext) -> list[Verdict]:
    """Another family's tool-call markup (not DeepSeek's) leaked into the reasoning."""
    return verdicts_of(ctx, "markup_leak_reasoning")


def check_markup_in_arguments(ctx: TurnContext) -> list[Verdict]:
    """Another family's tool-call markup (not DeepSeek's) inside a call's arguments."""
    return verdicts_of(ctx, "markup_in_arguments")


def check_markup_unproven(ctx: TurnContext) -> list[Verdict]:
    """Markup the answer alone cannot judge (the request's text is not known): evidence."""
    return verdicts_of(ctx, UNPROVEN)
