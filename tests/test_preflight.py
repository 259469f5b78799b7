"""The preflight on a server's own /metrics: found or not, whose names, which role."""

from __future__ import annotations

import json

import pytest

from dsv4bench.preflight import server_facts
from tests.fixtures.metrics import page, serving

MODELS = json.dumps({"data": [{"id": "m"}]})


@pytest.mark.parametrize("fixture,dialect,role", [
    ("sglang_pd_decode", {"name": "sglang", "generation": "bootstrap"}, "decode"),
    ("sglang_old_names", {"name": "sglang", "generation": "prealloc"}, "unknown"),
    ("vllm_nixl", {"name": "vllm", "generation": "v1"}, "unified"),
    ("sglang_router_smg", {"name": "sglang-router", "generation": "smg"}, "router"),
])
def test_the_servers_metrics_are_found_with_their_dialect(fixture, dialect, role):
    with serving({"/v1/models": MODELS, "/metrics": page(fixture)}) as root:
        facts = server_facts(f"{root}/v1")
    assert facts["metrics_url"] == f"{root}/metrics"
    assert facts["metrics_dialect"] == dialect and facts["role"] == role


def test_an_older_routers_metrics_are_found_too():
    old = '# TYPE sgl_router_requests_total counter\nsgl_router_requests_total{route="/generate"} 3\n'
    with serving({"/v1/models": MODELS, "/metrics": old}) as root:
        facts = server_facts(f"{root}/v1")
    assert facts["metrics_dialect"] == {"name": "sglang-router", "generation": "sgl_router"}
    assert facts["role"] == "router"


def test_a_page_of_no_servers_metrics_is_not_taken():
    other = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 4.0\n"
    with serving({"/v1/models": MODELS, "/metrics": other}) as root:
        facts = server_facts(f"{root}/v1")
    assert "metrics_url" not in facts and "metrics_dialect" not in facts
