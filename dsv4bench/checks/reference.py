"""reference_mismatch and answer_changed_under_load: the same greedy request answered two ways.

reference_mismatch: the reference run answered it differently (dsv4bench/harness/reference_run.py
says when a turn has a reference answer and why the two must agree). answer_changed_under_load:
sent again alone after the load (--recheck, dsv4bench/harness/recheck.py), it got another answer
than under the load. One comparison serves both; which answer the turn is set beside
(`ctx.reference` a ReferenceAnswer or an AloneAnswer) says which code it can give."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4bench.checks.common import first_difference
from dsv4bench.history.codes import ANSWER_CHANGED_CODE, REFERENCE_CODE
from dsv4bench.history.records import ReferenceAnswer, TurnContext, Verdict

ALONE = "alone after the load"  # where an AloneAnswer came from, as a verdict's detail says it
_AROUND = 40  # characters of each side shown around the first difference


@dataclass(frozen=True)
class AloneAnswer(ReferenceAnswer):
    """The answer to a run's request sent again alone, after the load (--recheck)."""


def _difference_detail(ours: str, theirs: str, other: str) -> str:
    i = first_difference(ours, theirs)
    lo = max(0, i - _AROUND // 2)
    return f"at character {i}: {ours[lo : i + _AROUND]!r} here, {theirs[lo : i + _AROUND]!r} {other}"


def answer_difference(code: str, ours: ReferenceAnswer, ref: ReferenceAnswer, other: str) -> list[Verdict]:
    """One verdict `code` at the first place `ours` differs from `ref` ([] when they agree);
    `other` names where `ref` came from ("in the reference", "alone after the load")."""
    if ours.output == ref.output:
        return []
    where = f" ({other.removeprefix('in the ')} {ref.session} turn {ref.turn})" if ref.session else ""
    ours_calls, ref_calls = ours.tool_calls, ref.tool_calls
    if len(ours_calls) != len(ref_calls):
        return [Verdict(code, f"{len(ours_calls)} tool call(s) here, {len(ref_calls)} {other}{where}", "tool_calls")]
    for i, ((name, args), (ref_name, ref_args)) in enumerate(zip(ours_calls, ref_calls)):
        if name != ref_name:
            return [Verdict(code, f"calls {name!r}, {ref_name!r} {other}{where}", f"tool_calls[{i}].name")]
        if args != ref_args:
            detail = _difference_detail(args, ref_args, other)
            return [Verdict(code, f"{detail}{where}", f"tool_calls[{i}].arguments")]
    for field in ("content", "reasoning"):
        a, b = getattr(ours, field), getattr(ref, field)
        if a != b:
            return [Verdict(code, f"{_difference_detail(a, b, other)}{where}", field)]
    return [
        Verdict(code, f"finish_reason {ours.finish_reason!r}, {ref.finish_reason!r} {other}{where}", "finish_reason")
    ]


def check_reference_mismatch(ctx: TurnContext) -> list[Verdict]:
    ref, resp = ctx.reference, ctx.response
    if ref is None or resp is None or isinstance(ref, AloneAnswer):
        return []
    return answer_difference(REFERENCE_CODE, ReferenceAnswer.of(resp), ref, "in the reference")


def check_answer_changed_under_load(ctx: TurnContext) -> list[Verdict]:
    ref, resp = ctx.reference, ctx.response
    if not isinstance(ref, AloneAnswer) or resp is None:
        return []
    return answer_difference(ANSWER_CHANGED_CODE, ReferenceAnswer.of(resp), ref, ALONE)
