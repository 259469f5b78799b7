"""`dsv4bench watch`: WatchState on literal series, sparklines, and watch_main against the wedge server."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest
import uvicorn
from rich.console import Console

from dsv4bench.engine.launcher import free_port
from dsv4bench.watch import SPARK_CHARS, WatchState, render_watch, sparkline, watch_main
from tests.fixtures.wedge_server import WedgeState, build_app

S = 1_000_000_000
EP = "http://decode:30000/metrics"
TRANSFER = 'sglang:num_decode_transfer_queue_reqs{engine_type="decode",model_name="m"}'
RUNNING = 'sglang:num_running_reqs{engine_type="decode",model_name="m"}'
REQS = 'sglang:num_requests_total{engine_type="decode",model_name="m"}'


def _sample(t_s: float, transfer: float, running: float, reqs: float, ok: bool = True) -> dict:
    s = {"t_wall_ns": int(t_s * S), "t_ns": int(t_s * S), "endpoint": EP, "ok": ok}
    if ok:
        s["values"] = {TRANSFER: transfer, RUNNING: running, REQS: reqs}
    else:
        s["error"] = "ConnectError: refused"
    return s


def _feed(state: WatchState, rows: list[tuple[float, float, float, float]]) -> None:
    for row in rows:
        state.add(_sample(*row))


def test_healthy_series_is_never_marked() -> None:
    st = WatchState(stuck_s=2)
    # Busy: running > 0 throughout, but the request counter moves every scrape.
    _feed(st, [(t, 0, 4, 10 + t) for t in range(10)])
    assert st.wedge_forming(10 * S) == {}


def test_stuck_transfer_queue_with_frozen_counters_is_marked_after_stuck_s() -> None:
    st = WatchState(stuck_s=3)
    _feed(st, [(0, 10, 2, 5), (1, 58, 0, 9)])  # counters last moved at t=1
    _feed(st, [(t, 58, 0, 9) for t in (2, 3)])
    assert st.wedge_forming(3 * S) == {}  # flat for 2 s only
    _feed(st, [(4, 58, 0, 9)])
    assert st.wedge_forming(4 * S) == {EP: [TRANSFER]}
    # A failed scrape is no evidence of progress: the mark stays.
    st.add(_sample(5, 0, 0, 0, ok=False))
    assert st.wedge_forming(5 * S) == {EP: [TRANSFER]}
    assert "WEDGE?" in _text(render_watch(st))


def test_draining_queue_is_unmarked() -> None:
    st = WatchState(stuck_s=2)
    _feed(st, [(t, 58, 0, 9) for t in range(4)])
    assert st.wedge_forming(3 * S) == {EP: [TRANSFER]}
    # It drains without counters moving (e.g. requests dropped): shrinking restarts the clock.
    _feed(st, [(4, 40, 0, 9), (5, 20, 0, 9)])
    assert st.wedge_forming(5 * S) == {}
    _feed(st, [(6, 0, 0, 9)])
    assert st.wedge_forming(20 * S) == {}


def test_history_is_bounded() -> None:
    st = WatchState(stuck_s=2, history=5)
    _feed(st, [(t, t, 0, t) for t in range(20)])
    assert [v for _, v in st.endpoints[EP].gauges[TRANSFER]] == [15, 16, 17, 18, 19]


def test_sparkline_of_a_known_series() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == SPARK_CHARS
    assert sparkline([58, 58, 58]) == "███"  # high and flat reads as full, not empty
    assert sparkline([0, 0]) == "▁▁"
    assert sparkline([]) == ""


def _text(renderable: object) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


# --- watch_main against the fixture server -----------------------------------------------------

@pytest.fixture
def wedge_server() -> Iterator[str]:
    """The SGLang-shaped wedge server on a free loopback port, under uvicorn in a thread."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(WedgeState()), host="127.0.0.1", port=port,
                                           log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "wedge server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)


def _watch(url: str) -> int:
    console = Console(file=io.StringIO(), width=160)
    return anyio.run(watch_main, [url + "/metrics"], 3.0, 0.2, 1.0, console)


def test_watch_main_exits_1_when_a_queue_is_stuck(wedge_server: str) -> None:
    httpx.post(wedge_server + "/control", json={"stuck": {"sglang:num_decode_transfer_queue_reqs": 58}},
               trust_env=False).raise_for_status()
    assert _watch(wedge_server) == 1


def test_watch_main_exits_0_when_healthy(wedge_server: str) -> None:
    assert _watch(wedge_server) == 0


def test_watch_main_exits_2_when_nothing_answers() -> None:
    port = free_port()  # closed again: nothing listens there
    console = Console(file=io.StringIO())
    assert anyio.run(watch_main, [f"http://127.0.0.1:{port}/metrics"], 0.5, 0.2, 1.0, console) == 2
