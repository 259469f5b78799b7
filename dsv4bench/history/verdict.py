"""The process exit code of a run from its summary and `--fail-on`, one rule for `agents` and
`locust`: 1 when a condition asked for holds (or the history lost records, so none can be
ruled out), else 0."""

from __future__ import annotations

from typing import Any


def exit_code(summary: dict[str, Any], fail_on: tuple[str, ...]) -> int:
    v = summary.get("verdict")
    t = summary.get("turns", {})
    if fail_on and v == "INCOMPLETE":  # lost records: no --fail-on condition can be ruled out
        return 1
    if "corruption" in fail_on and (v in ("CORRUPTION", "POISONED") or t.get("corrupt", 0) > 0):
        return 1
    if "errors" in fail_on and (v == "ERRORS" or t.get("error", 0) > 0):
        return 1
    if "wedge" in fail_on and v == "WEDGE":
        return 1
    return 0
