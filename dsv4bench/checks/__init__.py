"""Checkers: one pure function per verdict code, composed by `run_checks`.

Each checker is `check_<code>(ctx: TurnContext) -> list[Verdict]`: pure, no I/O, [] when
the turn is clean. `CHECKERS` maps every corruption and availability code of DESIGN §3 to
its checker. `run_checks` applies them by turn status, Jepsen-style:

- KILLED: nothing (our own nemesis cancelled it: indeterminate, never a verdict);
- ERROR / TIMEOUT: the availability checkers only;
- OK: the corruption checkers, plus the --raw oracle when `ctx.raw_completion` is set.

A checker that raises does not crash the run: its failure becomes a string in
`check_errors` and the turn's outcome for that code is unknown.
"""

from __future__ import annotations

from collections.abc import Callable

from dsv4bench.checks.arguments import check_args_not_json, check_schema_violation, check_unknown_tool
from dsv4bench.checks.availability import (
    check_connection_error,
    check_http_error,
    check_timeout_total,
    check_timeout_ttft,
)
from dsv4bench.checks.dsml import check_dsml_in_arguments, check_dsml_leak_content, check_dsml_leak_reasoning
from dsv4bench.checks.oracle import check_parser_disagreement
from dsv4bench.checks.protocol import (
    check_empty_turn,
    check_finish_reason_mismatch,
    check_stream_protocol,
    check_truncated,
)
from dsv4bench.checks.reference import check_reference_mismatch
from dsv4bench.checks.text import check_degenerate_repetition, check_garbled_text
from dsv4bench.records import AVAILABILITY_CODES, CORRUPTION_CODES, ORACLE_CODE, TurnContext, TurnStatus, Verdict

Checker = Callable[[TurnContext], list[Verdict]]

CHECKERS: dict[str, Checker] = {
    "dsml_leak_content": check_dsml_leak_content,
    "dsml_leak_reasoning": check_dsml_leak_reasoning,
    "dsml_in_arguments": check_dsml_in_arguments,
    "args_not_json": check_args_not_json,
    "schema_violation": check_schema_violation,
    "unknown_tool": check_unknown_tool,
    "finish_reason_mismatch": check_finish_reason_mismatch,
    "empty_turn": check_empty_turn,
    "stream_protocol": check_stream_protocol,
    "truncated": check_truncated,
    "degenerate_repetition": check_degenerate_repetition,
    "garbled_text": check_garbled_text,
    "reference_mismatch": check_reference_mismatch,
    "http_error": check_http_error,
    "timeout_ttft": check_timeout_ttft,
    "timeout_total": check_timeout_total,
    "connection_error": check_connection_error,
}
ORACLE_CHECKER: Checker = check_parser_disagreement

assert set(CHECKERS) == set(CORRUPTION_CODES) | set(AVAILABILITY_CODES), "one checker per verdict code"


def checkers_for(ctx: TurnContext) -> dict[str, Checker]:
    """The checkers that apply to this turn, by its status (see the module docstring)."""
    if ctx.status is TurnStatus.KILLED:
        return {}
    if ctx.status is not TurnStatus.OK:
        return {code: CHECKERS[code] for code in AVAILABILITY_CODES}
    chosen = {code: CHECKERS[code] for code in CORRUPTION_CODES}
    if ctx.raw_completion is not None:
        chosen[ORACLE_CODE] = ORACLE_CHECKER
    return chosen


def run_checks(
    ctx: TurnContext, checkers: dict[str, Checker] | None = None
) -> tuple[list[Verdict], list[str]]:
    """Run the applicable checkers over one turn: (verdicts, check_errors).

    `checkers` overrides the registry (tests, `audit` with a subset); status rules still
    apply to it. A checker that raises adds `"<code>: <Exception>: <message>"` to
    check_errors and nothing to verdicts.
    """
    applicable = checkers_for(ctx)
    if checkers is not None:
        applicable = {code: fn for code, fn in checkers.items() if code in applicable}
    if applicable and ctx.status is TurnStatus.OK and ctx.response is None:
        return [], ["status ok but the turn has no response: nothing to check"]
    verdicts: list[Verdict] = []
    errors: list[str] = []
    for code, checker in applicable.items():
        try:
            verdicts.extend(checker(ctx))
        except Exception as e:  # noqa: BLE001 - a broken checker makes the outcome unknown, not the run fail
            errors.append(f"{code}: {type(e).__name__}: {e}")
    return verdicts, errors


__all__ = ["CHECKERS", "ORACLE_CHECKER", "Checker", "checkers_for", "run_checks"]
