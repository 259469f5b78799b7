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
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio


class TurnLane:
    """See the module docstring. `async with lane.turn():` around synchronous work only."""

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self.passes = 0  # sections run through the lane

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        with anyio.CancelScope(shield=True):
            await self._lock.acquire()  # even when free it yields once: the loop polls first
        try:
            self.passes += 1
            yield
        finally:
            self._lock.release()
