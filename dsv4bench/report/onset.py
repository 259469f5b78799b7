"""Where it started: the first finding of each code, and the server metrics that moved most in
the minute before it. Evidence for the reader, never a verdict: a metric that moved beside a
finding may be its cause, its effect or neither.

For each series scraped from an endpoint (metrics.jsonl: any gauge or counter; histogram
buckets and `_created` stamps left out), the minute before the finding (the window) is set
against the run before that (the baseline); a finding earlier than two minutes in splits the
time before it in two halves instead. A counter (`_total`, `_count`, `_sum`) is compared by its
rate, a gauge by its level, each as the mean over its points. A series moved when its mean
changed by at least MIN_RELATIVE of the larger mean and by more than NOISE_SIGMAS baseline
standard deviations, so a counter that grows steadily or a gauge that wobbles as it always did
is not named. The moved series are ranked by relative change; the top few are kept.

Pure: a History in, plain data out (summary.json's `first_findings`, the report's section, the
timeline's marks).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from dsv4bench.history.codes import EVIDENCE_CODES
from dsv4bench.history.records import INT64
from dsv4bench.history.run_folder import History
from dsv4bench.report.counting import run_window, turn_codes, turn_end_wall_ns

WINDOW_S = 60.0  # the minute before a finding
MIN_RELATIVE = 0.25  # a mean that changed by less than a quarter did not move
NOISE_SIGMAS = 2.0  # ... nor one that changed by no more than the baseline's own spread
TOP = 3  # series named per finding
MIN_POINTS = 2  # points each side needs before a series is compared
COUNTER_SUFFIXES = ("_total", "_count", "_sum")
RATE, LEVEL = "rate", "level"


@dataclass(frozen=True)
class MetricMove:
    """One series that moved before a finding: its mean rate (counters, per second) or level
    (gauges) over the baseline (`before`) and over the window (`after`)."""

    endpoint: str
    series: str
    kind: str
    before: float
    after: float

    @property
    def relative(self) -> float:
        return abs(self.after - self.before) / max(abs(self.before), abs(self.after))


@dataclass(frozen=True)
class FirstFinding:
    """The first turn that carried a code: when it ended (seconds since the run's start, and on
    the wall clock), which session and turn, and the series that moved before it."""

    code: str
    t_s: float
    t_wall_ns: int
    session: str
    turn: int
    moved: tuple[MetricMove, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t_s, 3),
            "session": self.session,
            "turn": self.turn,
            "moved": [asdict(m) for m in self.moved],
        }


def is_counter(series: str) -> bool:
    """A counter by Prometheus's naming (the text format's samples keep the suffix)."""
    return series.split("{", 1)[0].endswith(COUNTER_SUFFIXES)


def _compared(series: str) -> bool:
    name = series.split("{", 1)[0]
    return not name.endswith(("_bucket", "_created")) and "quantile=" not in series


def series_points(metrics: list[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """{(endpoint, series): [(wall ns, value), ...]} in time order, from the good scrapes."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for m in sorted(metrics, key=lambda m: t if type(t := m.get("t_wall_ns")) is int else 0):
        t, values = m.get("t_wall_ns"), m.get("values")
        if not m.get("ok") or type(t) is not int or not 0 <= t < INT64 or not isinstance(values, dict):
            continue
        for key, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and _compared(str(key)):
                out.setdefault((str(m.get("endpoint", "")), str(key)), []).append((t, float(v)))
    return out


def per_interval(points: list[tuple[int, float]], counter: bool) -> list[tuple[int, float]]:
    """A gauge's points as they are; a counter's as its rate per second between scrapes, stamped
    at the later scrape (a counter that went down was reset: its new value is what it counted)."""
    if not counter:
        return points
    out = []
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t1 > t0:
            out.append((t1, (v1 - v0 if v1 >= v0 else v1) / ((t1 - t0) / 1e9)))
    return out


def moved_metrics(
    metrics: list[dict[str, Any]], at_wall_ns: int, run_start_ns: int, top: int = TOP
) -> list[MetricMove]:
    """The series that moved most before `at_wall_ns` (see the module docstring), most first."""
    before_s = (at_wall_ns - run_start_ns) / 1e9
    window_s = WINDOW_S if before_s >= 2 * WINDOW_S else before_s / 2
    if window_s <= 0:
        return []
    split = at_wall_ns - int(window_s * 1e9)
    moves = []
    for (endpoint, series), points in series_points(metrics).items():
        counter = is_counter(series)
        values = per_interval([p for p in points if p[0] <= at_wall_ns], counter)
        base = [v for t, v in values if t <= split]
        window = [v for t, v in values if t > split]
        if len(base) < MIN_POINTS or len(window) < MIN_POINTS:
            continue
        b, a = statistics.fmean(base), statistics.fmean(window)
        change = abs(a - b)
        if change == 0 or change < MIN_RELATIVE * max(abs(a), abs(b)):
            continue
        if change <= NOISE_SIGMAS * statistics.pstdev(base):
            continue
        moves.append(MetricMove(endpoint, series, RATE if counter else LEVEL, round(b, 6), round(a, 6)))
    moves.sort(key=lambda m: (-m.relative, m.endpoint, m.series))
    return moves[:top]


def first_turns(history: History) -> dict[str, tuple[int, str, int]]:
    """code -> (wall ns its turn ended, session, turn) of the first turn carrying each counted
    code (evidence codes left out: they are no finding about the server), first found first."""
    firsts: dict[str, tuple[int, str, int]] = {}
    for t in history.turns:
        at = turn_end_wall_ns(t)
        for code in turn_codes(t):
            if code not in EVIDENCE_CODES and (code not in firsts or at < firsts[code][0]):
                firsts[code] = (at, t.session, t.turn)
    return dict(sorted(firsts.items(), key=lambda kv: (kv[1][0], kv[0])))


def first_findings(history: History) -> dict[str, FirstFinding]:
    """The first finding of each code (first_turns), with the series that moved before each."""
    start, _ = run_window(history)
    if start is None:
        return {}
    return {
        code: FirstFinding(
            code, (at - start) / 1e9, at, session, turn, tuple(moved_metrics(history.metrics, at, start))
        )
        for code, (at, session, turn) in first_turns(history).items()
    }


def first_findings_block(history: History) -> dict[str, dict[str, Any]]:
    """summary.json's `first_findings`: code -> time, session, turn, the series that moved."""
    return {code: f.as_dict() for code, f in first_findings(history).items()}
