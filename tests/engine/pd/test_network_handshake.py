"""The prefill and decode engines joined only by loopback TCP (the bootstrap port and the KV it
carries), as two processes are: the same greedy answer as the in-process PD engine whichever
server hears of the request first, aborts on either side reaching the other, a decode that
dies mid-request, and no room, page or request left behind."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import pytest

from dsv4bench.engine import sglang_router
from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.model_runner import ModelRunner
from dsv4bench.engine.pd.bootstrap import BootstrapWorker, Room
from dsv4bench.engine.pd.bootstrap_client import BootstrapClient
from dsv4bench.engine.prepared_request import Bootstrap
from dsv4bench.engine.pd.bootstrap_server import BootstrapServer, room_rid
from dsv4bench.engine.pd.decode import DecodeEngine
from dsv4bench.engine.pd.http_router import Halves, build_router_app
from dsv4bench.engine.pd.kv_wire import send
from dsv4bench.engine.pd.prefill import PrefillEngine
from dsv4bench.engine.pd.transfer import TransferStatus, TransferWorker
from dsv4bench.engine.request import FinishReason, Request
from dsv4bench.engine.pd.worker import DecodeServing, PrefillServing
from dsv4bench.engine.serve import build_engine, load_model
from dsv4bench.engine.server import ServerConfig, build_app
from dsv4bench.engine.tokenizer import load_tokenizer

from .helpers import ListSink, ServerThread, build_tiny, greedy, prompt, tiny_cfg, wait_until


@dataclass
class Split:
    """A prefill half and a decode half that share nothing but a TCP port."""

    prefill: PrefillEngine
    server: BootstrapServer
    worker: BootstrapWorker
    transfers: TransferWorker
    decode: DecodeEngine
    client: BootstrapClient

    def send(self, room: int, ids: list[int], max_tokens: int, decode_first: bool = True) -> ListSink:
        sink = ListSink()
        params = replace(greedy(max_tokens), stop_token_ids=(1,))  # EOS, as the routers add it

        def to_decode() -> None:
            self.client.open(f"d{room}", Bootstrap("127.0.0.1", self.server.port, room))
            self.decode.submit(Request(f"d{room}", list(ids), params), sink)

        def to_prefill() -> None:
            r = Room(room_rid(room))
            self.server.open(room, r)
            self.prefill.submit(Request(r.rid, list(ids), replace(params, max_tokens=1)), r)

        for part in (to_decode, to_prefill) if decode_first else (to_prefill, to_decode):
            part()
        return sink

    def quiet(self) -> bool:
        p, d = self.prefill, self.decode
        return not (
            p.bootstrap_queue
            or p.prefilling
            or p.inflight_queue
            or d.prealloc_queue
            or d.transfer_queue
            or d.decoding
            or self.worker.rooms
            or p.stats.in_flight
            or d.stats.in_flight
        )

    def assert_clean(self) -> None:
        wait_until(self.quiet, what="both halves to be empty")
        wait_until(lambda: self.decode.allocator.num_used == 0, what="the decode pages to be free")
        assert self.prefill.allocator.num_used == self.prefill.cache.num_cached_pages


@pytest.fixture(scope="module")
def split() -> Iterator[Split]:
    cfg = tiny_cfg()
    _, model = load_model(cfg, random_weights=True, init_seed=0)
    prefill_runner, decode_runner = ModelRunner(cfg, model), ModelRunner(cfg, model)
    worker = BootstrapWorker()
    server = BootstrapServer(worker)
    transfers = TransferWorker(prefill_runner.pools, None)
    prefill = PrefillEngine(cfg, prefill_runner, worker, transfers, eos_token_id=1)
    client = BootstrapClient(decode_runner.pools)
    decode = DecodeEngine(cfg, decode_runner, client, eos_token_id=1)  # type: ignore[arg-type]  # the worker's calls, over the network
    parts = (worker, server, transfers, prefill, decode)
    for part in parts:
        part.start()
    yield Split(prefill, server, worker, transfers, decode, client)
    for part in reversed(parts):
        part.stop()


@pytest.fixture(scope="module")
def reference() -> Iterator:
    pd = build_tiny(start=True)
    yield pd
    pd.stop()


def in_process_answer(pd, ids: list[int], max_tokens: int) -> list[int]:
    sink = ListSink()
    pd.dispatch("ref", ids, greedy(max_tokens), sink)
    wait_until(lambda: sink.finish is not None, what="the in-process answer")
    return sink.tokens


@pytest.mark.parametrize("decode_first", [True, False])
def test_the_answer_is_the_in_process_one_whichever_server_hears_first(split, reference, decode_first):
    ids = prompt(70, seed=3)  # several pages, a partial last one
    expected = in_process_answer(reference, ids, 12)
    sink = split.send(11 if decode_first else 12, ids, 12, decode_first)
    wait_until(lambda: sink.finish is not None, what="the answer")
    assert sink.finish in (FinishReason.LENGTH, FinishReason.STOP) and sink.tokens == expected
    split.assert_clean()


@pytest.mark.parametrize("prefill_after_close", [True, False], ids=["after-the-decode-left", "before-it-left"])
def test_a_prefill_arriving_after_its_decode_gave_up_leaves_no_room(split, prefill_after_close):
    """A kill in the first milliseconds: the decode's prealloc reached the bootstrap port before
    the prefill had the request, then the decode aborted and left. The prefill's copy, arriving
    last, must end at once instead of waiting in the bootstrap queue for ever."""
    room, ids = 31 + prefill_after_close, prompt(40, seed=6)
    params = replace(greedy(8), stop_token_ids=(1,))
    split.client.open(f"d{room}", Bootstrap("127.0.0.1", split.server.port, room))
    split.decode.submit(Request(f"d{room}", list(ids), params), ListSink())
    wait_until(lambda: room in split.server._pending, what="the decode's prealloc to be held")
    split.decode.abort(f"d{room}").result(5)
    if prefill_after_close:
        wait_until(lambda: room not in split.server._connected, what="the decode to leave the room")
    r = Room(room_rid(room))
    assert split.server.open(room, r)
    ended = ListSink()
    split.prefill.submit(Request(r.rid, list(ids), replace(params, max_tokens=1)), r, ended)
    wait_until(lambda: ended.finish is not None, what="the prefill's copy to end")
    assert ended.finish is FinishReason.ABORT
    split.server.release(room)  # what the prefill server does when its request ends
    split.assert_clean()


def test_an_abort_on_the_decode_side_reaches_the_prefill_room(split):
    sink = split.send(21, prompt(40, seed=4), 400, decode_first=True)
    split.decode.abort("d21").result(5)
    assert sink.finish is FinishReason.ABORT
    split.prefill.abort(room_rid(21)).result(5)  # the router aborts both; the room is gone either way
    split.assert_clean()


def test_an_abort_on_the_prefill_side_fails_the_decode_request(split):
    ids = prompt(40, seed=5)
    sink = ListSink()
    split.client.open("d31", Bootstrap("127.0.0.1", split.server.port, 31))
    split.decode.submit(Request("d31", ids, greedy(4)), sink)
    room = Room(room_rid(31))
    split.server.open(31, room)  # opened, but its prefill request is aborted before it runs
    split.worker.abort(room.rid)
    wait_until(lambda: sink.finish is not None, what="the decode request to end")
    assert sink.finish is FinishReason.ABORT
    split.server.release(31)
    split.assert_clean()


def test_a_decode_that_dies_mid_request_aborts_its_room(split):
    """A connection that drops without `close` (the decode process died): the prefill room is
    aborted and closed, its prefill request leaves."""
    room = Room(room_rid(41))
    split.server.open(41, room)
    split.prefill.submit(Request(room.rid, prompt(400, seed=6), greedy(1)), room)
    with socket.create_connection(("127.0.0.1", split.server.port)) as sock:
        send(sock, {"op": "prealloc", "room": 41, "num_pages": 25, "bytes_per_page": 1})
        wait_until(lambda: room.state.name != "BOOTSTRAPPING", what="the room to bootstrap")
    split.assert_clean()
    # Aborted, never failed at the first page it could not send: nothing computed for nobody. (25
    # one-byte pages fit the socket's buffer: on a busy machine the prefill may have sent them all
    # before the drop is seen; the room is aborted and closed all the same, asserted above.)
    assert room.transfer is not None and room.transfer.status in (TransferStatus.ABORTED, TransferStatus.SUCCESS)


def test_a_decode_that_refuses_before_reserving_tells_the_room(split):
    """A prompt the decode pool can never hold: refused at once, and the prefill room hears it."""
    room = Room(room_rid(51))
    split.server.open(51, room)
    ids = prompt(tiny_cfg().num_pages * 16 + 10, seed=7)
    split.prefill.submit(Request(room.rid, ids, greedy(1)), room)
    sink = ListSink()
    split.client.open("d51", Bootstrap("127.0.0.1", split.server.port, 51))
    split.decode.submit(Request("d51", ids, greedy(4)), sink)
    wait_until(lambda: sink.finish is FinishReason.ABORT, what="the refusal")
    wait_until(lambda: room.state.name == "ABORTED", what="the room to hear it")
    split.server.release(51)
    split.assert_clean()


def test_garbage_on_the_bootstrap_port_harms_no_room(split):
    with socket.create_connection(("127.0.0.1", split.server.port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
    with socket.create_connection(("127.0.0.1", split.server.port)) as sock:
        send(sock, {"op": "decoding", "room": 1})
    assert split.server.alive()
    sink = split.send(61, prompt(20, seed=8), 3)
    wait_until(lambda: sink.finish is not None, what="an answer after the garbage")
    assert sink.finish is not FinishReason.ABORT
    split.assert_clean()


# ---- the two halves as HTTP servers, as SGLang's router sees them ------------------------------


@pytest.fixture(scope="module")
def unified() -> Iterator[str]:
    """The unified engine over the same seeded weights: the answer PD must give."""
    built = build_engine(tiny_cfg(pd=False), random_weights=True)
    server = ServerThread(build_app(built.engine, built.frontend, ServerConfig()))
    yield f"{server.url}/v1"
    server.stop()
    built.stop()


@pytest.fixture(scope="module")
def halves(split, unified) -> Iterator[tuple[str, str, str]]:
    """(prefill URL, decode URL, the unified engine's API URL) over the split halves."""
    tok = load_tokenizer()
    frontend = Frontend(tok, max_context=4096)
    cfg = split.prefill.cfg
    needs_p = (split.worker.alive, split.transfers.alive, split.server.alive)
    prefill = PrefillServing(cfg, split.prefill, split.server, needs_p, tok.eos_token_id, 4096)
    decode = DecodeServing(split.decode.cfg, split.decode, split.client, (), tok.eos_token_id, 4096)
    servers = [
        ServerThread(build_app(prefill, frontend, ServerConfig(engine_type="prefill"))),
        ServerThread(build_app(decode, frontend, ServerConfig(engine_type="decode"))),
    ]
    yield servers[0].url, servers[1].url, unified
    for s in servers:
        s.stop()


def both(
    prefill: str, decode: str, path: str, body: dict, port: int, room: int
) -> tuple[httpx.Response, httpx.Response]:
    """What a PD router does: the same body, with the room, to both halves at once."""
    body = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room}

    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return tuple(
                await asyncio.gather(
                    client.post(f"{prefill}{path}", json=body),  # type: ignore[return-value]  # gather of two gives a pair
                    client.post(f"{decode}{path}", json=body),
                )
            )

    return asyncio.run(main())


