"""How turns are counted: the conventions chosen once, so the summary, the report, the plots and
the Locust tab agree.

- Killed turns are indeterminate (Jepsen's `:info`): nothing found on them is counted.
- Corruption codes count only on `ok` turns (as `TurnRecord.corrupt` does); availability
  codes count on any turn that was not killed.
- Percentiles use linear interpolation between closest ranks (numpy's default, Hyndman-Fan
  type 7); `percentile_method` in the summary says so.
- Times on the run's axis are wall-clock: turn end = start_wall_ns + (end_ns - start_ns), so
  histories written by several processes (distributed Locust) still share one axis.
"""

from __future__ import annotations

import math
import re
from typing import Any

from dsv4bench.history.codes import CORRUPTION_CODES, EVIDENCE_CODES
from dsv4bench.history.records import INT64, TurnRecord, TurnStatus
from dsv4bench.history.run_folder import History

PERCENTILE_METHOD = "linear"
FAILED = (TurnStatus.ERROR, TurnStatus.TIMEOUT)
_TOOL_CALL_WHERE = re.compile(r"^tool_calls\[(\d+)\]")


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks; None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: list[float]) -> dict[str, Any]:
    """p50 / p90 / p99 / max and the sample count of one latency series."""
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
        "n": len(values),
    }


def counts_code(turn: TurnRecord, code: str) -> bool:
    """Whether a verdict `code` on `turn` counts (see the module docstring)."""
    if turn.status is TurnStatus.KILLED:
        return False
    if code in CORRUPTION_CODES or code in EVIDENCE_CODES:
        return turn.status is TurnStatus.OK
    return True


def turn_codes(turn: TurnRecord) -> list[str]:
    """The distinct counted codes of one turn, in the order first found."""
    return list(dict.fromkeys(v.code for v in turn.verdicts if counts_code(turn, v.code)))


def bad_tool_calls(turn: TurnRecord) -> int:
    """Tool calls of an ok turn that a corruption verdict points at (`where` = tool_calls[i]...)."""
    if turn.status is not TurnStatus.OK:
        return 0
    bad: set[int] = set()
    for v in turn.verdicts:
        m = _TOOL_CALL_WHERE.match(v.where)
        if m and v.code in CORRUPTION_CODES:
            bad.add(int(m.group(1)))
    return len(bad)


def tool_call_count(turn: TurnRecord) -> int:
    """Tool calls of an ok turn; the calls of killed or failed turns are not judged."""
    return len(turn.response.tool_calls) if turn.status is TurnStatus.OK and turn.response else 0


def turn_end_wall_ns(turn: TurnRecord) -> int:
    """When the turn ended on the wall clock; the last stamp reached for turns cut short."""
    t = turn.timings
    for stamp in (t.end_ns, t.first_token_ns, t.first_byte_ns):
        if stamp is not None:
            return t.start_wall_ns + (stamp - t.start_ns)
    return t.start_wall_ns


def _wall_ns(event: dict[str, Any]) -> int | None:
    """An event's wall-clock stamp; None where it has none a clock could give (hand-edited)."""
    t = event.get("t_wall_ns")
    return t if type(t) is int and 0 <= t < INT64 else None


def run_window(history: History) -> tuple[int | None, int | None]:
    """(start, end) of the run in wall-clock ns: run_start/run_end events, else turns and events."""
    stamped = [(e.get("kind"), t) for e in history.events if (t := _wall_ns(e)) is not None]
    starts = [t for kind, t in stamped if kind == "run_start"]
    ends = [t for kind, t in stamped if kind == "run_end"]
    seen = [t.timings.start_wall_ns for t in history.turns if t.timings.start_wall_ns]
    seen += [turn_end_wall_ns(t) for t in history.turns if t.timings.start_wall_ns]
    seen += [t for _, t in stamped]
    start = min(starts) if starts else (min(seen) if seen else None)
    # NOTE: without run_end (a killed harness) the run lasted at least until its last record.
    end = max(ends) if ends else (max(seen) if seen else None)
    return start, end


def is_good(turn: TurnRecord) -> bool:
    """A completed turn that every checker judged and none found corrupt."""
    return turn.status is TurnStatus.OK and not turn.corrupt and not turn.check_errors


def outcome_counts(turns: list[TurnRecord]) -> dict[str, int]:
    """The `turns` block. `ok`: a complete response arrived, whatever the checkers found in it
    (so it counts corrupt turns too); `good`: ok, judged by every checker and not corrupt;
    `corrupt`: ok with a corruption code; `killed`: cancelled by our own nemesis, not judged;
    `error`: HTTP error, connection failure or timeout. total = ok + killed + error."""
    return {
        "total": len(turns),
        "ok": sum(t.status is TurnStatus.OK for t in turns),
        "good": sum(is_good(t) for t in turns),
        "killed": sum(t.status is TurnStatus.KILLED for t in turns),
        "corrupt": sum(t.corrupt for t in turns),
        "error": sum(t.status in FAILED for t in turns),
    }
