"""Deployment discovery on what real servers answered (tests/fixtures/discovery/README.md says
where each answer comes from), and on garbage: a server that answers badly is one that did not
answer, never a crash."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from dsv4bench.servers import discovery
from dsv4bench.servers.discovery import (
    NOT_REPORTED,
    Answer,
    Deployment,
    Endpoint,
    ListedWorker,
    RootAnswers,
    discover,
    endpoint_of,
    json_of,
    listed_workers,
    metrics_of,
    normalize_root,
    settings_of,
    settings_phrase,
    show_setting,
)
from dsv4bench.servers.roles import DECODE, PREFILL, ROUTER, UNIFIED, UNKNOWN

FIXTURES = Path(__file__).parent / "fixtures"


def answer(name: str) -> object:
    return json.loads((FIXTURES / "discovery" / name).read_text())


def prom(name: str) -> str:
    return (FIXTURES / "metrics" / name).read_text()


# --- worker lists -------------------------------------------------------------------------------


def test_sglang_routers_pd_worker_list():
    workers = listed_workers(answer("sglang_router_pd_workers.json"))
    by_kind = {w.kind: w for w in workers}
    assert set(by_kind) == {"prefill", "decode"}
    assert by_kind["prefill"].bootstrap_port == 46687 and by_kind["decode"].bootstrap_port is None
    assert all(w.healthy is True and w.url.startswith("http://127.0.0.1:") for w in workers)


def test_sglang_routers_regular_list_and_the_bundled_routers():
    [regular] = listed_workers(answer("sglang_router_regular_workers.json"))
    assert regular.kind == "regular"
    bundled = listed_workers(answer("bundled_router_workers.json"))
    assert [(w.kind, w.bootstrap_port is not None) for w in bundled] == [("prefill", True), ("decode", False)]


def test_older_router_shapes_and_dp_ranks():
    payload = {
        "workers": [
            {"url": "http://p:30000", "worker_type": "prefill(bootstrap:8998)"},
            {"url": "http://p2:30000/", "worker_type": {"Prefill": {"bootstrap_port": 9000}}},
            {"url": "http://d:30002@0", "worker_type": "Decode"},
            {"url": "http://d:30002@1", "worker_type": "Decode"},  # one server, listed per DP rank
        ]
    }
    assert listed_workers(payload) == [
        ListedWorker("http://p:30000", "prefill", 8998),
        ListedWorker("http://p2:30000", "prefill", 9000),
        ListedWorker("http://d:30002", "decode"),
    ]
    assert listed_workers({"urls": ["http://a:1", "http://b:2"]}) == [
        ListedWorker("http://a:1", "unknown"),
        ListedWorker("http://b:2", "unknown"),
    ]


@pytest.mark.parametrize("payload", ["<html>", 5, None, {"workers": "all"}, {"error": "no"}])
def test_no_worker_list(payload):
    assert listed_workers(payload) is None


def test_garbage_entries_are_left_out_and_a_long_list_is_cut():
    payload = {
        "workers": [
            None,
            7,
            {"url": 5},
            {"url": "grpc://w:50051"},
            {"url": "not a url"},
            {"url": "http://h:notaport"},
            {"url": "http://ok:1", "worker_type": [1], "bootstrap_port": "8998", "is_healthy": "yes"},
        ]
    }
    assert listed_workers(payload) == [ListedWorker("http://ok:1", "unknown")]
    many = {"workers": [{"url": f"http://w{i}:1"} for i in range(1000)]}
    assert len(listed_workers(many)) == discovery.MAX_WORKERS
    assert normalize_root("https://h:8000/") == "https://h:8000" and normalize_root("ftp://h") is None


# --- settings -----------------------------------------------------------------------------------


def test_a_sglang_pd_workers_settings_under_server_args_names():
    prefill = settings_of(answer("sglang_pd_prefill_server_info.json"))
    assert prefill == {
        "version": "0.5.23",
        "disaggregation_mode": "prefill",
        "disaggregation_transfer_backend": "mooncake",
        "disaggregation_bootstrap_port": 8998,
        "disable_overlap_schedule": False,
        "enable_hierarchical_cache": False,
        "hicache_write_policy": "write_through",
        "tool_call_parser": "deepseekv4",
        "reasoning_parser": "deepseek-v4",
        "max_running_requests": 256,
        "tp_size": 8,
        "dp_size": 8,
        "page_size": 64,
        "chunked_prefill_size": 8192,
    }
    decode = endpoint_of("http://d:30002", RootAnswers(info=answer("sglang_pd_decode_server_info.json")))
    assert decode.role == DECODE
    phrase = settings_phrase(decode)
    assert "overlap schedule off" in phrase and "HiCache on" in phrase and "HiCache write write_back" in phrase
    assert "chunked prefill none" in phrase and "bootstrap port" not in phrase  # the decode's names no port of its own
    assert "not reported" not in phrase


def test_the_bundled_servers_report_sglangs_names():
    prefill = endpoint_of(
        "http://p:1",
        RootAnswers(info=answer("bundled_prefill_server_info.json")),
        ListedWorker("http://p:1", "prefill", 46713, True),
    )
    shown = dict(prefill.shown_settings())
    assert shown["disaggregation_transfer_backend"] == "tcp" and shown["disable_overlap_schedule"] is True
    assert shown["hicache_write_policy"] == "write_back" and shown["tool_call_parser"] == "deepseek-recipe"
    assert shown["disaggregation_bootstrap_port"] == "46713 (router's list)"  # the half does not state it
    router = endpoint_of(
        "http://r:1",
        RootAnswers(info=answer("bundled_router_server_info.json"), workers=answer("bundled_router_workers.json")),
    )
    assert router.role == ROUTER and router.settings["disaggregation_bootstrap_port"] == 46713


def test_missing_settings_are_not_reported_never_defaults():
    ep = endpoint_of(
        "http://p:1",
        RootAnswers(
            info={
                "disaggregation_mode": "prefill",
                "tp_size": [8],
                "tool_call_parser": {"name": "x"},
                "reasoning_parser": None,
            }
        ),
    )
    shown = dict(ep.shown_settings())
    assert shown["disaggregation_transfer_backend"] == NOT_REPORTED and shown["version"] == NOT_REPORTED
    assert shown["tool_call_parser"] == NOT_REPORTED  # a value of the wrong type is no report
    assert shown["reasoning_parser"] is None and show_setting("reasoning_parser", None) == "none"
    assert "tp_size" not in shown  # shown only where reported
    assert settings_phrase(ep).startswith("PD prefill · reasoning parser none; not reported: version, transfer")
    assert show_setting("disable_overlap_schedule", False) == "on"


def test_a_router_speaking_with_a_workers_voice_is_not_given_its_settings():
    ep = endpoint_of(
        "http://r:1",
        RootAnswers(info=answer("sglang_pd_prefill_server_info.json"), workers=answer("sglang_router_pd_workers.json")),
    )
    assert ep.role == ROUTER and ep.settings == {}
    assert any("passed on by the router" in p for p in ep.problems)
    ep = endpoint_of("http://r:1", RootAnswers(info=answer("sglang_router_server_info.json")))
    assert (ep.role, ep.role_source) == (ROUTER, "/get_server_info router_manager") and ep.settings == {}
    assert settings_phrase(ep) == "none reported"


def test_the_routers_list_gives_a_role_only_where_the_server_states_none():
    silent = endpoint_of(
        "http://d:1",
        RootAnswers(problems=["/get_server_info: no answer in 5 s"]),
        ListedWorker("http://d:1", "decode", None, False),
    )
    assert (silent.role, silent.role_source) == (DECODE, "the router's /workers worker_type")
    assert not silent.answered and silent.listed_healthy is False and silent.shown_settings() == []
    loud = endpoint_of(
        "http://d:1", RootAnswers(info={"disaggregation_mode": "prefill"}), ListedWorker("http://d:1", "decode")
    )
    assert loud.role == PREFILL and any("lists it as decode" in p for p in loud.problems)


# --- answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "got,problem",
    [
        (Answer(200, b"<!DOCTYPE html><html><body>hi</body></html>"), "HTML, not JSON"),
        (Answer(200, b"OK"), "not JSON"),
        (Answer(200, b"[" * 100_000), "not JSON"),
        (Answer(404, b""), "HTTP 404"),
        (Answer(error="could not connect"), "could not connect"),
    ],
)
def test_json_answers_that_are_none(got, problem):
    assert json_of(got) == (None, problem)


def test_metrics_answers():
    values, problem = metrics_of(Answer(200, prom("sglang_pd_prefill.prom").encode()))
    assert problem is None and any(k.startswith("sglang:num_prefill_bootstrap_queue_reqs") for k in values)
    html = b"<!DOCTYPE html><html><body>sglang:num_running_reqs</body></html>"
    assert metrics_of(Answer(200, html)) == (None, "not Prometheus text")
    assert metrics_of(Answer(200, b"# nothing of ours\nup 1\n")) == (None, "no SGLang, vLLM or router metrics in it")


# --- asking, through a mock transport -----------------------------------------------------------


def serve(routes: dict[str, object]) -> httpx.MockTransport:
    """GET URL -> a JSON-able body, a str (text), an int (status), or a callable(request)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        route = routes.get(str(request.url), 404)
        if callable(route):
            return await route(request)
        if isinstance(route, int):
            return httpx.Response(route)
        if isinstance(route, str):
            return httpx.Response(200, text=route)
        return httpx.Response(200, json=route)

    return httpx.MockTransport(handler)


