"""The harness's own clock (loop/lag_clock.py): stalls of the event loop are measured, moved out of
the turns' deadlines and laid against each turn, so a pause of ours is never the server's timeout."""

from __future__ import annotations

import asyncio
import json
import time

import anyio

from dsv4bench.wire.client import chat_turn
from dsv4bench.harness.config import RunConfig
from dsv4bench.harness.driver import make_client
from dsv4bench.loop.lag_clock import STALL_S, TICK_S, LoopWatch
from dsv4bench.history.records import ErrorKind, TurnStatus
from dsv4bench.wire.turn_answer import Deadlines

MS = 1_000_000
BODY = {"model": "m", "messages": [], "stream": True}


def tick(w: LoopWatch, at_ms: float, late_ms: float) -> None:
    """A tick that slept TICK_S from (at - TICK_S - late) and woke at `at_ms`."""
    woke = int(at_ms * MS)
    w.observe(woke - int((TICK_S * 1e3 + late_ms) * MS), woke)


def test_late_ticks_make_the_lag_and_only_long_ones_are_stalls():
    w = LoopWatch()
    for i in range(98):
        tick(w, 10 * (i + 1), 0.2)
    tick(w, 2000, STALL_S * 1e3 - 1)  # busy, not stopped
    tick(w, 5000, 1500)  # stopped for 1.5 s
    ev = w.as_event()
    assert ev["ticks"] == 100 and ev["stalls"] == 1 and ev["longest_stall_s"] == 1.5
    assert ev["lag_p50_ms"] == 0.2 and ev["lag_max_ms"] == 1500
    assert w.stall_within(0, 3000 * MS) == 0.0
    assert abs(w.stall_within(3000 * MS, 6000 * MS) - 1.5) < 1e-6  # the stall: [3500, 5000] ms
    assert abs(w.stall_within(4000 * MS, 6000 * MS) - 1.0) < 1e-6  # cut where the turn began
    assert w.stall_within(5000 * MS + 1, 9000 * MS) == 0.0


def test_a_deadline_runs_on_the_listening_clock_and_fires_on_a_tick():
    async def main():
        w = LoopWatch()
        with anyio.CancelScope() as scope:
            w.deadline(scope, 0.05)
            before = time.monotonic_ns()
            await anyio.sleep(0.02)
            # the loop "stood still" 1 s: the deadline moves with it, and the backstop too
            w.observe(before, before + int((TICK_S + 1.0) * 1e9))
            assert not scope.cancel_called
            assert scope.deadline - anyio.current_time() > 30
            async with anyio.create_task_group() as tg:
                tg.start_soon(w.run)
                await anyio.sleep(5)  # cancelled long before this, by the watch
        assert scope.cancelled_caught
        return w

    w = anyio.run(main)
    assert w.stall_count == 1


async def _slow_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Every request: the first token after 0.3 s, then the end."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next((x.split(b":")[1] for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), b"0")
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            await asyncio.sleep(0.3)
            for data in ({"role": "assistant", "content": "Done."}, {}):
                chunk = {
                    "id": "r",
                    "model": "m",
                    "choices": [{"index": 0, "delta": data, "finish_reason": None if data else "stop"}],
                }
                line = f"data: {json.dumps(chunk)}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(line), line))
            writer.write(b"%x\r\ndata: [DONE]\n\n\r\n0\r\n\r\n" % len(b"data: [DONE]\n\n"))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def test_a_harness_stall_longer_than_the_ttft_deadline_is_no_timeout_of_the_server():
    """The server answers in 0.3 s against a 0.6 s TTFT deadline, while the harness's loop
    stands still for 1 s mid-turn: on wall time that is a `timeout_ttft` of a healthy
    server (the turn without the clock says so); on the listening clock the turn completes."""

    async def turn(clock: LoopWatch | None):
        srv = await asyncio.start_server(_slow_answer, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"

        async def stall_the_loop():
            await anyio.sleep(0.1)
            time.sleep(1.0)  # a full collection, a burst of starts: nothing of ours runs

        try:
            async with make_client(RunConfig(url=url + "/v1", concurrency=2)) as client:
                async with anyio.create_task_group() as tg:
                    if clock is not None:
                        tg.start_soon(clock.run)
                    tg.start_soon(stall_the_loop)
                    out = await chat_turn(client, url + "/v1/chat/completions", BODY, Deadlines(0.6, 5), clock=clock)
                    tg.cancel_scope.cancel()
        finally:
            srv.close()
        return out

    unwatched = anyio.run(turn, None)
    assert unwatched.status is TurnStatus.TIMEOUT and unwatched.error_kind is ErrorKind.TIMEOUT_TTFT
    clock = LoopWatch()
    watched = anyio.run(turn, clock)
    assert watched.status is TurnStatus.OK and watched.response.content == "Done.", watched.error
    assert clock.stall_count == 1 and 0.9 < clock.longest_stall_s < 1.5
    t = watched.timings
    assert 0.9 < clock.stall_within(t.start_ns, t.end_ns) < 1.5


def test_a_server_that_never_answers_still_times_out_on_the_listening_clock():
    async def main():
        async def never(reader, writer):
            try:
                await reader.read(1)
                await asyncio.sleep(30)
            finally:
                writer.close()

        srv = await asyncio.start_server(never, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        clock = LoopWatch()
        try:
            async with make_client(RunConfig(url=url + "/v1", concurrency=2)) as client:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(clock.run)
                    start = time.monotonic()
                    out = await chat_turn(client, url + "/v1/chat/completions", BODY, Deadlines(0.3, 5), clock=clock)
                    took = time.monotonic() - start
                    tg.cancel_scope.cancel()
        finally:
            srv.close()
        return out, took

    out, took = anyio.run(main)
    assert out.status is TurnStatus.TIMEOUT and out.error_kind is ErrorKind.TIMEOUT_TTFT
    assert 0.3 <= took < 1.0
