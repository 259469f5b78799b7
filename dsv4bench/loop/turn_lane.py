"""The harness's own work between two turns, one session at a time, each through the loop.

A server steps its streams together, so the streams of sessions that started together end
together: at 100 sessions, ten turns can end in the same 50 ms decode tick. What a session does
between its turns (the checkers, the record, the tools run on its world, the next request; at
session start, the world built) is one to a few milliseconds of Python that holds the loop.
Ten of them in one pass of the loop held it for 10-15 ms, and every first token that arrived
meanwhile was stamped that late (bench-plan.md, "Scale in one process").

The lane lets one session at a time do that work, and each hand-over goes through the loop
(a woken waiter runs in the next pass, after the loop has polled its sockets): a pass holds at
most one session's work, and the bytes that came meanwhile are stamped between two sessions'
work instead of after all of it. The total work is the same; it is spread, not removed.

Entering the lane cannot be cancelled: the wait is bounded by the other sessions' synchronous
work, and what waits is a finished turn whose record must not be lost to a cancellation.

A session being started waits in a queue of its own, served first (`turn(first=True)`). Why:
the lane hands over once a pass, so a world built in steps waited, for every step, behind every
turn that was waiting, and when the harness's core was full the pool filled slower and slower:
at 5,000 sessions, 2,351 had started after 30 s (bench-plan.md, "The ramp"). Served first, the
pool fills while its first sessions wait a little longer between turns; a turn's timings are
stamped as its bytes arrive, outside the lane, so none of them is late for it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio


class TurnLane:
    """See the module docstring. `async with lane.turn():` around synchronous work only."""

    def __init__(self) -> None:
        self._held = False
        self._first: deque[asyncio.Future[None]] = deque()  # sessions being started
        self._waiting: deque[asyncio.Future[None]] = deque()  # everything else, in order
        self.passes = 0  # sections run through the lane

    @asynccontextmanager
    async def turn(self, first: bool = False) -> AsyncIterator[None]:
        with anyio.CancelScope(shield=True):
            await self._enter(first)
        try:
            self.passes += 1
            yield
        finally:
            self._leave()

    async def _enter(self, first: bool) -> None:
        if not self._held and not self._first and not self._waiting:
            self._held = True
            try:
                await asyncio.sleep(0)  # free, it still yields once: the loop polls first
            except BaseException:  # cancelled from outside anyio's shield: the lane goes on
                self._leave()
                raise
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._first if first else self._waiting).append(handed)
        try:
            await handed  # the lane is this section's when it resolves, in a later pass
        except BaseException:
            if handed.done() and not handed.cancelled():  # handed over, then cancelled: pass it on
                self._leave()
            raise

    def _leave(self) -> None:
        """Hand the lane to the next section (a session being started first), or free it."""
        for queue in (self._first, self._waiting):
            while queue:
                handed = queue.popleft()
                if not handed.done():
                    handed.set_result(None)
                    return
        self._held = False
