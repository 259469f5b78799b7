"""SGLang's native `/generate` on a real engine (tiny random-weight model, real loop) on loopback:
unified, and the PD halves as two servers joined by their bootstrap port, behind our router and
behind SGLang's. The answer's shape is SGLang's, its greedy tokens are `/v1/completions`', bad
bodies are 400s naming the field, and a client that leaves leaves nothing running."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from dsv4bench.engine import sglang_router
from dsv4bench.engine.pd.halves import Half, build_half
from dsv4bench.engine.pd.http_router import Halves, build_router_app
from dsv4bench.engine.serve import build_engine
from dsv4bench.engine.server import HEALTH_PROBE_HEADER, ServerConfig, build_app, model_list
from dsv4bench.engine.tokenizer import load_tokenizer

from .pd.helpers import ServerThread, tiny_cfg, wait_until

TOK = load_tokenizer()
PROMPT = "The quick brown fox"
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}  # a fixed length whatever the weights say
META = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cached_tokens_details",
    "e2e_latency",
}


@dataclass
class Unified:
    url: str
    built: Any

    def idle(self) -> bool:
        s = self.built.engine.stats()
        return s.num_running + s.num_queued + s.num_prefill == 0 and not self.built.loop.live


@pytest.fixture(scope="module")
def unified() -> Iterator[Unified]:
    built = build_engine(tiny_cfg(pd=False), random_weights=True)
    srv = ServerThread(build_app(built.engine, built.frontend, ServerConfig()))
    yield Unified(srv.url, built)
    srv.stop()
    built.stop()


def generate(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/generate", json=body, timeout=60)


def stream(url: str, body: dict[str, Any]) -> list[Any]:
    """The payloads of a streamed /generate, `[DONE]` as the string."""
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [
            line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ")
        ]


def assert_sglang_shape(answer: dict[str, Any], rid: str | None = None) -> None:
    assert set(answer) == {"text", "output_ids", "meta_info"} and isinstance(answer["text"], str)
    meta = answer["meta_info"]
    assert set(meta) == META and (rid is None or meta["id"] == rid)
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["completion_tokens"] == len(answer["output_ids"]) and meta["prompt_tokens"] > 0


def assert_stream_is_the_answer(chunks: list[Any], answer: dict[str, Any]) -> None:
    """Cumulative text, each chunk's own ids, the finish on the last one, then [DONE]."""
    assert chunks[-1] == "[DONE]" and len(chunks) > 2
    answers = chunks[:-1]
    assert all(c["meta_info"]["finish_reason"] is None and "e2e_latency" not in c["meta_info"] for c in answers[:-1])
    assert all(b["text"].startswith(a["text"]) for a, b in zip(answers, answers[1:]))
    assert [i for c in answers for i in c["output_ids"]] == answer["output_ids"]
    last = answers[-1]
    assert last["text"] == answer["text"] and last["meta_info"]["finish_reason"] == answer["meta_info"]["finish_reason"]
    assert set(last["meta_info"]) == META


# ---- unified ---------------------------------------------------------------------------------


def test_text_and_input_ids_give_the_same_answer(unified):
    by_text = generate(unified.url, {"text": PROMPT, "sampling_params": GREEDY, "rid": "native-1"})
    assert by_text.status_code == 200, by_text.text
    answer = by_text.json()
    assert_sglang_shape(answer, "native-1")
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    by_ids = generate(unified.url, {"input_ids": TOK.encode(PROMPT), "sampling_params": GREEDY}).json()
    assert by_ids["output_ids"] == answer["output_ids"] and by_ids["text"] == answer["text"]
    assert by_ids["meta_info"]["id"] != "native-1" and by_ids["meta_info"]["cached_tokens"] >= 0


