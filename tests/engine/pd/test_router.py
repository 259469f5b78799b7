"""The router on loopback: OpenAI chat with tools, streamed and not, byte-for-byte what the
unified engine answers with the same weights; disconnects and /abort_request free everything."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from dsv4bench.engine.serve import build_engine
from dsv4bench.engine.server import ServerConfig, build_app

from .helpers import ServedPD, ServerThread, tiny_cfg, wait_until

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read main.py please."},
]


@pytest.fixture(scope="module")
def served() -> Iterator[ServedPD]:
    s = ServedPD()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def unified() -> Iterator[str]:
    built = build_engine(tiny_cfg(pd=False), random_weights=True)  # the same seeded weights
    server = ServerThread(build_app(built.engine, built.frontend, ServerConfig()))
    yield f"{server.url}/v1"
    server.stop()
    built.stop()


def body(**extra) -> dict:
    return {"model": "dsv4-mini", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 24, "temperature": 0, **extra}


def sse_payloads(url: str, payload: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}/chat/completions", json=payload, timeout=30) as r:
        assert r.status_code == 200
        datas = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    return [{k: v for k, v in json.loads(d).items() if k not in ("id", "created")} for d in datas[:-1]]


def quiet_everywhere(served: ServedPD) -> bool:
    p, d = served.pd.prefill.stats, served.pd.decode.stats
    return p.in_flight == 0 and d.in_flight == 0 and not served.pd.router.active


def test_non_streamed_chat_with_tools_is_what_the_unified_engine_answers(served, unified):
    pd = httpx.post(f"{served.api}/chat/completions", json=body(), timeout=30).json()
    one = httpx.post(f"{unified}/chat/completions", json=body(), timeout=30).json()
    assert pd["id"].startswith("chatcmpl-") and pd["object"] == "chat.completion"
    assert pd["choices"] == one["choices"] and pd["usage"] == one["usage"]
    assert pd["usage"]["completion_tokens"] >= 1


def test_streamed_chat_with_usage_is_what_the_unified_engine_streams(served, unified):
    payload = body(stream=True, stream_options={"include_usage": True}, max_tokens=40)
    pd, one = sse_payloads(served.api, payload), sse_payloads(unified, payload)
    assert pd == one
    assert pd[-1]["choices"] == [] and pd[-1]["usage"]["completion_tokens"] >= 1


def test_the_openai_client_reads_the_router(served):
    with openai.OpenAI(base_url=served.api, api_key="none", max_retries=0, timeout=30) as client:
        r = client.chat.completions.create(
            model="dsv4-mini", messages=MESSAGES, tools=TOOLS, max_tokens=8, temperature=0
        )
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls") and r.usage.prompt_tokens > 10
        chunks = list(
            client.chat.completions.create(
                model="dsv4-mini", messages=MESSAGES, tools=TOOLS, max_tokens=8, temperature=0, stream=True
            )
        )
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
        assert [m.id for m in client.models.list().data] == ["dsv4-mini"]


def test_a_disconnect_while_decoding_aborts_on_both_servers(served):
    aborted = served.pd.decode.stats.num_aborted_total
    with httpx.stream(
        "POST", f"{served.api}/chat/completions", json=body(stream=True, max_tokens=3000), timeout=30
    ) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        wait_until(lambda: served.pd.decode.stats.num_running == 1, what="the request to decode")
    wait_until(lambda: quiet_everywhere(served), what="the abort")
    assert served.pd.decode.stats.num_aborted_total == aborted + 1
    assert served.pd.decode.stats.pages_used == 0 and served.pd.prefill.stats.leaked_pages == 0


def test_a_retry_with_the_rid_of_a_request_just_aborted_is_served():
    """SGLang's /generate takes the client's rid. A retry under the rid of a request that left a
    moment ago (still in the decode's transfer queue until its room answers the abort) is a
    request of its own."""
    slow = ServedPD(link_gbps=0.0005)  # the KV takes a while: the first request waits in transfer
    try:
        generate = {"input_ids": list(range(5, 200)), "rid": "mine", "sampling_params": {"max_new_tokens": 3}}
        with httpx.stream("POST", f"{slow.router}/generate", json={**generate, "stream": True}, timeout=30):
            wait_until(lambda: slow.pd.prefill.stats.num_prefill_inflight_queue == 1, what="the transfer")
        again = httpx.post(f"{slow.router}/generate", json=generate, timeout=30).json()
        assert again["meta_info"]["finish_reason"]["type"] == "length", again
        wait_until(lambda: quiet_everywhere(slow), what="both halves to let go")
        assert slow.pd.decode.stats.pages_used == 0
    finally:
        slow.stop()


def test_abort_request_on_the_router_ends_the_stream_without_done(served):
    with httpx.stream(
        "POST", f"{served.api}/chat/completions", json=body(stream=True, max_tokens=3000), timeout=30
    ) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: {"))
        rid = json.loads(first[len("data: ") :])["id"]
        answer = httpx.post(f"{served.router}/abort_request", json={"rid": rid}, timeout=5).json()
        assert answer == {"rid": rid, "aborted": True}
        rest = [line for line in lines if line.startswith("data: ")]
    assert "data: [DONE]" not in rest
    wait_until(lambda: quiet_everywhere(served), what="the abort")
    assert served.pd.decode.stats.pages_used == 0
