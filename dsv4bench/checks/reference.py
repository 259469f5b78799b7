"""reference_mismatch: the reference run answered this same greedy request differently
(dsv4bench/harness/reference_run.py says when a turn has a reference answer and why the two must agree)."""

from __future__ import annotations

from dsv4bench.checks.common import first_difference
from dsv4bench.history.codes import REFERENCE_CODE
from dsv4bench.history.records import ReferenceAnswer, TurnContext, Verdict

_AROUND = 40  # characters of each side shown around the first difference


def _difference_detail(ours: str, theirs: str) -> str:
    i = first_difference(ours, theirs)
    lo = max(0, i - _AROUND // 2)
    return f"at character {i}: {ours[lo : i + _AROUND]!r} here, {theirs[lo : i + _AROUND]!r} in the reference"


def _where(ref: ReferenceAnswer) -> str:
    return f" (reference {ref.session} turn {ref.turn})" if ref.session else ""


def check_reference_mismatch(ctx: TurnContext) -> list[Verdict]:
    ref, resp = ctx.reference, ctx.response
    if ref is None or resp is None:
        return []
    ours = ReferenceAnswer.of(resp)
    if ours.output == ref.output:
        return []
    ours_calls, ref_calls = ours.tool_calls, ref.tool_calls
    if len(ours_calls) != len(ref_calls):
        return [
            Verdict(
                REFERENCE_CODE,
                f"{len(ours_calls)} tool call(s) here, {len(ref_calls)} in the reference{_where(ref)}",
                "tool_calls",
            )
        ]
    for i, ((name, args), (ref_name, ref_args)) in enumerate(zip(ours_calls, ref_calls)):
        if name != ref_name:
            return [
                Verdict(
                    REFERENCE_CODE, f"calls {name!r}, the reference {ref_name!r}{_where(ref)}", f"tool_calls[{i}].name"
                )
            ]
        if args != ref_args:
            return [
                Verdict(
                    REFERENCE_CODE, f"{_difference_detail(args, ref_args)}{_where(ref)}", f"tool_calls[{i}].arguments"
                )
            ]
    for field in ("content", "reasoning"):
        a, b = getattr(ours, field), getattr(ref, field)
        if a != b:
            return [Verdict(REFERENCE_CODE, f"{_difference_detail(a, b)}{_where(ref)}", field)]
    return [
        Verdict(
            REFERENCE_CODE,
            f"finish_reason {ours.finish_reason!r}, the reference {ref.finish_reason!r}{_where(ref)}",
            "finish_reason",
        )
    ]
