"""The harness's event loop: asyncio's, taking at most PASS_EVENTS ready sockets a pass.

A server's decode step sends every running stream its next token at once, so at a few hundred
streams one epoll wait returns hundreds of ready sockets, and asyncio runs all their reads in
one pass before any timer that fell due meanwhile: the loop's lag is then the whole tick's
reading (about 35 us a read on a small machine, 5 ms at 150 streams), and the kill schedule,
the deadlines and the stall watch (loop_watch.py) fire that late. With the wait capped, a pass
reads at most PASS_EVENTS sockets and then runs the timers that are due; the sockets left over
stay ready and come first in the next wait (epoll queues a level-triggered socket it returned
behind those it did not), so every stream is read within the tick as before, and the work a
tick costs is the same, only no longer in one piece. The first-token stamps do not depend on
it: they are the kernel's receive times (transport.py).

Elsewhere than Linux (no epoll), the default loop.
"""

from __future__ import annotations

import asyncio
import select
import selectors
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

PASS_EVENTS = 16  # 16 reads and their tasks' steps: about 1 ms of a pass on a small machine (bench-plan.md)


class _CappedEpoll:
    """An epoll object whose waits return at most `cap` events; the rest is its own."""

    def __init__(self, epoll: select.epoll, cap: int) -> None:
        self._epoll = epoll
        self._cap = cap

    def poll(self, timeout: float = -1, maxevents: int = -1) -> list[tuple[int, int]]:
        if maxevents <= 0 or maxevents > self._cap:
            maxevents = self._cap
        return self._epoll.poll(timeout, maxevents)

    def __getattr__(self, name: str) -> object:  # register, modify, unregister, close, fileno
        return getattr(self._epoll, name)


class FairEpollSelector(selectors.EpollSelector):
    """selectors' EpollSelector whose select() returns at most `cap` ready keys."""

    def __init__(self, cap: int = PASS_EVENTS) -> None:
        super().__init__()
        self._selector = _CappedEpoll(self._selector, cap)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The harness's loop: epoll waits capped at PASS_EVENTS, or asyncio's default loop."""
    if not hasattr(select, "epoll"):
        return asyncio.new_event_loop()
    return asyncio.SelectorEventLoop(FairEpollSelector())


def run(func: Callable[..., Awaitable[T]], *args: object) -> T:
    """anyio.run(func, *args) on the harness's loop."""
    return anyio.run(func, *args, backend_options={"loop_factory": new_event_loop})
