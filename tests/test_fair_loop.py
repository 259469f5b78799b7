"""The harness's loop (fair_loop.py): a burst of ready sockets does not hold a due timer back."""

from __future__ import annotations

import asyncio
import importlib.util
import select
import socket
import subprocess
import sys
import time

import pytest

from dsv4bench import fair_loop
from dsv4bench.fair_loop import PASS_EVENTS, FairEpollSelector

pytestmark = pytest.mark.skipif(not hasattr(select, "epoll"), reason="epoll is Linux's")

BURST = 8 * PASS_EVENTS


def _ready_pairs(n: int) -> list[tuple[socket.socket, socket.socket]]:
    pairs = [socket.socketpair() for _ in range(n)]
    for a, _ in pairs:
        a.send(b"x")
    return pairs


def _close(pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    for a, b in pairs:
        a.close()
        b.close()


def test_a_wait_returns_at_most_the_cap_and_the_rest_come_next_in_turn():
    pairs = _ready_pairs(100)
    sel = FairEpollSelector(cap=16)
    try:
        for _, b in pairs:
            sel.register(b, 1)
        waits = [{key.fd for key, _ in sel.select(0)} for _ in range(7)]  # nothing is read: all stay ready
        assert all(len(w) == 16 for w in waits)
        first_six = [fd for w in waits[:6] for fd in w]
        assert len(set(first_six)) == 96  # no socket twice before the others had their turn
        assert set().union(*waits) == {b.fileno() for _, b in pairs}
    finally:
        sel.close()
        _close(pairs)


def test_waits_that_keep_coming_back_full_give_way_to_one_that_takes_every_ready_socket():
    pairs = _ready_pairs(100)
    sel = FairEpollSelector(cap=16, lagging_s=0.05)
    try:
        for _, b in pairs:
            sel.register(b, 1)
        assert len(sel.select(0)) == 16  # full: the loop may be falling behind
        assert len(sel.select(0)) == 16  # not yet for long
        time.sleep(0.06)
        assert len(sel.select(0)) == 100  # behind for longer than lagging_s: all that is ready
        assert len(sel.select(0)) == 16  # and capped again
        for _, b in pairs:
            b.recv(1)
        assert sel.select(0) == []  # caught up: the window closes
        for a, _ in pairs:
            a.send(b"x")
        time.sleep(0.06)
        assert len(sel.select(0)) == 16  # a new window opens at this full wait, not at the old one
    finally:
        sel.close()
        _close(pairs)


def _reads_before_a_due_timer(loop: asyncio.AbstractEventLoop) -> int:
    """Sockets read in the pass where a timer is due while BURST sockets are ready, before it runs."""
    pairs = _ready_pairs(BURST)
    order: list[str] = []

    def read(sock: socket.socket) -> None:
        sock.recv(1)
        order.append("read")
        loop.remove_reader(sock)

    async def burst() -> None:
        for _, b in pairs:
            loop.add_reader(b, read, b)
        loop.call_at(loop.time(), order.append, "timer")  # due at the next pass, as a tick's timer is
        while order.count("read") < BURST:
            await asyncio.sleep(0.001)

    try:
        loop.run_until_complete(burst())
    finally:
        loop.close()
        _close(pairs)
    return order.index("timer")


def test_a_timer_due_during_a_burst_runs_after_at_most_one_pass_of_reads():
    assert _reads_before_a_due_timer(fair_loop.new_event_loop()) <= PASS_EVENTS
    # The control: asyncio's own loop reads the whole burst first (what the cap is for).
    assert _reads_before_a_due_timer(asyncio.SelectorEventLoop()) == BURST


def test_the_harness_runs_on_the_fair_loop():
    async def which() -> object:
        return asyncio.get_running_loop()._selector  # type: ignore[attr-defined]

    assert isinstance(fair_loop.run(which), FairEpollSelector)


@pytest.mark.skipif(importlib.util.find_spec("gevent") is None, reason="gevent comes with the locust extra")
def test_the_harness_imports_under_gevents_patched_selectors():
    # Locust's processes patch `selectors` (it has no EpollSelector then) and import run.py.
    code = ("from gevent import monkey; monkey.patch_all()\n"
            "import dsv4bench.locust.server_watch\n"
            "from dsv4bench import fair_loop\n"
            "print(type(fair_loop.new_event_loop()).__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("EventLoop"), r.stderr
