"""The harness's own clock: how late its event loop runs, and what that does to a turn.

One process drives every session on one event loop. When that loop stands still (a full
garbage collection walking thousands of transcripts, a burst of sessions building their
worlds, another process taking the core), no byte is read, no timer fires, and every turn in
flight looks slower than the server made it. Two things must then not happen: a turn failed
for the harness's pause recorded as the server's timeout, and a stamp taken after the pause
passed off as the server's timing.

`LoopWatch` ticks every `TICK_S`. A tick that wakes more than `STALL_S` late marks a stall, the
stretch [wake - lateness, wake] in which the loop ran nothing of ours. Then:
- the turns' deadlines are kept on the watch's listening clock, which stops during stalls
  (`deadline`, `move`, `drop`): a server always gets its whole TTFT and total time of a
  harness that is listening. The watch itself fires them, on the tick that has first taken
  in any stall, so a deadline that fell due during one cannot fire before it is counted;
- each turn's record carries the stall time that overlapped it (`stall_within`), so the
  summary can say which timings may be late and by how much;
- the run's loop lag (percentiles of every tick's lateness) and its stalls are written as one
  `harness_clock` event at the end of the load (`as_event`), for the summary and the report.

Lateness below `STALL_S` is the loop being busy, not stopped: it still reads every socket
within that time, so stamps and deadlines stay true to within it.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections import deque
from typing import Any

import anyio

TICK_S = 0.010  # how often the watch wakes
STALL_S = 0.050  # a tick later than this marks a stall
# A deadline's own cancel-scope deadline, this long after the watch's: the backstop should the
# watch ever not run, so no turn can wait for ever.
BACKSTOP_S = 60.0
_KEEP_STALLS = 4096  # the newest stalls kept for per-turn overlap (older turns have ended)
_NS = 1_000_000_000


class Deadline:
    """One cancel scope's deadline on the listening clock (see LoopWatch.deadline); `scope` is
    None once it fired or was dropped."""

    __slots__ = ("scope", "due")

    def __init__(self, scope: anyio.CancelScope, due: float) -> None:
        self.scope: anyio.CancelScope | None = scope
        self.due = due


def _bucket_ms(lag_ms: float) -> float:
    """Lateness histogram buckets: 0.1 ms up to 10 ms, 1 ms up to 1 s, 100 ms beyond."""
    if lag_ms < 10:
        return round(lag_ms, 1)
    if lag_ms < 1000:
        return float(round(lag_ms))
    return round(lag_ms, -2)


class LoopWatch:
    """Watches the running loop's lateness; see the module docstring."""

    def __init__(self) -> None:
        self.ticks = 0
        self.stalled_s = 0.0  # the sum of every stall so far
        self.longest_stall_s = 0.0
        self.stall_count = 0
        self._lag_hist: dict[float, int] = {}
        self._stall_ends: deque[int] = deque(maxlen=_KEEP_STALLS)  # monotonic ns, ascending
        self._stall_starts: deque[int] = deque(maxlen=_KEEP_STALLS)
        self._due: list[tuple[float, int, Deadline]] = []  # a heap by due time on the listening clock
        self._live: set[Deadline] = set()
        self._seq = itertools.count()

    async def run(self) -> None:
        """Tick until cancelled."""
        while True:
            before = time.monotonic_ns()
            await anyio.sleep(TICK_S)
            now = time.monotonic_ns()
            self.observe(before, now)

    def observe(self, slept_from_ns: int, woke_ns: int) -> None:
        """One tick: it slept from `slept_from_ns` and woke at `woke_ns`."""
        lag_s = max(0.0, (woke_ns - slept_from_ns) / _NS - TICK_S)
        self.ticks += 1
        key = _bucket_ms(lag_s * 1e3)
        self._lag_hist[key] = self._lag_hist.get(key, 0) + 1
        if lag_s > STALL_S:
            self.stall_count += 1
            self.stalled_s += lag_s
            self.longest_stall_s = max(self.longest_stall_s, lag_s)
            self._stall_starts.append(woke_ns - int(lag_s * _NS))
            self._stall_ends.append(woke_ns)
            for d in self._live:  # their backstops move too: the stall was ours
                assert d.scope is not None  # drop() takes a deadline out of _live before it clears its scope
                d.scope.deadline += lag_s
        now = self.listening_s(woke_ns)
        while self._due and self._due[0][0] <= now:
            due, _, d = heapq.heappop(self._due)
            scope = d.scope
            if scope is not None and d.due == due:  # else dropped, or moved (a newer entry holds it)
                self.drop(d)
                scope.cancel()

    def listening_s(self, now_ns: int | None = None) -> float:
        """The listening clock: monotonic seconds less every stall taken in so far."""
        return (time.monotonic_ns() if now_ns is None else now_ns) / _NS - self.stalled_s

    def deadline(self, scope: anyio.CancelScope, after_s: float) -> Deadline:
        """Cancel `scope` once `after_s` seconds of listening have passed (the TTFT deadline)."""
        d = Deadline(scope, 0.0)
        self._live.add(d)
        self.move(d, self.listening_s() + after_s)
        return d

    def move(self, d: Deadline, due: float) -> None:
        """`d` now falls due at `due` on the listening clock (the total deadline)."""
        d.due = due
        if len(self._due) > 2 * len(self._live) + 1024:  # mostly dropped and moved entries: rebuild
            self._due = [(x.due, next(self._seq), x) for x in self._live if x is not d]
            heapq.heapify(self._due)
        heapq.heappush(self._due, (due, next(self._seq), d))
        if d.scope is not None:
            d.scope.deadline = anyio.current_time() + (due - self.listening_s()) + BACKSTOP_S

    def drop(self, d: Deadline) -> None:
        """The turn is over: `d` never fires."""
        self._live.discard(d)
        d.scope = None  # the heap keeps `d` until it would have fallen due; the turn's scope goes now

    def stall_within(self, start_ns: int, end_ns: int) -> float:
        """Seconds of stall that overlap [start_ns, end_ns]."""
        ends = self._stall_ends
        i = bisect.bisect_left(ends, start_ns)
        total = 0
        for j in range(i, len(ends)):
            s, e = self._stall_starts[j], ends[j]
            if s >= end_ns:
                break
            total += min(e, end_ns) - max(s, start_ns)
        return max(0, total) / _NS

    def lag_ms(self, q: float) -> float | None:
        """The q-quantile of every tick's lateness (ms, to its bucket), None before any tick."""
        if not self.ticks:
            return None
        rank, seen = q * (self.ticks - 1), 0
        for key in sorted(self._lag_hist):
            seen += self._lag_hist[key]
            if seen > rank:
                return key
        return max(self._lag_hist)

    def as_event(self) -> dict[str, Any]:
        """The fields of the run's `harness_clock` event."""
        return {
            "tick_s": TICK_S,
            "stall_s": STALL_S,
            "ticks": self.ticks,
            "lag_p50_ms": self.lag_ms(0.5),
            "lag_p99_ms": self.lag_ms(0.99),
            "lag_max_ms": self.lag_ms(1.0),
            "stalls": self.stall_count,
            "stalled_s": round(self.stalled_s, 3),
            "longest_stall_s": round(self.longest_stall_s, 3),
        }
