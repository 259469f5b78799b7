"""Kill storms against the PD engine on loopback: the clean engine drains to zero everywhere;
`abort-leak` leaves the aborted transfers stuck in the decode transfer queue; `bootstrap-stall` kills the bootstrap worker (a client left while its answer streamed)
and later requests hang in the decode transfer queue while /health tells the truth (or, with
`health-lies`, does not). The deployment is the halves joined by the loopback bootstrap port,
behind our router, as `engine serve --pd` runs them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from dsv4bench.engine.model.kv_pools import KVPools
from dsv4bench.engine.pd.bootstrap import UnexpectedAbort
from dsv4bench.servers.wedge import is_queue_gauge

from .helpers import ServedPD, tiny_cfg, wait_until

# A 13-page prompt crosses the link in ~0.1 s, so transfers are caught in flight.
LINK_GBPS = 13 * KVPools(tiny_cfg(num_pages=1)).bytes_per_page() / 0.1 / 1e9
TRANSFER_Q = "sglang:num_decode_transfer_queue_reqs"
INFLIGHT_Q = "sglang:num_prefill_inflight_queue_reqs"


def serve(*faults: str) -> ServedPD:
    # 32-token prefill chunks: a ~200-token prompt takes several steps, so requests wait for it.
    return ServedPD(link_gbps=LINK_GBPS, health_timeout_s=1.0, chunked_prefill_tokens=32, faults=frozenset(faults))


def payload(i: int, max_tokens: int = 200, stream: bool = True) -> dict:
    text = " ".join(f"file{i}_{j}.py" for j in range(40))
    return {
        "model": "dsv4-mini",
        "messages": [{"role": "user", "content": f"Read {text}"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def kill_storm(served: ServedPD, n: int, ready: Callable[[], bool]) -> None:
    """`n` streamed requests at once; when `ready()`, every client disconnects."""

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as client:

            async def one(i: int) -> None:
                async with client.stream("POST", f"{served.api}/chat/completions", json=payload(i)) as r:
                    async for _ in r.aiter_lines():
                        pass

            tasks = [asyncio.create_task(one(i)) for i in range(n)]
            deadline = time.monotonic() + 30
            while not ready():
                assert time.monotonic() < deadline, "the storm never reached the queues it aims at"
                assert not all(t.done() for t in tasks), [t.exception() for t in tasks]
                await asyncio.sleep(0.005)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def in_transfer(served: ServedPD) -> bool:
    return (
        served.pd.prefill.stats.num_prefill_inflight_queue >= 1
        and served.pd.decode.stats.num_decode_transfer_queue >= 3
    )


def chat_ok(served: ServedPD, timeout: float = 30) -> bool:
    try:
        return (
            httpx.post(f"{served.api}/chat/completions", json=payload(99, 4, False), timeout=timeout).status_code == 200
        )
    except httpx.TimeoutException:
        return False


def test_the_clean_engine_drains_to_zero_everywhere():
    s = serve()
    try:
        kill_storm(s, 12, lambda: in_transfer(s))
        wait_until(lambda: s.pd.prefill.stats.in_flight == 0 and s.pd.decode.stats.in_flight == 0, what="the drain")
        for name in ("router", "prefill", "decode"):  # every queue gauge the wedge check reads
            assert not any(v for k, v in s.metrics(name).items() if is_queue_gauge(k)), name
        assert s.pd.prefill.stats.leaked_pages == 0 and s.pd.decode.stats.pages_used == 0
        assert s.gauge("decode", "sglang:num_aborted_requests_total") == 12
        assert chat_ok(s) and httpx.get(f"{s.router}/health", timeout=10).status_code == 200
    finally:
        s.stop()


def test_abort_leak_leaves_aborted_transfers_stuck_in_the_transfer_queue():
    s = serve("abort-leak")
    try:
        kill_storm(s, 12, lambda: in_transfer(s))
        time.sleep(1.0)
        # Stuck where the leak is: the decode half. Its prefill half hears the client leave on a
        # connection of its own, so its copy may or may not have been let go by then.
        stuck = {"decode": s.gauge("decode", TRANSFER_Q), "prefill": s.gauge("prefill", INFLIGHT_Q)}
        assert stuck["decode"] >= 3, stuck
        assert s.pd.decode.stats.pages_used > 0  # their reserved pages leak with them
        assert chat_ok(s)  # the engine still serves: the wedge is in the gauges and the pages
        time.sleep(0.5)
        assert {"decode": s.gauge("decode", TRANSFER_Q), "prefill": s.gauge("prefill", INFLIGHT_Q)} == stuck
        assert httpx.get(f"{s.router}/health", timeout=10).status_code == 200
    finally:
        s.stop()


@pytest.mark.parametrize("lies", [False, True], ids=["honest-health", "health-lies"])
def test_bootstrap_stall_hangs_later_requests_in_the_transfer_queue(lies):
    s = serve("bootstrap-stall", *(["health-lies"] if lies else []))
    try:
        assert chat_ok(s)  # healthy until a client leaves while its answer streams
        kill_storm(s, 8, lambda: s.pd.decode.stats.num_running >= 2)
        wait_until(lambda: not s.pd.bootstrap.alive(), what="the bootstrap worker to die")
        assert isinstance(s.pd.bootstrap.error, UnexpectedAbort)
        answered: list[bool] = []
        later = threading.Thread(target=lambda: answered.append(chat_ok(s, timeout=3)))
        later.start()  # a later request hangs in the decode half's transfer queue ...
        wait_until(lambda: s.gauge("decode", TRANSFER_Q) >= 1, what="the later request to hang in the transfer queue")
        later.join()
        assert answered == [False]
        # ... and when its client gives up, the decode half never applies the abort
        assert s.gauge("decode", TRANSFER_Q) >= 1
        assert s.pd.prefill.alive() and s.pd.decode.alive()  # the loops still turn
        assert httpx.get(f"{s.router}/health", timeout=10).status_code == (200 if lies else 503)
        assert httpx.get(f"{s.prefill}/health", timeout=10).status_code == (200 if lies else 503)
    finally:
        s.stop()