def test_the_halves_over_http_answer_as_the_unified_engine(split, halves):
    prefill, decode, router = halves
    body = {
        "model": "dsv4-mini",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 10,
        "temperature": 0,
    }
    expected = httpx.post(f"{router}/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]
    p, d = both(prefill, decode, "/v1/chat/completions", body, split.server.port, room=71)
    assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
    assert d.json()["choices"][0]["message"] == expected
    assert p.json()["usage"]["completion_tokens"] == 1  # the prefill's answer: its one token
    split.assert_clean()


def test_a_half_refuses_a_request_without_its_room(halves):
    prefill, decode, _ = halves
    for url in (prefill, decode):
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == "bootstrap_room"
        partial = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "bootstrap_room": 5}, timeout=10)
        assert partial.status_code == 400 and partial.json()["error"]["param"] == "bootstrap_host"
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_a_client_leaving_the_decode_half_ends_the_request_on_both(split, halves):
    prefill, decode, _ = halves
    body = {
        "model": "dsv4-mini",
        "prompt": "a long story",
        "max_tokens": 2000,
        "stream": True,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": split.server.port,
        "bootstrap_room": 81,
    }

    async def main() -> int:
        async with httpx.AsyncClient(timeout=30) as client:
            prefill_done = asyncio.ensure_future(client.post(f"{prefill}/v1/completions", json=body))
            async with client.stream("POST", f"{decode}/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        break  # the first chunk, then the client goes away
            return (await prefill_done).status_code

    assert asyncio.run(main()) == 200  # the prefill's half had finished: its token left with the KV
    split.assert_clean()


@pytest.mark.skipif(not sglang_router.installed(), reason=sglang_router.MISSING)
def test_sglang_router_in_front_of_the_halves(split, halves, tmp_path):
    """SGLang's real router in PD mode: it adds the room itself, sends to both halves and
    streams the decode's answer, which is the unified engine's."""
    prefill, decode, reference = halves
    router = sglang_router.start_sglang_router(
        prefill=[(prefill, split.server.port)], decode=[decode], log_dir=tmp_path
    )
    try:
        body = {
            "model": "dsv4-mini",
            "messages": [{"role": "user", "content": "hello again"}],
            "max_tokens": 10,
            "temperature": 0,
        }
        expected = httpx.post(f"{reference}/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]
        r = httpx.post(f"{router.url}/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"] == expected
        with httpx.stream("POST", f"{router.url}/chat/completions", json={**body, "stream": True}, timeout=30) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        assert text == expected["content"]
        split.assert_clean()
    finally:
        router.stop()


@pytest.fixture(scope="module")
def our_router(split, halves) -> Iterator[str]:
    prefill, decode, _ = halves
    app = build_router_app(
        Halves(prefill, decode, split.server.port),
        split.prefill.cfg,
        load_tokenizer(),
        4096,
        ServerConfig(engine_type="router"),
        health_timeout_s=4.0,
    )
    server = ServerThread(app)
    yield server.url
    server.stop()


def test_our_http_router_in_front_of_the_halves(split, halves, our_router):
    _, _, reference = halves
    body = {
        "model": "dsv4-mini",
        "messages": [{"role": "user", "content": "hi router"}],
        "max_tokens": 10,
        "temperature": 0,
    }
    expected = httpx.post(f"{reference}/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]
    r = httpx.post(f"{our_router}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"] == expected, r.text
    with httpx.stream("POST", f"{our_router}/v1/chat/completions", json={**body, "stream": True}, timeout=30) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        == expected["content"]
    )
    before = (split.prefill.stats.num_requests_total, split.decode.stats.num_requests_total)
    assert httpx.get(f"{our_router}/health", timeout=10).status_code == 200
    # The probe went through both halves but counts as no one's request there.
    assert (split.prefill.stats.num_requests_total, split.decode.stats.num_requests_total) == before
    workers = httpx.get(f"{our_router}/workers", timeout=10).json()["workers"]
    assert [w["worker_type"] for w in workers] == ["prefill", "decode"] and all(w["is_healthy"] for w in workers)
    split.assert_clean()


def test_a_client_leaving_our_router_aborts_both_halves(split, our_router):
    body = {"model": "dsv4-mini", "prompt": "tell me everything", "max_tokens": 3000, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{our_router}/v1/completions", json=body, timeout=30) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then gone
    split.assert_clean()
    router_stats = httpx.get(f"{our_router}/metrics", timeout=10).text
    assert 'sglang:num_running_reqs{engine_type="router",model_name="dsv4-mini"} 0.0' in router_stats
