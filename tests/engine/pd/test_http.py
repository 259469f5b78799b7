"""The three servers' own endpoints: /metrics with the engine_type label and the PD gauges as
the harness reads them, /health of each server, /get_server_info, /abort_request."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from dsv4bench.engine.metrics import ServerMetrics
from dsv4bench.engine.pd.bootstrap import Room, RoomState, UnexpectedAbort
from dsv4bench.engine.pd.transfer import KVTransfer
from dsv4bench.engine.request import HEALTH_PROBE_PREFIX
from dsv4bench.engine.server import ServerConfig
from dsv4bench.servers.monitor import QUEUE_GAUGES, parse_metrics
from dsv4bench.servers.wedge import is_queue_gauge

from .helpers import ListSink, ServedPD, build_tiny, greedy, prompt, wait_until

PROBE_TIMEOUT_S = 1.0
PD_GAUGES = {
    "prefill": ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs"),
    "decode": ("sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs"),
}


@pytest.fixture(scope="module")
def served() -> Iterator[ServedPD]:
    s = ServedPD()
    yield s
    s.stop()


def chat(served: ServedPD, max_tokens: int = 4) -> dict:
    r = httpx.post(
        f"{served.api}/chat/completions",
        timeout=30,
        json={"model": "dsv4-mini", "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens},
    )
    assert r.status_code == 200
    return r.json()


def test_each_server_exports_sglang_gauges_under_its_engine_type(served):
    chat(served)
    wait_until(lambda: served.pd.prefill.stats.in_flight == served.pd.decode.stats.in_flight == 0, what="the end")
    for name in ("router", "prefill", "decode"):
        values = served.metrics(name)
        queues = {k: v for k, v in values.items() if is_queue_gauge(k)}
        # every SGLang queue gauge, labelled with this server's engine_type, read by the wedge check
        assert {k.split("{")[0] for k in queues} == {g for g in QUEUE_GAUGES if g.startswith("sglang:")}
        assert all(f'engine_type="{name}"' in k for k in values if k.startswith("sglang:"))
        assert all(v == 0 for v in queues.values()), queues
    assert served.gauge("router", "sglang:num_requests_total") >= 1
    assert served.gauge("prefill", "sglang:num_requests_total") >= 1
    assert served.gauge("prefill", "sglang:prompt_tokens_total") > 0
    assert served.gauge("decode", "sglang:generation_tokens_total") >= 4


def test_the_pd_gauges_count_requests_in_their_queues():
    stalled = build_tiny()  # engine threads not started: requests stay where they are put
    for i in range(3):
        stalled.dispatch(f"r{i}", prompt(40, seed=i), greedy(4), ListSink())
    stalled.dispatch(f"{HEALTH_PROBE_PREFIX}1", prompt(40, seed=9), greedy(1), ListSink())
    stalled.prefill.run_once(block=False)
    stalled.decode.run_once(block=False)
    # all four are in both queues; the health probe is left out of the gauges and counters
    assert len(stalled.prefill.bootstrap_queue) == len(stalled.decode.transfer_queue) == 4

    def gauge(engine_type: str, metric: str) -> float:
        engine = getattr(stalled, engine_type)
        text = ServerMetrics(lambda: engine.stats, "dsv4-mini", engine_type, stalled.cfg.page_size).render()
        return parse_metrics(text.decode() if isinstance(text, bytes) else text)[
            f'{metric}{{engine_type="{engine_type}",model_name="dsv4-mini"}}'
        ]

    assert gauge("prefill", PD_GAUGES["prefill"][0]) == 3
    assert gauge("decode", PD_GAUGES["decode"][1]) == 3
    assert gauge("decode", "sglang:num_requests_total") == 3
    assert gauge("decode", "sglang:token_usage") > 0


def test_health_of_every_server_and_server_info(served):
    for url in (served.router, served.prefill, served.decode):
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{url}/health_generate", timeout=10).status_code == 200
    info = httpx.get(f"{served.prefill}/get_server_info", timeout=5).json()
    assert info["disaggregation_mode"] == "prefill" and info["pd"] is True and info["page_size"] == 16
    assert info["disaggregation_bootstrap_port"] == served.halves["prefill"].bootstrap_port
    assert "disaggregation_bootstrap_port" not in httpx.get(f"{served.decode}/get_server_info", timeout=5).json()
    assert httpx.get(f"{served.router}/get_server_info", timeout=5).json()["engine_type"] == "router"


def test_a_halfs_health_is_a_generation_through_that_half_alone_that_leaves_nothing_behind(served):
    """SGLang's fake bootstrap: the prefill computes the probe's prompt and its KV goes nowhere;
    the decode takes the KV as arrived and runs one decode step. No room, page or count is left."""
    prefill, decode = served.halves["prefill"].engine, served.halves["decode"].engine
    ran: dict[str, list[str]] = {"prefill": [], "decode": []}
    for role, engine in (("prefill", prefill), ("decode", decode)):

        def spy(outputs, role=role, original=engine.postprocess):
            ran[role].extend(outputs)
            original(outputs)

        engine.postprocess = spy
    counts = {role: dict(e.counts) for role, e in (("prefill", prefill), ("decode", decode))}
    try:
        for url in (served.prefill, served.decode):
            assert httpx.get(f"{url}/health_generate", timeout=10).status_code == 200
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        del prefill.postprocess, decode.postprocess
    assert len(ran["prefill"]) == 2 and all(r.startswith(HEALTH_PROBE_PREFIX) for r in ran["prefill"])
    assert len(ran["decode"]) == 2 and all(r.startswith(HEALTH_PROBE_PREFIX) for r in ran["decode"])
    wait_until(
        lambda: not served.pd.bootstrap.rooms and not prefill.rids() and not decode.rids(), what="the probes to leave"
    )
    assert not served.halves["decode"].parts[0]._channels  # the decode's bootstrap client
    assert prefill.allocator.num_free + prefill.cache.num_cached_pages == prefill.allocator.num_pages
    assert decode.allocator.num_free == decode.allocator.num_pages
    assert {role: dict(e.counts) for role, e in (("prefill", prefill), ("decode", decode))} == counts


def test_worker_abort_request_answers_and_refuses_bad_bodies(served):
    for url in (served.prefill, served.decode):
        assert httpx.post(f"{url}/abort_request", json={"rid": "nope"}, timeout=5).json() == {
            "rid": "nope",
            "aborted": False,
        }
        assert httpx.post(f"{url}/abort_request", json={"abort_all": True}, timeout=5).json() == {"aborted": []}
        bad = httpx.post(f"{url}/abort_request", json=["x"], timeout=5)
        assert bad.status_code == 400 and bad.json()["error"]["message"]
        assert httpx.post(f"{url}/abort_request", content=b"{", timeout=5).status_code == 400


@pytest.mark.parametrize("lies", [False, True], ids=["honest", "health-lies"])
def test_a_dead_bootstrap_worker_fails_health_unless_it_lies(lies):
    faults = {"bootstrap-stall", "health-lies"} if lies else {"bootstrap-stall"}
    s = ServedPD(
        health_timeout_s=1.0,
        server_cfg=ServerConfig(health_generate_timeout_s=PROBE_TIMEOUT_S),
        faults=frozenset(faults),
    )
    try:
        assert httpx.get(f"{s.router}/health", timeout=10).status_code == 200
        room = Room("x")  # a request that reaches decoding, then an ABORT the worker does not expect
        s.pd.bootstrap.open(room)
        s.pd.bootstrap.prealloc("x", KVTransfer("x", []))
        s.pd.bootstrap.decoding("x")
        wait_until(lambda: room.state is RoomState.DECODING, what="the handshake")
        s.pd.bootstrap.abort("x")
        wait_until(lambda: not s.pd.bootstrap.alive(), what="the worker to die")
        assert isinstance(s.pd.bootstrap.error, UnexpectedAbort)
        expected = 200 if lies else 503
        assert httpx.get(f"{s.router}/health", timeout=10).status_code == expected  # the probe cannot bootstrap
        assert httpx.get(f"{s.prefill}/health", timeout=10).status_code == expected
        # /health_generate tells the truth either way: at once from the dead thread, or, with
        # the lie, from its probe, which waits at the dead worker as every request does
        started = time.monotonic()
        assert httpx.get(f"{s.prefill}/health_generate", timeout=10).status_code == 503
        assert (time.monotonic() - started >= PROBE_TIMEOUT_S) == lies
        assert httpx.get(f"{s.decode}/health", timeout=10).status_code == 200  # it needs no bootstrap worker
    finally:
        s.stop()
