"""The abort soak's judgement, on recorded /metrics pages: what a drained deployment must not
show (queue gauges, the router's open requests, pages in use after /flush_cache), what the kill
caught per half and stage, and which page is whose."""

from __future__ import annotations

from collections import Counter

import pytest

from dsv4bench.servers.monitor import parse_metrics
from tests.fixtures.metrics import page
from tests.scripts.script_loader import load_script

soak = load_script("abort_soak")

LABELS = 'engine_type="{role}",model_name="dsv4-mini"'
GAUGES = (
    "num_running_reqs",
    "num_queue_reqs",
    "num_prefill_bootstrap_queue_reqs",
    "num_prefill_inflight_queue_reqs",
    "num_decode_prealloc_queue_reqs",
    "num_decode_transfer_queue_reqs",
    "num_decode_host_receive_queue_reqs",
    "num_decode_deferred_kv_release_reqs",
    "num_used_tokens",
)


def bundled(role: str, **values: float) -> dict[str, float]:
    """A bundled server's /metrics page (every PD gauge, as each half exposes them), parsed."""
    lines = []
    for g in GAUGES:
        lines += [f"# TYPE sglang:{g} gauge", f"sglang:{g}{{{LABELS.format(role=role)}}} {values.get(g, 0.0)}"]
    lines += ["# TYPE sglang:num_requests counter", f"sglang:num_requests_total{{{LABELS.format(role=role)}}} 120.0"]
    return parse_metrics("\n".join(lines) + "\n")


SGLANG_ROUTER_IDLE = parse_metrics("""\
# TYPE smg_worker_requests_active gauge
smg_worker_requests_active{worker="http://127.0.0.1:48145"} 0
smg_worker_requests_active{worker="http://127.0.0.1:54889"} 0
# TYPE smg_worker_health gauge
smg_worker_health{worker="http://127.0.0.1:48145"} 1
smg_worker_health{worker="http://127.0.0.1:54889"} 1
# TYPE smg_router_requests_total counter
smg_router_requests_total{backend_type="pd",endpoint="chat",streaming="true"} 6
""")


def test_an_idle_deployment_leaves_nothing_behind():
    for router in (bundled("router"), SGLANG_ROUTER_IDLE):
        scrapes = {"router": router, "prefill": bundled("prefill"), "decode": bundled("decode")}
        assert soak.in_flight(scrapes) == [] and soak.pages_held(scrapes) == []
        assert soak.idle_findings(scrapes, 200, '{"message": "Cache flushed."}') == []


def test_every_queue_and_the_routers_open_requests_are_leftovers():
    scrapes = {
        "router": bundled("router", num_running_reqs=2),
        "prefill": bundled("prefill"),
        "decode": bundled("decode", num_decode_transfer_queue_reqs=7),
    }
    assert soak.in_flight(scrapes) == [
        "router sglang:num_running_reqs=2",
        "decode sglang:num_decode_transfer_queue_reqs=7",
    ]
    # SGLang's router counts per worker: the worker is named
    scrapes["router"] = parse_metrics(page("sglang_router_smg"))
    assert "router smg_worker_requests_active{worker=http://10.0.0.12:30001}=60" in soak.in_flight(scrapes)
    # a real SGLang decode: each rank's total, not the priority classes that add up to it
    found = soak.in_flight({"decode": parse_metrics(page("sglang_pd_decode"))})
    assert "decode sglang:num_decode_transfer_queue_reqs{moe_ep_rank=0,pp_rank=0,tp_rank=0}=12" in found
    assert not any("priority=" in f for f in found)


