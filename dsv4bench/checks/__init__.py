"""Checkers: one pure function per verdict code, composed by `run_checks`.

Each checker is `check_<code>(ctx: TurnContext) -> list[Verdict]`: pure, no I/O, [] when
the turn is clean. The table of codes (dsv4bench/history/codes.py) names each code's checker;
`CHECKERS` maps every corruption and availability code to it. `run_checks` applies them by
turn status, Jepsen-style:

- KILLED: nothing (our own nemesis cancelled it: indeterminate, never a verdict);
- ERROR / TIMEOUT: the availability checkers only;
- OK: the corruption checkers and `markup_unproven` (evidence), plus the --raw oracle when
  `ctx.raw_completion` is set.

A checker that raises does not crash the run: its failure becomes a string in
`check_errors` and the turn's outcome for that code is unknown.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from dsv4bench.history.codes import AVAILABILITY_CODES, BY_CODE, CORRUPTION_CODES, EVIDENCE_CODES, ORACLE_CODE
from dsv4bench.history.records import TurnContext, TurnStatus, Verdict

Checker = Callable[[TurnContext], list[Verdict]]


def _checker(code: str) -> Checker:
    """The function the table names for `code` (`module.function` under dsv4bench.checks)."""
    module, _, name = (BY_CODE[code].checker or "").rpartition(".")
    fn: Checker = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return fn


# Evidence judged on every ok turn (markup the answer alone cannot judge); the oracle's own
# code only where a raw completion was fetched.
ALWAYS_EVIDENCE = tuple(c for c in EVIDENCE_CODES if c != ORACLE_CODE)
CHECKERS: dict[str, Checker] = {
    code: _checker(code) for code in (*CORRUPTION_CODES, *ALWAYS_EVIDENCE, *AVAILABILITY_CODES)
}
ORACLE_CHECKER: Checker = _checker(ORACLE_CODE)


def checkers_for(ctx: TurnContext) -> dict[str, Checker]:
    """The checkers that apply to this turn, by its status (see the module docstring)."""
    if ctx.status is TurnStatus.KILLED:
        return {}
    if ctx.status is not TurnStatus.OK:
        return {code: CHECKERS[code] for code in AVAILABILITY_CODES}
    chosen = {code: CHECKERS[code] for code in (*CORRUPTION_CODES, *ALWAYS_EVIDENCE)}
    if ctx.raw_completion is not None:
        chosen[ORACLE_CODE] = ORACLE_CHECKER
    return chosen


def run_checks(ctx: TurnContext, checkers: dict[str, Checker] | None = None) -> tuple[list[Verdict], list[str]]:
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
