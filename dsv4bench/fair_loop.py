"""The harness's event loop: asyncio's, taking at most PASS_EVENTS ready sockets a pass while
it keeps up with them.

A server's decode step sends every running stream its next token at once, so at a few hundred
streams one epoll wait returns hundreds of ready sockets, and asyncio runs all their reads in
one pass before any timer that fell due meanwhile: the loop's lag is then the whole tick's
reading (about 35 us a read on a small machine, 5 ms at 150 streams), and the kill schedule,
the deadlines and the stall watch (loop_watch.py) fire that late. With the wait capped, a pass
reads at most PASS_EVENTS sockets and then runs the timers that are due; the sockets left over
stay ready and come first in the next wait (epoll queues a level-triggered socket it returned
behind those it did not), so every stream is read within the tick as before, and the work a
tick costs is the same, only no longer in one piece.

The cap holds while the loop keeps up: a capped pass also runs the steps of the tasks the
previous reads woke, so a socket waits for the reads and the steps ahead of it, where asyncio
would make it wait for the reads alone. A socket read later than the server's next chunk
returns both chunks with one kernel stamp, the newer one's (TCP merges them as they queue), and
the first token's stamp is then a chunk late (transport.py). So once the waits have come back
full for LAGGING_S, the next one takes every ready socket, as asyncio's does: a loop that cannot
keep up reads late by at most about LAGGING_S plus one sweep of reads, and its timers wait for
that sweep (bench-plan.md, "Scale in one process").

Elsewhere than Linux (no epoll), and under gevent's patched selectors, the default loop.
"""

from __future__ import annotations

import asyncio
import select
import selectors
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

PASS_EVENTS = 16  # 16 reads and their tasks' steps: about 1 ms of a pass on a small machine (bench-plan.md)
# Half the gap between two chunks of a stream at 20 tokens/s, a loaded server's pace, so that a
# socket is read before its next chunk lands; at 15 ms the drains came often enough at 500
# streams to break the lag bound, at 35 ms the reads at 1,000 streams came a chunk late
# (bench-plan.md, "Scale in one process").
LAGGING_S = 0.025


class _CappedEpoll:
    """An epoll object whose waits return at most `cap` events, or all of them once they have
    come back full for `lagging_s`; the rest is its own."""

    def __init__(self, epoll: select.epoll, cap: int, lagging_s: float = LAGGING_S) -> None:
        self._epoll = epoll
        self._cap = cap
        self._lagging_s = lagging_s
        self._full_since = 0.0  # when the waits began to come back full (0: the last one was not)

    def poll(self, timeout: float = -1, maxevents: int = -1) -> list[tuple[int, int]]:
        if self._full_since and time.monotonic() - self._full_since >= self._lagging_s:
            self._full_since = 0.0
            return self._epoll.poll(timeout, maxevents)
        events = self._epoll.poll(timeout, self._cap if maxevents <= 0 or maxevents > self._cap else maxevents)
        if len(events) < self._cap:
            self._full_since = 0.0
        elif not self._full_since:
            self._full_since = time.monotonic()
        return events

    def __getattr__(self, name: str) -> object:  # register, modify, unregister, close, fileno
        return getattr(self._epoll, name)


# NOTE: looked up, not assumed: gevent's patched `selectors` (under Locust, whose processes
# import this module through run.py) has no EpollSelector, and neither has another OS.
_EpollSelector: type[selectors.BaseSelector] | None = getattr(selectors, "EpollSelector", None)

if _EpollSelector is not None:
    class FairEpollSelector(_EpollSelector):  # type: ignore[valid-type, misc]
        """selectors' EpollSelector whose select() returns at most `cap` ready keys while the
        loop keeps up (see the module docstring)."""

        def __init__(self, cap: int = PASS_EVENTS, lagging_s: float = LAGGING_S) -> None:
            super().__init__()
            self._selector = _CappedEpoll(self._selector, cap, lagging_s)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The harness's loop: epoll waits capped at PASS_EVENTS, or asyncio's default loop."""
    if _EpollSelector is None:
        return asyncio.new_event_loop()
    return asyncio.SelectorEventLoop(FairEpollSelector())


def run(func: Callable[..., Awaitable[T]], *args: object) -> T:
    """anyio.run(func, *args) on the harness's loop."""
    return anyio.run(func, *args, backend_options={"loop_factory": new_event_loop})