def test_after_the_flush_a_page_in_use_is_a_leak_and_a_refused_flush_is_reported():
    after = {
        "router": bundled("router"),
        "prefill": bundled("prefill", num_used_tokens=48),
        "decode": bundled("decode"),
    }
    assert soak.idle_findings(after, 200, "{}") == ["prefill sglang:num_used_tokens=48"]
    # the router's own page counts no pages
    after = {
        "router": bundled("router", num_used_tokens=16),
        "prefill": bundled("prefill"),
        "decode": bundled("decode"),
    }
    assert soak.idle_findings(after, 200, "{}") == []
    refused = soak.idle_findings(after, 400, '{"error": "Cache not flushed: requests are running."}\n')
    assert refused == ['prefill /flush_cache answered 400: {"error": "Cache not flushed: requests are running."}']
    # a request that reached a half late shows as in flight, not as a leak
    late = {
        "prefill": bundled("prefill", num_prefill_bootstrap_queue_reqs=1, num_used_tokens=32),
        "decode": bundled("decode"),
    }
    assert soak.idle_findings(late, 200, "{}") == [
        "prefill sglang:num_prefill_bootstrap_queue_reqs=1",
        "prefill sglang:num_used_tokens=32",
    ]


def test_the_kill_is_counted_per_half_in_pipeline_order_from_its_own_gauges():
    scrapes = {
        "prefill": bundled(
            "prefill", num_prefill_bootstrap_queue_reqs=3, num_running_reqs=4, num_decode_transfer_queue_reqs=9
        ),  # not a prefill's gauge: not counted
        "decode": bundled(
            "decode", num_decode_prealloc_queue_reqs=2, num_decode_transfer_queue_reqs=5, num_running_reqs=8
        ),
    }
    caught = soak.caught_at_kill(scrapes)
    assert list(caught) == [
        "prefill bootstrap",
        "prefill waiting",
        "prefill running",
        "prefill inflight",
        "decode prealloc",
        "decode transfer",
        "decode host recv",
        "decode waiting",
        "decode running",
        "decode release",
    ]
    assert {k: v for k, v in caught.items() if v} == {
        "prefill bootstrap": 3,
        "prefill running": 4,
        "decode prealloc": 2,
        "decode transfer": 5,
        "decode running": 8,
    }


def test_each_metrics_page_is_told_apart_by_what_it_exposes():
    pages = {
        "http://h:9/metrics": SGLANG_ROUTER_IDLE,
        "http://h:1/metrics": bundled("prefill"),
        "http://h:2/metrics": bundled("decode"),
    }
    roles = soak.roles_of(pages)
    assert roles == {"router": "http://h:9/metrics", "prefill": "http://h:1/metrics", "decode": "http://h:2/metrics"}
    ep = soak.Endpoints("http://h:8/v1", roles)
    assert ep.router_root == "http://h:8" and ep.prefill_root == "http://h:1"
    assert soak.roles_of({**pages, "http://h:9/metrics": bundled("router")})["router"] == "http://h:9/metrics"
    with pytest.raises(ValueError, match="one router, one prefill and one decode"):
        soak.roles_of({"http://h:1/metrics": bundled("prefill"), "http://h:2/metrics": bundled("decode")})


def test_the_summary_gives_drain_percentiles_and_counts_dirty_storms():
    clean = [
        soak.StormResult(Counter({"decode transfer": 2, "prefill inflight": 0}), 1, s / 1000, []) for s in range(1, 101)
    ]
    dirty = soak.StormResult(Counter({"decode transfer": 3}), 0, None, ["after 10 s: decode x=1"], "halves")
    lines = soak.summary(soak.SoakConfig(clients=4), [*clean, dirty], 12.0, "SGLang 0.3.2")
    text = "\n".join(lines)
    assert lines[0].startswith("abort soak: 101 storms x 4 clients in 12.0 s") and "router SGLang 0.3.2" in lines[0]
    assert "decode transfer 203, prefill inflight 0" in text
    assert "p50 50 ms, p99 99 ms, max 100 ms" in text and "the halves (1 storms)" in text
    assert lines[-1].endswith("pages in use after /flush_cache): 1")
    assert soak.storm_line(100, 101, dirty).endswith("LEFT BEHIND: after 10 s: decode x=1")
    assert soak.storm_line(0, 101, clean[0]).endswith(
        "caught decode transfer 2; 1 finished before the kill; clean in 1 ms"
    )
