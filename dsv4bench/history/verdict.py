"""The run's verdict, and the process exit code that follows from it and `--fail-on`, one rule for
`agents`, `proxy`, `sweep` and `locust`: 1 when a condition asked for holds (or the history lost
records, so none can be ruled out), else 0."""

from __future__ import annotations

import enum
from typing import Any


class RunVerdict(str, enum.Enum):
    """The run's verdict (`verdict` in summary.json), worst first: the first whose condition holds
    wins (report/summary.py's docstring gives each condition). Named apart from
    records.Verdict, which is one finding on one turn."""

    WEDGE = "WEDGE"
    POISONED = "POISONED"  # fresh sessions after the load still corrupted (run.json's `persistence`)
    CORRUPTION = "CORRUPTION"
    INCOMPLETE = "INCOMPLETE"  # our own failure: the history lost records or a checker raised
    ERRORS = "ERRORS"
    CLEAN = "CLEAN"

    def __str__(self) -> str:
        return self.value  # so an f-string says CLEAN, not RunVerdict.CLEAN


def exit_code(summary: dict[str, Any], fail_on: tuple[str, ...]) -> int:
    v = summary.get("verdict")
    t = summary.get("turns", {})
    if fail_on and v == RunVerdict.INCOMPLETE:  # lost records: no --fail-on condition can be ruled out
        return 1
    if "corruption" in fail_on and (v in (RunVerdict.CORRUPTION, RunVerdict.POISONED) or t.get("corrupt", 0) > 0):
        return 1
    if "errors" in fail_on and (v == RunVerdict.ERRORS or t.get("error", 0) > 0):
        return 1
    if "wedge" in fail_on and v == RunVerdict.WEDGE:
        return 1
    return 0
