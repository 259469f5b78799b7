"""Role discovery: what SGLang, its router, vLLM and the bundled engine say of themselves."""

from __future__ import annotations

import anyio
import httpx
import pytest

from dsv4bench.servers.dialect import QUEUE_GAUGES
from dsv4bench.servers.roles import (
    DECODE,
    GAUGE_LABELS,
    GAUGE_WORDS,
    PREFILL,
    ROLE_GAUGES,
    ROUTER,
    UNIFIED,
    UNKNOWN,
    Role,
    discover_role,
    part_labels,
    role_from_metrics,
    role_from_server_info,
    role_of,
    series_labels,
)


@pytest.mark.parametrize(
    "info,role",
    [
        ({"disaggregation_mode": "null", "tp_size": 8}, UNIFIED),  # SGLang, not disaggregated
        ({"disaggregation_mode": "prefill"}, PREFILL),
        ({"disaggregation_mode": "decode"}, DECODE),
        ({"engine_type": "router", "served_model_name": "dsv4-mini"}, ROUTER),  # the bundled PD router
        ({"engine_type": "unified"}, UNIFIED),  # the bundled engine
        ({"engine_type": "decode", "disaggregation_mode": "decode"}, DECODE),  # a bundled PD worker
        ({"disaggregation_mode": None}, UNIFIED),
        ({"model_path": "m"}, None),
        ([], None),
        (None, None),
    ],
)
def test_role_from_server_info(info, role):
    found = role_from_server_info(info)
    assert (found.name if found else None) == role


def test_role_from_metrics():
    def series(engine_type: str) -> dict[str, float]:
        return {f'sglang:num_running_reqs{{engine_type="{engine_type}",model_name="m",tp_rank="0"}}': 0.0}

    assert role_from_metrics(series("prefill")) == Role(PREFILL, "/metrics engine_type label")
    assert role_from_metrics(series("unified")).name == UNIFIED
    assert role_from_metrics({'smg_http_requests_total{method="POST",path="/v1/chat"}': 3.0}).name == ROUTER
    assert role_from_metrics({'sgl_router_requests_total{route="/generate"}': 1.0}).name == ROUTER
    assert role_from_metrics({'vllm:num_requests_running{model_name="m"}': 0.0}).name == UNIFIED
    assert role_from_metrics({'sglang:num_running_reqs{model_name="m"}': 0.0}) is None  # no engine_type label
    assert role_from_metrics({}) is None


def test_a_router_is_a_router_whatever_it_passes_on_from_its_workers():
    smg = {"smg_http_requests_total": 1.0}
    assert role_of({"disaggregation_mode": "prefill"}, smg, None).name == ROUTER
    assert role_of({"disaggregation_mode": "prefill"}, {}, {"workers": [{"url": "http://p:30000"}]}).name == ROUTER
    assert role_of(None, None, None) == Role(UNKNOWN, "not reported")
    assert not role_of(None, None, None).known and role_of(None, smg, None).serves_requests


def test_every_role_has_its_own_gauges_in_request_order():
    assert set(ROLE_GAUGES[UNKNOWN]) == set(QUEUE_GAUGES)
    assert "sglang:num_decode_transfer_queue_reqs" not in ROLE_GAUGES[ROUTER] + ROLE_GAUGES[PREFILL]
    assert ROLE_GAUGES[PREFILL][0] == "sglang:num_prefill_bootstrap_queue_reqs"
    assert ROLE_GAUGES[DECODE][:2] == ("sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs")
    assert set(QUEUE_GAUGES) <= set(GAUGE_LABELS) and set(QUEUE_GAUGES) <= set(GAUGE_WORDS)


def test_labels():
    key = 'sglang:num_queue_reqs{dp_rank="3",engine_type="decode",model_name="a \\"b\\""}'
    assert series_labels(key) == {"dp_rank": "3", "engine_type": "decode", "model_name": 'a \\"b\\"'}
    assert part_labels(key) == "dp_rank=3"
    assert part_labels('sglang:num_queue_reqs{engine_type="decode",model_name="m"}') == ""
    assert series_labels("sglang:num_queue_reqs") == {}


def _discover(routes: dict[str, httpx.Response]) -> Role:
    def handler(request: httpx.Request) -> httpx.Response:
        return routes.get(request.url.path, httpx.Response(404, text="Not Found"))

    async def main() -> Role:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await discover_role(client, "http://s:1/", timeout=1.0)

    return anyio.run(main)


def test_discover_role_asks_the_server():
    metrics = '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{engine_type="decode",model_name="m"} 0\n'
    assert _discover({"/get_server_info": httpx.Response(200, json={"disaggregation_mode": "prefill"})}).name == PREFILL
    assert _discover({"/metrics": httpx.Response(200, text=metrics)}) == Role(DECODE, "/metrics engine_type label")
    assert _discover({"/workers": httpx.Response(200, json={"workers": [], "total": 0})}).name == ROUTER
    # Broken answers only mean "not stated".
    assert (
        _discover(
            {
                "/get_server_info": httpx.Response(200, text="<html>"),
                "/metrics": httpx.Response(200, text="{{{ not prometheus"),
            }
        ).name
        == UNKNOWN
    )
    assert _discover({}).name == UNKNOWN


def test_sglangs_router_answers_server_info_for_itself():
    info = {"router_manager": True, "routers_count": 1, "workers_count": 2}  # sglang-router 0.3.2
    assert role_from_server_info(info) == Role(ROUTER, "/get_server_info router_manager")
