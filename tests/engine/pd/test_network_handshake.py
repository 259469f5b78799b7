"""The prefill and decode engines joined only by loopback TCP (the bootstrap port and the KV it
carries), as two processes are: the same greedy answer as the in-process PD engine whichever
server hears of the request first, aborts on either side reaching the other, a decode that
dies mid-request, and no room, page or request left behind."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from dsv4bench.engine.model_runner import ModelRunner
from dsv4bench.engine.pd.bootstrap import BootstrapWorker, Room
from dsv4bench.engine.pd.bootstrap_client import BootstrapClient, RoomAddress
from dsv4bench.engine.pd.bootstrap_server import BootstrapServer, room_rid
from dsv4bench.engine.pd.decode import DecodeEngine
from dsv4bench.engine.pd.kv_wire import send
from dsv4bench.engine.pd.prefill import PrefillEngine
from dsv4bench.engine.pd.transfer import TransferStatus, TransferWorker
from dsv4bench.engine.request import FinishReason, Request
from dsv4bench.engine.serve import load_model

from .helpers import ListSink, build_tiny, greedy, prompt, tiny_cfg, wait_until


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
            self.client.open(f"d{room}", RoomAddress("127.0.0.1", self.server.port, room))
            self.decode.submit(Request(f"d{room}", list(ids), params), sink)

        def to_prefill() -> None:
            r = Room(room_rid(room))
            self.server.open(r)
            self.prefill.submit(Request(r.rid, list(ids), replace(params, max_tokens=1)), r)

        for part in ((to_decode, to_prefill) if decode_first else (to_prefill, to_decode)):
            part()
        return sink

    def quiet(self) -> bool:
        p, d = self.prefill, self.decode
        return not (p.bootstrap_queue or p.prefilling or p.inflight_queue or d.prealloc_queue or d.transfer_queue
                    or d.decoding or self.worker.rooms or p.stats.in_flight or d.stats.in_flight)

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
    decode = DecodeEngine(cfg, decode_runner, client, eos_token_id=1)  # type: ignore[arg-type]
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
    pd.router.dispatch("ref", ids, greedy(max_tokens), sink)
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


def test_an_abort_on_the_decode_side_reaches_the_prefill_room(split):
    sink = split.send(21, prompt(40, seed=4), 400, decode_first=True)
    split.decode.abort("d21").result(5)
    assert sink.finish is FinishReason.ABORT
    split.prefill.abort(room_rid(21)).result(5)  # the router aborts both; the room is gone either way
    split.assert_clean()


def test_an_abort_on_the_prefill_side_fails_the_decode_request(split):
    ids = prompt(40, seed=5)
    sink = ListSink()
    split.client.open("d31", RoomAddress("127.0.0.1", split.server.port, 31))
    split.decode.submit(Request("d31", ids, greedy(4)), sink)
    room = Room(room_rid(31))
    split.server.open(room)  # opened, but its prefill request is aborted before it runs
    split.worker.abort(room.rid)
    wait_until(lambda: sink.finish is not None, what="the decode request to end")
    assert sink.finish is FinishReason.ABORT
    split.server.release(room.rid)
    split.assert_clean()


def test_a_decode_that_dies_mid_request_aborts_its_room(split):
    """A connection that drops without `close` (the decode process died): the prefill room is
    aborted and closed, its prefill request leaves."""
    room = Room(room_rid(41))
    split.server.open(room)
    split.prefill.submit(Request(room.rid, prompt(400, seed=6), greedy(1)), room)
    with socket.create_connection(("127.0.0.1", split.server.port)) as sock:
        send(sock, {"op": "prealloc", "room": 41, "num_pages": 25, "bytes_per_page": 1})
        wait_until(lambda: room.state.name != "BOOTSTRAPPING", what="the room to bootstrap")
    split.assert_clean()
    # Aborted, not merely failed at the first page it could not send: nothing computed for nobody.
    assert room.transfer is not None and room.transfer.status is TransferStatus.ABORTED


def test_a_decode_that_refuses_before_reserving_tells_the_room(split):
    """A prompt the decode pool can never hold: refused at once, and the prefill room hears it."""
    room = Room(room_rid(51))
    split.server.open(room)
    ids = prompt(tiny_cfg().num_pages * 16 + 10, seed=7)
    split.prefill.submit(Request(room.rid, ids, greedy(1)), room)
    sink = ListSink()
    split.client.open("d51", RoomAddress("127.0.0.1", split.server.port, 51))
    split.decode.submit(Request("d51", ids, greedy(4)), sink)
    wait_until(lambda: sink.finish is FinishReason.ABORT, what="the refusal")
    wait_until(lambda: room.state.name == "ABORTED", what="the room to hear it")
    split.server.release(room.rid)
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