def run_discover(routes: dict[str, object], roots: list[str], timeout: float = 1.0) -> Deployment:
    async def main() -> Deployment:
        async with httpx.AsyncClient(transport=serve(routes)) as client:
            return await discover(roots, client, timeout=timeout)

    return anyio.run(main)


R, P, D = "http://10.0.0.1:8000", "http://10.0.0.2:30000", "http://10.0.0.3:30002"
SGLANG_PD = {
    f"{R}/get_server_info": answer("sglang_router_server_info.json"),
    f"{R}/workers": {
        "workers": [
            {"url": D, "worker_type": "decode", "is_healthy": True},
            {"url": P, "worker_type": "prefill", "bootstrap_port": 8998, "is_healthy": True},
        ]
    },
    f"{P}/get_server_info": answer("sglang_pd_prefill_server_info.json"),
    f"{P}/metrics": prom("sglang_pd_prefill.prom"),
    f"{D}/get_server_info": 404,
    f"{D}/server_info": answer("sglang_pd_decode_server_info.json"),
    f"{D}/metrics": prom("sglang_pd_decode.prom"),
}


def test_one_router_url_finds_its_prefill_and_decode():
    dep = run_discover(SGLANG_PD, [R + "/"])
    assert [(e.root, e.role) for e in dep.endpoints] == [(R, ROUTER), (P, PREFILL), (D, DECODE)]
    assert dep.found_via == [R] and dep.metrics_urls == [f"{P}/metrics", f"{D}/metrics"]
    router, prefill, decode = dep.endpoints
    assert router.metrics_url is None and any("--prometheus-port" in p for p in router.problems)
    assert prefill.settings["disaggregation_transfer_backend"] == "mooncake" and prefill.listed_as == "prefill"
    assert decode.settings["enable_hierarchical_cache"] is True  # read from /server_info
    assert decode.metrics_dialect == {"name": "sglang", "generation": "bootstrap"}
    again = Deployment.from_dict(json.loads(json.dumps(dep.as_dict())))
    assert again == dep and again.roles()[P].name == PREFILL


