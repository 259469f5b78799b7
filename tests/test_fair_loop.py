"""The harness's loop (fair_loop.py): a burst of ready sockets does not hold a due timer back."""

from __future__ import annotations

import asyncio
import importlib.util
import select
import selectors
import socket
import subprocess
import sys
import time

import pytest

from dsv4bench.loop import fair_loop
from dsv4bench.loop.fair_loop import PASS_EVENTS, FairEpollSelector

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


def test_a_socket_put_first_is_in_the_next_wait_whatever_queue_is_ahead_of_it():
    pairs = _ready_pairs(101)
    sel = FairEpollSelector(cap=16)
    try:
        for _, b in pairs:
            sel.register(b, selectors.EVENT_READ)
        late = pairs[-1][1].fileno()  # ready last: epoll returns it after the hundred others
        assert late not in {key.fd for key, _ in sel.select(0)}  # the control
        sel._selector.put_first(late, True)
        waits = [{key.fd for key, _ in sel.select(0)} for _ in range(3)]
        assert all(late in w and len(w) == 16 for w in waits)  # every wait, while it stays ready
        pairs[-1][1].recv(1)
        assert late not in {key.fd for key, _ in sel.select(0)}  # read: nothing to say
        pairs[-1][0].send(b"x")
        sel._selector.put_first(late, False)
        assert late not in {key.fd for key, _ in sel.select(0)}  # back in its turn
    finally:
        sel.close()
        _close(pairs)


def test_a_socket_put_first_that_the_loop_no_longer_reads_does_not_keep_it_awake():
    pairs = _ready_pairs(1)
    sel = FairEpollSelector(cap=16)
    try:
        b = pairs[0][1]
        sel.register(b, selectors.EVENT_READ)
        sel._selector.put_first(b.fileno(), True)
        assert [key.fd for key, _ in sel.select(0)] == [b.fileno()]
        sel.unregister(b)  # as a transport does that pauses reading, or closes
        t0 = time.monotonic()
        assert sel.select(0.1) == []
        assert time.monotonic() - t0 >= 0.09  # it slept: no wait came back at once for it
    finally:
        sel.close()
        _close(pairs)


def test_a_closed_socket_put_first_and_its_number_taken_again_are_no_error():
    sel = FairEpollSelector(cap=16)
    a, b = socket.socketpair()
    x, y = a, b
    try:
        fd = b.fileno()
        sel.register(b, selectors.EVENT_READ)
        sel._selector.put_first(fd, True)
        sel.unregister(b)
        b.close()
        sel._selector.put_first(fd, False)  # the kernel dropped it from the set already
        x, y = socket.socketpair()
        again, peer = (x, y) if x.fileno() == fd else (y, x)
        assert again.fileno() == fd  # the lowest free number: the closed socket's
        sel.register(again, selectors.EVENT_READ)
        sel._selector.put_first(fd, True)
        peer.send(b"x")
        assert [key.fd for key, _ in sel.select(0)] == [fd]
    finally:
        sel.close()
        for sock in (a, b, x, y):
            sock.close()


def test_read_first_is_nothing_off_the_harness_loop():
    async def on_asyncios_loop() -> None:
        fair_loop.read_first(12345)  # no capped set on this loop

    fair_loop.read_first(12345)  # no running loop
    asyncio.run(on_asyncios_loop())


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
        return asyncio.get_running_loop()._selector  # type: ignore[attr-defined]  # asyncio's own, private

    assert isinstance(fair_loop.run(which), FairEpollSelector)


@pytest.mark.skipif(importlib.util.find_spec("gevent") is None, reason="gevent comes with the locust extra")
def test_the_harness_imports_under_gevents_patched_selectors():
    # Locust's processes patch `selectors` (it has no EpollSelector then) and import run.py.
    code = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import dsv4bench.locust.server_watch\n"
        "from dsv4bench.loop import fair_loop\n"
        "print(type(fair_loop.new_event_loop()).__name__)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("EventLoop"), r.stderr
