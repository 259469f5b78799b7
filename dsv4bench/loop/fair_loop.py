"""The harness's event loop: asyncio's, taking at most PASS_EVENTS ready sockets a pass, those
of streams awaiting their first token first.

A server's decode step sends every running stream its next token at once, so at a few hundred
streams one epoll wait returns hundreds of ready sockets, and asyncio runs all their reads in
one pass before any timer that fell due meanwhile: the loop's lag is then the whole tick's
reading (about 35 us a read on a small machine, 5 ms at 150 streams), and the kill schedule,
the deadlines and the stall watch (loop/lag_clock.py) fire that late. With the wait capped, a pass
reads at most PASS_EVENTS sockets and then runs the timers that are due; the sockets left over
stay ready and come first in the next wait (epoll queues a level-triggered socket it returned
behind those it did not), so every stream is read in turn, and the work a tick costs is the
same, only no longer in one piece.

A capped pass also runs the steps of the tasks the previous reads woke, so at thousands of
streams a socket can wait longer than the server's next chunk. TCP then merges the two chunks
as they queue, and the kernel's one stamp for them is the newer one's (transport.py): a first
token stamped a chunk late is a wrong TTFT. So the sockets of streams awaiting their first
token (`read_first`, which the transport calls from a request's sending to its first token)
sit in a second epoll set that every wait asks first: they are read in the next pass, whatever
queue is ahead of them. Later chunks keep their turn; a loop that cannot keep up stamps some of
them late, never early (bench-plan.md, "Scale in one process").

Elsewhere than Linux (no epoll), and under gevent's patched selectors, the default loop.
"""

from __future__ import annotations

import asyncio
import select
import selectors
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

# 8 reads and their tasks' steps, about half a millisecond of a pass on a small machine: at 16,
# the loop's lag p99 at 2,000 sessions was 5.8-5.9 ms, at 8 4.4-4.6 ms (bench-plan.md).
PASS_EVENTS = 8


class _CappedEpoll:
    """An epoll object whose waits return at most `cap` events, those of the sockets put first
    (`put_first`) ahead of the others; the rest is the wrapped epoll's own."""

    def __init__(self, epoll: select.epoll, cap: int) -> None:
        self._epoll = epoll
        self._cap = cap
        # The sockets put first, in an epoll set of their own as well as in the loop's: a wait
        # asks it first, so one of them ready behind a thousand others is still in this pass.
        self._first = select.epoll()
        self._first_fds: set[int] = set()
        self._masks: dict[int, int] = {}  # what the loop asks of each socket in the wrapped set

    def register(self, fd: int, eventmask: int) -> None:
        self._epoll.register(fd, eventmask)
        self._masks[fd] = eventmask

    def modify(self, fd: int, eventmask: int) -> None:
        self._epoll.modify(fd, eventmask)
        self._masks[fd] = eventmask

    def unregister(self, fd: int) -> None:
        self._masks.pop(fd, None)
        self._epoll.unregister(fd)

    def put_first(self, fd: int, first: bool) -> None:
        """Whether the socket `fd` is read ahead of the others (a stream awaiting its first token)."""
        try:
            if first:
                try:
                    self._first.register(fd, select.EPOLLIN)
                except FileExistsError:  # a closed socket's number, taken again: the kernel dropped it
                    self._first.modify(fd, select.EPOLLIN)
                self._first_fds.add(fd)
                return
            self._first_fds.discard(fd)
            self._first.unregister(fd)
        except (OSError, ValueError):  # closed meanwhile: the kernel has dropped it from the set
            self._first_fds.discard(fd)

    def poll(self, timeout: float = -1, maxevents: int = -1) -> list[tuple[int, int]]:
        cap = self._cap if maxevents <= 0 or maxevents > self._cap else maxevents
        # Only a socket the loop is reading: one it stopped reading (flow control, a closed
        # transport) would come back at every wait, and keep the loop from ever sleeping.
        masks = self._masks
        first = (
            [(fd, m) for fd, m in self._first.poll(0, cap) if masks.get(fd, 0) & select.EPOLLIN]
            if self._first_fds
            else []
        )
        if not first:
            return self._epoll.poll(timeout, cap)
        events = dict(first)
        if len(first) < cap:
            for fd, mask in self._epoll.poll(0, cap - len(first)):  # a socket in both sets comes once
                events[fd] = events.get(fd, 0) | mask
        return list(events.items())

    def close(self) -> None:
        self._first.close()
        self._epoll.close()

    def __getattr__(self, name: str) -> object:  # fileno, closed
        return getattr(self._epoll, name)


# NOTE: looked up, not assumed: gevent's patched `selectors` (under Locust, whose processes
# import this module through run.py) has no EpollSelector, and neither has another OS.
_EpollSelector: type[selectors.BaseSelector] | None = getattr(selectors, "EpollSelector", None)

if _EpollSelector is not None:

    class FairEpollSelector(selectors.EpollSelector):
        """selectors' EpollSelector whose select() returns at most `cap` ready keys, those put
        first ahead (see the module docstring)."""

        def __init__(self, cap: int = PASS_EVENTS) -> None:
            super().__init__()
            # The epoll object its waits go through, which the capped one replaces.
            epoll: select.epoll = self._selector  # type: ignore[has-type]  # CPython's, private: typeshed lacks it
            self._selector = _CappedEpoll(epoll, cap)


_CAPPED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _CappedEpoll] = weakref.WeakKeyDictionary()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The harness's loop: epoll waits capped at PASS_EVENTS, or asyncio's default loop."""
    if _EpollSelector is None:
        return asyncio.new_event_loop()
    selector = FairEpollSelector()
    loop = asyncio.SelectorEventLoop(selector)
    _CAPPED[loop] = selector._selector
    return loop


def read_first(fd: int, first: bool = True) -> None:
    """On the harness's loop, read the socket `fd` ahead of every other ready one (`first`), or
    no longer; elsewhere nothing. A stream awaiting its first token is read first, so the
    kernel's stamp of that token is its own even when the loop is a tick behind (transport.py)."""
    try:
        capped = _CAPPED.get(asyncio.get_running_loop())
    except RuntimeError:
        return
    if capped is not None:
        capped.put_first(fd, first)


def run(func: Callable[..., Awaitable[T]], *args: object) -> T:
    """anyio.run(func, *args) on the harness's loop."""
    return anyio.run(func, *args, backend_options={"loop_factory": new_event_loop})