def test_a_worker_url_alone_is_one_server():
    dep = run_discover(SGLANG_PD, [P])
    assert [(e.root, e.role) for e in dep.endpoints] == [(P, PREFILL)] and dep.found_via == []


def test_servers_that_answer_garbage_are_not_answering_and_nothing_raises(monkeypatch):
    monkeypatch.setattr(discovery, "MAX_JSON_BYTES", 1000)
    html = "<!DOCTYPE html><html><body>Welcome to nginx</body></html>"
    workers = [f"http://10.0.1.{i}:1" for i in range(6)]

    async def hang(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(30)
        raise AssertionError("not reached")

    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    routes: dict[str, object] = {f"{R}/workers": {"workers": [{"url": w, "worker_type": "decode"} for w in workers]}}
    for i, kind in enumerate((html, hang, refuse, {"x": "y" * 5000}, [1, 2, 3], "sglang:num_running_reqs 1 2 3 x")):
        for path in ("/get_server_info", "/server_info", "/metrics"):
            routes[workers[i] + path] = kind
    dep = run_discover(routes, [R], timeout=0.3)
    assert [e.role for e in dep.endpoints] == [ROUTER] + [DECODE] * 6  # as the router lists them
    found = {e.root: e for e in dep.endpoints}
    assert all(not found[w].answered and found[w].metrics_url is None for w in workers)
    assert "/get_server_info: HTML, not JSON" in found[workers[0]].problems
    assert "/get_server_info: no answer in 0.3 s" in found[workers[1]].problems
    assert "/metrics: could not connect" in found[workers[2]].problems
    assert "/get_server_info: answer over 0 MiB" in found[workers[3]].problems
    assert "/get_server_info: not a JSON object" in found[workers[4]].problems
    assert any(line.strip().startswith("/get_server_info") for line in dep.describe())


def test_a_record_that_is_no_deployment():
    assert Deployment.from_dict(None) is None and Deployment.from_dict({"endpoints": "x"}) is None
    dep = Deployment.from_dict(
        {
            "given": [1, R],
            "endpoints": [5, {"root": R, "role": "king", "settings": [1], "problems": "x", "answered": "yes"}],
        }
    )
    assert dep is not None and dep.given == [R]
    assert dep.endpoints == [Endpoint(R, role=UNKNOWN)]
    assert UNIFIED != UNKNOWN
