"""The decode engine's queues, driven by hand: a request in each of prealloc, transfer and
running is aborted, and both servers end with nothing queued and no page leaked."""

from __future__ import annotations

import pytest

from dsv4bench.engine.pd.transfer import TransferStatus
from dsv4bench.engine.request import FinishReason

from .helpers import ListSink, Pump, assert_clean, build_tiny, greedy, prompt


@pytest.fixture
def pd():
    built = build_tiny(max_running_requests=1)  # a second request waits in the prealloc queue
    yield built
    built.stop()


def start(pd, rid: str, max_tokens: int = 8, n_prompt: int = 60) -> ListSink:
    sink = ListSink()
    pd.dispatch(rid, prompt(n_prompt, seed=len(rid) + ord(rid[-1])), greedy(max_tokens), sink)
    return sink


def abort_both(pd, rid: str) -> None:
    pd.prefill.abort(rid)
    pd.decode.abort(rid)


def test_abort_in_the_prealloc_queue(pd):
    pump = Pump(pd)
    a = start(pd, "a", max_tokens=200)
    pump.until(lambda: "a" in pd.decode.decoding)
    b = start(pd, "b")
    pump.round()
    assert "b" in pd.decode.prealloc_queue and pd.decode.stats.num_decode_prealloc_queue == 1
    assert "b" in pd.prefill.bootstrap_queue  # no reservation yet, so no handshake either
    abort_both(pd, "b")
    pump.until(lambda: "b" not in pd.prefill.bootstrap_queue)
    assert b.finish is FinishReason.ABORT and not pd.decode.prealloc_queue and "a" in pd.decode.decoding
    abort_both(pd, "a")
    pump.until_quiet()
    assert a.finish is FinishReason.ABORT and a.tokens
    assert_clean(pd)


def test_abort_in_the_transfer_queue_while_the_prefill_computes(pd):
    sink = start(pd, "r1")
    pump = Pump(pd)
    pump.decode()  # pages reserved, the room answered
    transfer = pd.decode.transfer_queue["r1"].transfer
    assert transfer.status is TransferStatus.WAITING_FOR_INPUT and pd.decode.stats.num_decode_transfer_queue == 1
    held = pd.decode.allocator.num_used
    assert held == -(-60 // 16)
    abort_both(pd, "r1")
    pump.decode()
    assert sink.finish is FinishReason.ABORT  # the client hears it at once
    assert transfer.status is TransferStatus.WAITING_FOR_INPUT and "r1" in pd.decode.transfer_queue  # the room decides
    pump.decode()
    assert transfer.status is TransferStatus.ABORTED and pd.decode.allocator.num_used == 0
    pump.until_quiet()
    assert sink.finish is FinishReason.ABORT and not sink.tokens
    assert_clean(pd)


def test_abort_while_running(pd):
    sink = start(pd, "r1", max_tokens=200)
    pump = Pump(pd)
    pump.until(lambda: len(sink.tokens) >= 3)
    assert pd.decode.stats.num_running == 1 and pd.decode.allocator.num_used > 0
    abort_both(pd, "r1")
    pump.until_quiet()
    assert sink.finish is FinishReason.ABORT and 3 <= len(sink.tokens) < 200
    assert_clean(pd)


def test_an_abort_on_the_decode_server_alone_stops_the_prefill_work(pd):
    sink = start(pd, "r1", n_prompt=200)
    pump = Pump(pd)
    pump.decode()
    pd.decode.abort("r1")  # e.g. /abort_request on the decode server
    pump.decode()
    pump.prefill()  # the room's transfer is aborted: not worth computing
    assert "r1" not in pd.prefill.prefilling and not pd.prefill.scheduler.has_work
    pump.until_quiet()
    assert sink.finish is FinishReason.ABORT
    assert_clean(pd)


def test_a_first_token_that_ends_the_request_frees_the_decode_pages_at_once(pd):
    sink = start(pd, "r1", max_tokens=1)
    Pump(pd).until_quiet()
    assert len(sink.events) == 1 and len(sink.tokens) == 1 and sink.finish is FinishReason.LENGTH
    assert_clean(pd)


def test_requests_queue_behind_the_running_slot_and_all_finish(pd):
    sinks = [start(pd, f"r{i}", max_tokens=5) for i in range(4)]
    Pump(pd).until_quiet()
    assert all(s.finish is FinishReason.LENGTH and len(s.tokens) == 5 for s in sinks)
    assert pd.decode.stats.num_requests_total == 4 and pd.decode.stats.gen_tokens_total == 20
    assert_clean(pd)