def test_greedy_answer_is_the_completions_one(unified):
    ids = TOK.encode("Once upon a time")
    completion = httpx.post(
        f"{unified.url}/v1/completions", timeout=60, json={"prompt": ids, "max_tokens": 12, "temperature": 0}
    ).json()
    answer = generate(unified.url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
    native = answer.json()
    assert native["text"] == completion["choices"][0]["text"]
    assert native["meta_info"]["completion_tokens"] == completion["usage"]["completion_tokens"]
    assert native["meta_info"]["prompt_tokens"] == completion["usage"]["prompt_tokens"] == len(ids)
    assert native["meta_info"]["finish_reason"]["type"] == completion["choices"][0]["finish_reason"]


def test_streamed_answer_is_the_whole_one_in_pieces(unified):
    body = {"text": PROMPT, "sampling_params": GREEDY}
    assert_stream_is_the_answer(stream(unified.url, body), generate(unified.url, body).json())


def test_top_k_1_is_greedy(unified):
    sampled = {"max_new_tokens": 12, "temperature": 1.0, "top_k": 1, "sampling_seed": 7, "ignore_eos": True}
    assert (
        generate(unified.url, {"text": PROMPT, "sampling_params": sampled}).json()["output_ids"]
        == generate(unified.url, {"text": PROMPT, "sampling_params": GREEDY}).json()["output_ids"]
    )


def test_stops_say_what_they_matched(unified):
    whole = generate(unified.url, {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 24}}).json()
    stop_id = whole["output_ids"][5]
    by_id = generate(unified.url, {"text": PROMPT, "sampling_params": {**GREEDY, "stop_token_ids": [stop_id]}}).json()
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert by_id["output_ids"] == whole["output_ids"][: whole["output_ids"].index(stop_id) + 1]
    text = whole["text"]
    assert len(text) > 6, "the random weights gave too little text to cut"
    stop = text[3:6]
    by_str = generate(
        unified.url, {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 24, "stop": [stop]}}
    ).json()
    assert by_str["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert by_str["text"] == text[: text.index(stop)]


BAD = [
    ({}, "text"),
    ({"text": "a", "input_ids": [5]}, "input_ids"),
    ({"text": ["a", "b"]}, "text"),
    ({"input_ids": [[5, 6]]}, "input_ids"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [-1]}, "input_ids"),
    ({"input_ids": [True]}, "input_ids"),
    ({"text": ""}, "text"),
    ({"text": 5}, "text"),
    ({"text": "a", "stream": "yes"}, "stream"),
    ({"text": "a", "rid": 5}, "rid"),
    ({"text": "a", "rid": ""}, "rid"),
    ({"text": "a", "rid": ["x", "y"]}, "rid"),
    ({"text": "a", "rid": "HEALTH_CHECK_mine"}, "rid"),
    ({"text": "a", "return_logprob": True}, "return_logprob"),
    ({"text": "a", "image_data": "cat.png"}, "image_data"),
    ({"text": "a", "bootstrap_room": 5}, "bootstrap_host"),
    ({"text": "a", "bootstrap_host": "h", "bootstrap_port": 0, "bootstrap_room": 5}, "bootstrap_port"),
    ({"text": "a", "sampling_params": 3}, "sampling_params"),
    ({"text": "a", "sampling_params": [{}]}, "sampling_params"),
    ({"text": "a", "sampling_params": {"temperature": 3}}, "sampling_params.temperature"),
    ({"text": "a", "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
    ({"text": "a", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"text": "a", "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
    ({"text": "a", "sampling_params": {"top_k": 5}}, "sampling_params.top_k"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 0}}, "sampling_params.max_new_tokens"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 10**6}}, "sampling_params.max_new_tokens"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 2**70}}, "sampling_params.max_new_tokens"),
    ({"text": "a", "sampling_params": {"stop": 5}}, "sampling_params.stop"),
    ({"text": "a", "sampling_params": {"stop": [""]}}, "sampling_params.stop"),
    ({"text": "a", "sampling_params": {"stop_token_ids": [10**9]}}, "sampling_params.stop_token_ids"),
    ({"text": "a", "sampling_params": {"ignore_eos": "yes"}}, "sampling_params.ignore_eos"),
    ({"text": "a", "sampling_params": {"sampling_seed": -1}}, "sampling_params.sampling_seed"),
    ({"text": "a", "sampling_params": {"frequency_penalty": 0.5}}, "sampling_params.frequency_penalty"),
    ({"text": "a", "sampling_params": {"n": 2}}, "sampling_params.n"),
    ({"text": "a", "sampling_params": {"regex": "a+"}}, "sampling_params.regex"),
    ({"text": "a", "sampling_params": {"temprature": 0}}, "sampling_params.temprature"),
    ([{"text": "a"}], None),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_bodies_are_400_naming_the_field(unified, body, param):
    r = generate(unified.url, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    if param and error["code"] != "context_length_exceeded":
        assert param.split(".")[-1] in error["message"]


def test_a_prompt_beyond_the_context_is_400(unified):
    r = generate(unified.url, {"input_ids": [300] * 5000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_no_op_values_of_unsupported_fields_pass(unified):
    body = {
        "text": "a",
        "return_logprob": False,
        "sampling_params": {
            "max_new_tokens": 2,
            "n": 1,
            "frequency_penalty": 0,
            "repetition_penalty": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "no_stop_trim": False,
            "spaces_between_special_tokens": True,
            "skip_special_tokens": False,
        },
    }
    assert generate(unified.url, body).status_code == 200


def test_a_rid_in_flight_is_refused_and_abort_request_ends_it(unified):
    body = {
        "text": PROMPT,
        "rid": "twice",
        "stream": True,
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
    }
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{unified.url}/generate", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["meta_info"]["id"] == "twice"
        again = client.post(f"{unified.url}/generate", json={**body, "stream": False})
        assert again.status_code == 400 and again.json()["error"]["param"] == "rid"
        assert client.post(f"{unified.url}/abort_request", json={"rid": "twice"}).json()["aborted"] is True
        rest = [line[6:] for line in lines if line.startswith("data: ")]
    assert rest[-1] == "[DONE]"
    assert json.loads(rest[-2])["meta_info"]["finish_reason"]["type"] == "abort"  # answered, as SGLang does
    wait_until(unified.idle, what="the engine to be idle")


def test_a_client_leaving_mid_stream_leaves_nothing_running(unified):
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with httpx.stream("POST", f"{unified.url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then gone
    wait_until(unified.idle, what="the engine to be idle")
    assert not unified.built.engine.stats().num_running


def test_a_client_leaving_a_whole_answer_leaves_nothing_running(unified):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{unified.url}/generate", json=body, timeout=httpx.Timeout(60, read=0.5))
    wait_until(unified.idle, what="the engine to be idle")


# ---- PD: the halves as servers, our router and SGLang's in front ----------------------------


@dataclass
class PD:
    prefill: str
    decode: str
    router: str
    bootstrap_port: int
    halves: tuple[Half, Half]

    def idle(self) -> bool:
        return all(h.app.state.server.engine.stats().in_flight == 0 for h in self.halves)


@pytest.fixture(scope="module")
def pd() -> Iterator[PD]:
    cfg = tiny_cfg()
    prefill = build_half("prefill", cfg, ServerConfig(), bootstrap_port=0, random_weights=True)
    decode = build_half("decode", cfg, ServerConfig(), random_weights=True)
    started: list[Half] = []
    servers: list[ServerThread] = []
    try:
        for half in (prefill, decode):
            half.start()
            started.append(half)
            servers.append(ServerThread(half.app))
        assert prefill.bootstrap_port is not None
        halves = Halves(servers[0].url, servers[1].url, prefill.bootstrap_port)
        ctx = decode.app.state.server.engine.max_context
        servers.append(
            ServerThread(
                build_router_app(halves, cfg, TOK, ctx, ServerConfig(engine_type="router"), health_timeout_s=4.0)
            )
        )
        yield PD(servers[0].url, servers[1].url, servers[2].url, prefill.bootstrap_port, (prefill, decode))
    finally:
        for srv in reversed(servers):
            srv.stop()
        for half in reversed(started):
            half.stop()


def test_our_router_answers_as_the_unified_engine(pd, unified):
    body = {"text": PROMPT, "sampling_params": GREEDY}
    expected = generate(unified.url, body).json()
    r = generate(pd.router, body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert_sglang_shape(answer)
    assert (answer["text"], answer["output_ids"]) == (expected["text"], expected["output_ids"])
    assert_stream_is_the_answer(stream(pd.router, body), answer)
    wait_until(pd.idle, what="both halves to be idle")


def to_both(pd: PD, body: dict[str, Any], room: int, headers: dict[str, str] | None = None) -> list[httpx.Response]:
    """What a PD router does: the same body, with the room, to both halves at once."""
    body = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": pd.bootstrap_port, "bootstrap_room": room}

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            return list(
                await asyncio.gather(*(client.post(f"{root}/generate", json=body) for root in (pd.prefill, pd.decode)))
            )

    return asyncio.run(main())


def test_each_half_answers_its_part(pd):
    """The prefill's answer is its one token, the decode's the whole answer."""
    body = {"input_ids": TOK.encode(PROMPT), "sampling_params": GREEDY, "rid": "both-halves"}
    prefill, decode = to_both(pd, body, room=4242)
    assert prefill.status_code == 200 and decode.status_code == 200, (prefill.text, decode.text)
    assert prefill.json()["meta_info"]["completion_tokens"] == 1
    assert prefill.json()["meta_info"]["id"] == decode.json()["meta_info"]["id"] == "both-halves"
    assert (
        decode.json()["output_ids"]
        == generate(pd.router, {"input_ids": body["input_ids"], "sampling_params": GREEDY}).json()["output_ids"]
    )
    wait_until(pd.idle, what="both halves to be idle")


def test_a_health_probe_through_the_halves_counts_as_no_request(pd):
    def totals() -> list[int]:
        return [h.app.state.server.engine.stats().num_requests_total for h in pd.halves]

    before = totals()
    answers = to_both(
        pd, {"text": "ping", "sampling_params": {"max_new_tokens": 1}}, room=4343, headers={HEALTH_PROBE_HEADER: "1"}
    )
    assert [a.status_code for a in answers] == [200, 200]
    assert all(a.json()["meta_info"]["id"].startswith("HEALTH_CHECK_") for a in answers)
    assert totals() == before
    wait_until(pd.idle, what="both halves to be idle")


def test_a_half_refuses_generate_without_its_room(pd):
    for root in (pd.prefill, pd.decode):
        r = generate(root, {"text": PROMPT})
        assert r.status_code == 400 and r.json()["error"]["param"] == "bootstrap_room"


def test_a_client_leaving_our_router_mid_stream_ends_both_halves(pd):
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with httpx.stream("POST", f"{pd.router}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break
    wait_until(pd.idle, what="both halves to be idle")


def test_the_router_lists_the_model_as_the_servers_do(pd, unified):
    ctx = unified.built.engine.max_context
    for url in (pd.router, pd.decode):
        assert httpx.get(f"{url}/v1/models", timeout=10).json() == model_list("dsv4-mini", ctx)


@pytest.mark.skipif(not sglang_router.installed(), reason=sglang_router.MISSING)
def test_sglang_router_forwards_generate_to_both_halves(pd, tmp_path):
    """SGLang's real router in PD mode adds the room to /generate itself and sends it to both."""
    router = sglang_router.start_sglang_router(
        prefill=[(pd.prefill, pd.bootstrap_port)], decode=[pd.decode], log_dir=tmp_path
    )
    try:
        body = {"text": PROMPT, "sampling_params": GREEDY}
        expected = generate(pd.router, body).json()
        r = generate(router.root, body)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert_sglang_shape(answer)
        assert answer["output_ids"] == expected["output_ids"] and answer["text"] == expected["text"]
        assert_stream_is_the_answer(stream(router.root, body), answer)
        wait_until(pd.idle, what="both halves to be idle")
    finally:
        router.stop()
