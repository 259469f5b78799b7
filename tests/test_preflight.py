"""The preflight on a server's own /metrics: found or not, whose names, which role."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest

from dsv4bench.servers.preflight import ServerError, server_facts
from tests.fixtures.metrics import answering, page, serving

MODELS = json.dumps({"data": [{"id": "m"}]})


@pytest.mark.parametrize(
    "fixture,dialect,role",
    [
        ("sglang_pd_decode", {"name": "sglang", "generation": "bootstrap"}, "decode"),
        ("sglang_old_names", {"name": "sglang", "generation": "prealloc"}, "unknown"),
        ("vllm_nixl", {"name": "vllm", "generation": "v1"}, "unified"),
        ("sglang_router_smg", {"name": "sglang-router", "generation": "smg"}, "router"),
    ],
)
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


def test_a_redirect_of_the_model_list_says_where_it_points():
    def moved(h: BaseHTTPRequestHandler) -> None:
        h.send_response(308)
        h.send_header("Location", "https://gateway.example/v1/models")
        h.end_headers()

    with answering(moved) as root, pytest.raises(ServerError, match="HTTP 308, a redirect to 'https://gateway.example"):
        server_facts(f"{root}/v1", timeout=5)


@pytest.mark.parametrize("charset", ["zlib", "rot13", "utf-16"])  # codecs that cannot read this text
def test_a_metrics_page_in_a_charset_no_text_is_in_is_read_as_utf8(charset):
    def page(h: BaseHTTPRequestHandler) -> None:
        body = MODELS if h.path == "/v1/models" else "sglang:num_running_reqs 1\n"
        h.send_response(200)
        h.send_header("Content-Type", f"text/plain; charset={charset}")
        h.end_headers()
        h.wfile.write(body.encode())

    with answering(page) as root:
        facts = server_facts(f"{root}/v1", timeout=5)
    assert facts["metrics_url"] == f"{root}/metrics" and facts["metrics_dialect"]["name"] == "sglang"


def test_server_info_numbers_json_cannot_hold_are_kept_as_null():
    def page(h: BaseHTTPRequestHandler) -> None:
        body = {
            "/v1/models": MODELS,
            "/get_server_info": '{"mem_fraction_static": NaN, "max_total_num_tokens": 1e999,'
            ' "tp_size": 8, "served_model_name": "dsv4\\ud800"}',
        }
        h.send_response(200 if h.path in body else 404)
        h.end_headers()
        h.wfile.write(body.get(h.path, "").encode())

    with answering(page) as root:
        facts = server_facts(f"{root}/v1", timeout=5)
    assert facts["server_info"] == {
        "mem_fraction_static": None,
        "max_total_num_tokens": None,
        "tp_size": 8,
        "served_model_name": "dsv4\ufffd",
    }
    json.dumps(facts, allow_nan=False)  # what run.json writes is JSON to any reader
