"""The HTTP server over a scripted fake engine, on a real uvicorn server on loopback, driven
by the official `openai` client and raw httpx."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.metrics import METRIC_NAMES
from dsv4bench.engine.server import ServerConfig, build_app
from dsv4bench.engine.tokenizer import load_tokenizer

from .fake_engine import FakeEngine
from .pd.helpers import ServerThread
from .test_frontend import TOOLS, USER
from .test_tokenizer import DSML_CALL

MODEL = "dsv4-mini"
TOK = load_tokenizer()


def make_server(api_key: str | None = None) -> tuple[ServerThread, FakeEngine]:
    engine = FakeEngine(TOK.encode("\n\n" + DSML_CALL), TOK.eos_token_id, max_context=4096)
    cfg = ServerConfig(api_key=api_key, model_name=MODEL, max_body_bytes=1 << 20, health_generate_timeout_s=2.0)
    return ServerThread(build_app(engine, Frontend(TOK, MODEL, engine.max_context), cfg)), engine


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ServerThread, FakeEngine]]:
    srv, engine = make_server()
    yield srv, engine
    srv.stop()


@pytest.fixture
def engine(served) -> FakeEngine:
    return served[1]


@pytest.fixture
def url(served) -> str:
    return served[0].url


@pytest.fixture
def client(url) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10) as c:
        yield c


def still_serving(url: str) -> None:
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == MODEL


def test_the_harness_preflight_reads_the_context_length(url, engine):
    from dsv4bench.servers.preflight import server_facts

    facts = server_facts(f"{url}/v1")
    assert facts["models"] == [MODEL] and facts["context_length"] == engine.max_context


def test_streaming_tool_call_with_usage(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=USER, tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
    )
    calls = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []]
    names = [tc.function.name for tc in calls if tc.function.name]
    args = "".join(tc.function.arguments or "" for tc in calls)
    assert names == ["read_file"] and json.loads(args) == {"path": "src/main.py", "start_line": 12}
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1]) and len({c.id for c in chunks}) == 1


def test_non_streaming_tool_call(client, engine):
    resp = client.chat.completions.create(model="any-name-at-all", messages=USER, tools=TOOLS, temperature=0)
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "read_file" and json.loads(call.function.arguments)["start_line"] == 12
    assert resp.choices[0].finish_reason == "tool_calls" and resp.model == "any-name-at-all"
    assert engine.seen[resp.id].outcome == "finished" and engine.seen[resp.id].params.temperature == 0.0


def test_raw_completion_keeps_special_tokens(client, engine):
    with engine.scripted(TOK.encode("ok</think>" + DSML_CALL)):
        raw = client.completions.create(
            model=MODEL, prompt="<｜User｜>hi<｜Assistant｜>", max_tokens=200, extra_body={"skip_special_tokens": False}
        )
        plain = client.completions.create(model=MODEL, prompt="hi", max_tokens=200)
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(
                model=MODEL, prompt="hi", max_tokens=200, stream=True, extra_body={"skip_special_tokens": False}
            )
            if c.choices
        )
    assert raw.choices[0].text == streamed == "ok</think>" + DSML_CALL
    assert "</think>" not in plain.choices[0].text and "｜DSML｜" not in plain.choices[0].text
    assert engine.seen[raw.id].prompt_ids[0] == TOK.special_id("User")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": MODEL, "messages": USER, "max_tokens": -5}, "max_tokens"),
        ({"model": MODEL, "messages": USER, "temperature": "warm"}, "temperature"),
        ({"model": MODEL, "messages": {"role": "user"}}, "messages"),
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": USER, "tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "lorem ipsum " * 4000}]}, "messages"),
        ({"model": MODEL, "messages": USER, "max_tokens": 5000}, "max_tokens"),
    ],
)
def test_malformed_requests_get_400(url, body, param):
    r = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    still_serving(url)


def test_bad_json_unknown_routes_and_big_bodies(url):
    for content in (b"{not json", b"[1, 2]", b""):
        r = httpx.post(f"{url}/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "error" in r.json()
    assert httpx.get(f"{url}/v1/nothing").status_code == 404
    r = httpx.get(f"{url}/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=big).status_code == 413
    still_serving(url)


def test_openai_client_sees_bad_request(client, url):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL,
            messages=USER,
            tools=TOOLS,
            tool_choice="required",
            extra_body={"chat_template_kwargs": {"thinking": True}},
        )
    still_serving(url)


def test_client_disconnect_mid_stream_aborts(url, engine):
    # The engine stalls after the first event: only the disconnect itself can end the request.
    with engine.scripted(engine.script * 50, delay=30):
        with (
            httpx.Client(timeout=5) as h,
            h.stream(
                "POST", f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True}
            ) as r,
        ):
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
            rid = json.loads(first[6:])["id"]
        assert engine.wait_outcome(rid, {"closed"}, timeout=1.0) == "closed"
    still_serving(url)


def test_client_disconnect_non_stream_aborts(url, engine):
    before = set(engine.seen)
    with engine.scripted(engine.script * 50, delay=30):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER}, timeout=0.3)
        deadline = time.monotonic() + 2
        while not (new := set(engine.seen) - before) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.wait_outcome(new.pop(), {"closed"}, timeout=1.0) == "closed"


def test_abort_request_targets_the_response_id(url, engine):
    with engine.scripted(engine.script * 50, delay=0.05):
        with (
            httpx.Client(timeout=5) as h,
            h.stream(
                "POST", f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True}
            ) as r,
        ):
            lines = r.iter_lines()
            rid = json.loads(next(x for x in lines if x.startswith("data: "))[6:])["id"]
            assert httpx.post(f"{url}/abort_request", json={"rid": rid}).json() == {"rid": rid, "aborted": True}
            rest = [x for x in lines if x.startswith("data: ")]
        assert "data: [DONE]" not in rest and engine.seen[rid].outcome == "aborted"
    assert httpx.post(f"{url}/abort_request", json={"rid": "nope"}).json()["aborted"] is False
    assert httpx.post(f"{url}/abort_request", json={"id": 1}).status_code == 400


def test_metrics_have_sglang_names_and_labels(client, url):
    client.chat.completions.create(model=MODEL, messages=USER)
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in METRIC_NAMES:
        fam = families[name.removesuffix("_total") if name.endswith("_total") else name]
        assert fam.samples, name
        for sample in fam.samples:
            assert sample.labels["model_name"] == MODEL and sample.labels["engine_type"] == "unified"
    samples = {s.name: s.value for f in families.values() for s in f.samples}
    assert samples["sglang:num_requests_total"] >= 1 and samples["sglang:e2e_request_latency_seconds_count"] >= 1
    assert samples["sglang:time_to_first_token_seconds_count"] >= 1
    assert samples["sglang:num_decode_transfer_queue_reqs"] == 0


def test_sglang_endpoints(url, engine):
    assert httpx.get(f"{url}/health_generate").status_code == 200
    info = httpx.get(f"{url}/get_server_info").json()
    assert info["index_k_dtype"] == "fp8" and info["page_size"] == engine.cfg.page_size
    assert info["context_length"] == 4096 and info["version"]
    assert httpx.get(f"{url}/get_model_info").json()["is_generation"] is True
    assert httpx.post(f"{url}/flush_cache").status_code == 200
    engine.is_alive = False
    try:
        assert httpx.get(f"{url}/health").status_code == 503
        assert httpx.get(f"{url}/health_generate").status_code == 503
        assert httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER}).status_code == 503
    finally:
        engine.is_alive = True


def test_unexpected_exception_is_500_and_server_survives(url, engine, monkeypatch):
    def boom() -> bool:
        raise RuntimeError("flush exploded")

    monkeypatch.setattr(engine, "flush_cache", boom)
    r = httpx.post(f"{url}/flush_cache")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    still_serving(url)


def test_api_key_is_enforced():
    srv, _ = make_server(api_key="sekret")
    try:
        assert httpx.get(f"{srv.url}/health").status_code == 200
        assert httpx.get(f"{srv.url}/metrics").status_code == 200
        r = httpx.get(f"{srv.url}/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
        with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="sekret", max_retries=0) as good:
            assert good.models.list().data[0].id == MODEL
            # The scheme is case-insensitive (RFC 9110; SGLang too); the key is not.
            assert httpx.get(f"{srv.url}/v1/models", headers={"Authorization": "bearer sekret"}).status_code == 200
            assert httpx.get(f"{srv.url}/v1/models", headers={"Authorization": "Bearer SEKRET"}).status_code == 401
            reply = good.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS)
            assert reply.choices[0].finish_reason == "tool_calls"
    finally:
        srv.stop()
