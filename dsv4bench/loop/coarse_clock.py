"""Deadlines that may fire a little late, for many connections at once: one timer for all of them.

A pass-through sets a deadline or two on every request (its head, its body) and cancels nearly
all of them. An asyncio timer each costs a heap push and a cancelled handle left in the heap,
whose entries compare through a Python method: with hundreds of connections open, a few
microseconds a request, paid in the burst of requests that every first chunk waits behind
(bench-plan.md, "`dsv4bench proxy`"). `CoarseClock` keeps deadlines in buckets of `TICK_S`
instead: setting one is a dict insert, dropping one a dict delete, and one loop timer, set for
the earliest bucket, fires all that fell due. A deadline fires no earlier than asked and at
most one tick late.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import weakref
from collections.abc import Callable
from typing import NewType

TICK_S = 0.05  # a deadline fires at most this late

Deadline = NewType("Deadline", tuple[int, int])  # (bucket, key): what `drop` takes


class CoarseClock:
    """The loop's coarse deadlines: `at(seconds, callback)` and `drop(deadline)`. Callbacks run
    from the loop (never inside `at`), in bucket order; one that raises is the loop's to report,
    and the rest of its bucket still run."""

    _clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CoarseClock] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float = TICK_S) -> None:
        # A proxy, not the loop itself: `_clocks` holds its clock while the loop lives, and a clock
        # that held the loop would keep it alive for ever.
        self._loop: asyncio.AbstractEventLoop = weakref.proxy(loop)
        self._tick = tick
        self._buckets: dict[int, dict[int, Callable[[], None]]] = {}
        self._due: list[int] = []  # bucket numbers, a heap; one may be listed twice or be gone
        self._keys = itertools.count()
        # The buckets a loop timer is set for. Timers are never cancelled (one set for a bucket
        # since emptied fires and finds nothing): a clock that held its timers' handles would hold
        # the loop through them.
        self._armed: set[int] = set()

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop | None = None) -> CoarseClock:
        """The one clock of `loop` (the running loop by default)."""
        loop = loop or asyncio.get_running_loop()
        clock = cls._clocks.get(loop)
        if clock is None:
            clock = cls._clocks[loop] = cls(loop)
        return clock

    def at(self, seconds: float, callback: Callable[[], None]) -> Deadline:
        """Call `callback` once `seconds` have passed (at most a tick later), unless dropped first."""
        bucket = math.ceil((self._loop.time() + seconds) / self._tick)
        entries = self._buckets.get(bucket)
        if entries is None:
            entries = self._buckets[bucket] = {}
            heapq.heappush(self._due, bucket)
            if bucket == self._due[0] and bucket not in self._armed:
                self._arm(bucket)
        key = next(self._keys)
        entries[key] = callback
        return Deadline((bucket, key))

    def drop(self, deadline: Deadline) -> None:
        """Forget a deadline; one that has fired or was dropped already is no matter."""
        bucket, key = deadline
        entries = self._buckets.get(bucket)
        if entries is not None:
            entries.pop(key, None)
            if not entries:  # its heap entry stays, and is passed over when it comes up
                del self._buckets[bucket]

    def pending(self) -> int:
        """How many deadlines wait (for tests and diagnostics)."""
        return sum(map(len, self._buckets.values()))

    def _arm(self, bucket: int) -> None:
        self._armed.add(bucket)
        self._loop.call_at(bucket * self._tick, self._fire, bucket)

    def _fire(self, armed: int) -> None:
        self._armed.discard(armed)
        # The bucket the timer was set for is due, though the loop may run it a hair early.
        now = max(math.floor(self._loop.time() / self._tick), armed)
        while self._due and self._due[0] <= now:
            entries = self._buckets.pop(heapq.heappop(self._due), None)
            for callback in (entries or {}).values():
                self._loop.call_soon(callback)
        while self._due and self._due[0] not in self._buckets:  # dropped buckets at the head
            heapq.heappop(self._due)
        if self._due and self._due[0] not in self._armed:
            self._arm(self._due[0])
