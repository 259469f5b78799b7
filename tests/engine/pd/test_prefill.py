"""The prefill engine's queues, driven by hand: a request in each of bootstrap, prefill and
inflight is aborted, and both servers end with nothing queued and no page leaked."""

from __future__ import annotations

import pytest

from dsv4bench.engine.pd.bootstrap import RoomState
from dsv4bench.engine.pd.transfer import TransferStatus
from dsv4bench.engine.request import FinishReason

from .helpers import ListSink, Pump, assert_clean, build_tiny, greedy, prompt


@pytest.fixture
def pd():
    built = build_tiny(chunked_prefill_tokens=32)  # a 100-token prompt takes four prefill steps
    yield built
    built.stop()


def start(pd, rid: str, n_prompt: int = 100, max_tokens: int = 8) -> ListSink:
    sink = ListSink()
    pd.dispatch(rid, prompt(n_prompt, seed=len(rid)), greedy(max_tokens), sink)
    return sink


def abort_both(pd, rid: str) -> None:
    pd.prefill.abort(rid)
    pd.decode.abort(rid)


def test_a_request_completes_and_its_full_pages_stay_in_the_prefill_cache(pd):
    sink = start(pd, "r1")
    Pump(pd).until_quiet()
    assert sink.finish is FinishReason.LENGTH and len(sink.tokens) == 8
    assert_clean(pd)
    assert pd.prefill.cache.num_cached_pages == 100 // 16  # the partial last page is freed
    assert pd.transfers.inbox.empty() and pd.decode.stats.gen_tokens_total == 8


@pytest.mark.parametrize("decode_answered", [False, True], ids=["bootstrapping", "bootstrapped"])
def test_abort_in_the_bootstrap_queue(pd, decode_answered):
    sink = start(pd, "r1")
    pump = Pump(pd)
    pump.prefill()  # into the bootstrap queue; the decode has not reserved anything yet
    if decode_answered:
        pump.decode()
        pump.bootstrap()
    entry = pd.prefill.bootstrap_queue["r1"]
    assert entry.room.state is (RoomState.BOOTSTRAPPED if decode_answered else RoomState.BOOTSTRAPPING)
    assert pd.prefill.stats.num_prefill_bootstrap_queue == 1
    abort_both(pd, "r1")
    pump.until_quiet()
    assert sink.finish is FinishReason.ABORT and not sink.tokens
    assert pd.prefill.stats.num_aborted_total == 1 and pd.decode.stats.num_aborted_total == 1
    assert_clean(pd)


def test_abort_during_prefill(pd):
    sink = start(pd, "r1")
    pump = Pump(pd)
    pump.decode()
    pump.prefill()  # bootstrapped and one 32-token chunk computed
    assert "r1" in pd.prefill.prefilling and pd.prefill.scheduler.get("r1").num_computed == 32
    assert pd.prefill.allocator.num_used > 0 and pd.decode.stats.num_decode_transfer_queue == 1
    abort_both(pd, "r1")
    pump.until_quiet()
    assert sink.finish is FinishReason.ABORT
    assert_clean(pd)


def test_abort_in_the_inflight_queue_waits_for_the_worker_to_stop_writing(pd):
    sink = start(pd, "r1")
    pump = Pump(pd)
    pump.decode()
    pump.until(lambda: "r1" in pd.prefill.inflight_queue, pump.prefill)
    transfer = pd.prefill.inflight_queue["r1"].room.transfer
    assert transfer.status is TransferStatus.TRANSFERRING and pd.prefill.stats.num_prefill_inflight_queue == 1
    abort_both(pd, "r1")
    pump.prefill()
    pump.decode()
    # The worker still holds the transfer: both queues keep it (and its pages) until it stops.
    assert "r1" in pd.prefill.inflight_queue and "r1" in pd.decode.transfer_queue
    pump.transfer()
    assert transfer.status is TransferStatus.ABORTED
    pump.until_quiet()
    assert sink.finish is FinishReason.ABORT and not sink.tokens
    assert_clean(pd)


def test_an_abort_on_the_prefill_server_alone_reaches_the_decode_server_and_the_client(pd):
    sink = start(pd, "r1")
    pump = Pump(pd)
    pump.decode()
    pump.prefill()
    assert "r1" in pd.prefill.prefilling
    pd.prefill.abort("r1")  # e.g. /abort_request on the prefill server
    pump.until_quiet()
    assert sink.finish is FinishReason.ABORT
    assert_clean(pd)


def test_the_second_turn_reuses_the_prefill_cache_and_ships_the_same_kv(pd):
    first = prompt(100, seed=7)
    a, b = ListSink(), ListSink()
    pd.dispatch("t1", first, greedy(4), a)
    Pump(pd).until_quiet()
    pd.dispatch("t2", first + a.tokens + prompt(20, seed=8), greedy(4), b)
    Pump(pd).until_quiet()
    assert b.events[0].cached_tokens == 96 and b.finish is FinishReason.LENGTH
    assert_clean(pd)
