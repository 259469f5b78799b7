"""TokenEvents handed from an engine thread to asyncio consumers (server_loop.AsyncSink): every
event arrives, in order per request, in far fewer loop wake-ups than events, and a push after
the loop closed is dropped, not raised."""

from __future__ import annotations

import asyncio
import threading

from dsv4bench.engine.request import FinishReason, Request, SamplingParams
from dsv4bench.engine.server_loop import AsyncSink, TokenEvent


def _events(rid: str, n: int) -> list[TokenEvent]:
    req = Request(rid, [1, 2, 3], SamplingParams(max_tokens=n))
    return [TokenEvent.of(req, [i], FinishReason.LENGTH if i == n - 1 else None) for i in range(n)]


def test_every_event_arrives_in_order_in_batches():
    async def main():
        loop = asyncio.get_running_loop()
        sinks = [AsyncSink(loop) for _ in range(80)]
        wakes = 0
        real = loop.call_soon_threadsafe

        def counted(*a, **kw):
            nonlocal wakes
            wakes += 1
            return real(*a, **kw)

        loop.call_soon_threadsafe = counted

        def engine_thread():  # 50 steps, each one event per request, as a decode step ends
            per_sink = [_events(f"r{i}", 50) for i in range(80)]
            for step in range(50):
                for sink, evs in zip(sinks, per_sink):
                    sink.push(evs[step])

        t = threading.Thread(target=engine_thread)
        t.start()
        got = [[] for _ in sinks]
        for i, sink in enumerate(sinks):
            while len(got[i]) < 50:
                got[i].append((await asyncio.wait_for(sink.queue.get(), 5)).token_ids[0])
        t.join()
        del loop.call_soon_threadsafe
        return got, wakes

    got, wakes = asyncio.run(main())
    assert got == [list(range(50))] * 80
    assert wakes < 80 * 50 / 10  # events ride on hand-overs already scheduled


def test_a_push_after_the_loop_closed_is_dropped():
    loop = asyncio.new_event_loop()
    sink = AsyncSink(loop)
    loop.close()
    for ev in _events("r", 3):
        sink.push(ev)  # no RuntimeError: the server is shutting down
