"""The bootstrap handshake: rooms, prealloc answers, aborts in every room state, and the
`bootstrap-stall` worker that dies on an ABORT it does not expect (for a request decoding)."""

from __future__ import annotations

import pytest

from dsv4bench.engine.pd.bootstrap import BootstrapWorker, Room, RoomState, UnexpectedAbort
from dsv4bench.engine.pd.transfer import KVTransfer, TransferStatus

from .helpers import wait_until


def handshake(worker: BootstrapWorker, rid: str) -> tuple[Room, KVTransfer]:
    room, transfer = Room(rid), KVTransfer(rid, [1, 2])
    worker.open(room)
    worker.prealloc(rid, transfer)
    return room, transfer


def test_the_decode_answer_bootstraps_the_room():
    worker = BootstrapWorker()
    room = Room("r1")
    worker.open(room)
    worker.drain()
    assert room.state is RoomState.BOOTSTRAPPING and worker.rooms == {"r1": room}
    transfer = KVTransfer("r1", [3])
    worker.prealloc("r1", transfer)
    worker.drain()
    assert room.state is RoomState.BOOTSTRAPPED and room.transfer is transfer
    assert transfer.status is TransferStatus.WAITING_FOR_INPUT
    worker.close("r1")
    worker.drain()
    assert not worker.rooms


def test_an_abort_before_the_decode_answer_aborts_the_answer_too():
    worker = BootstrapWorker()
    room = Room("r1")
    worker.open(room)
    worker.abort("r1")
    late = KVTransfer("r1", [3])
    worker.prealloc("r1", late)
    worker.drain()
    assert room.state is RoomState.ABORTED and late.status is TransferStatus.ABORTED


@pytest.mark.parametrize("stall", [False, True])
def test_an_abort_before_the_kv_moved_aborts_the_room_and_its_transfer(stall):
    worker = BootstrapWorker(stall_on_unexpected_abort=stall)  # the fault does not touch this path
    room, transfer = handshake(worker, "r1")
    worker.abort("r1")
    worker.drain()
    assert room.state is RoomState.ABORTED and transfer.status is TransferStatus.ABORTED


@pytest.mark.parametrize("stall", [False, True])
def test_an_abort_while_decoding_is_ignored_unless_the_fault_is_on(stall):
    worker = BootstrapWorker(stall_on_unexpected_abort=stall)
    room, transfer = handshake(worker, "r1")
    worker.decoding("r1")
    worker.drain()
    assert room.state is RoomState.DECODING
    worker.abort("r1")
    if stall:
        with pytest.raises(UnexpectedAbort):
            worker.drain()
    else:
        worker.drain()
    assert room.state is RoomState.DECODING and transfer.status is TransferStatus.WAITING_FOR_INPUT


def test_answers_for_closed_or_unknown_rooms_are_aborted_and_aborts_for_them_ignored():
    worker = BootstrapWorker(stall_on_unexpected_abort=True)  # even the faulty worker ignores these
    room, _ = handshake(worker, "r1")
    worker.close("r1")
    worker.abort("r1")
    worker.abort("never-seen")
    orphan = KVTransfer("never-opened", [1])
    worker.prealloc("never-opened", orphan)
    worker.drain()
    # closed before its KV moved: aborted, so a prefill request still waiting on it ends
    assert not worker.rooms and orphan.status is TransferStatus.ABORTED and room.state is RoomState.ABORTED
    assert room.transfer is not None and room.transfer.status is TransferStatus.ABORTED


def test_closing_a_room_whose_kv_moved_changes_nothing():
    worker = BootstrapWorker(stall_on_unexpected_abort=True)
    room, transfer = handshake(worker, "r2")
    worker.decoding("r2")
    worker.close("r2")
    worker.drain()
    assert not worker.rooms and room.state is RoomState.DECODING and transfer.status is TransferStatus.WAITING_FOR_INPUT


def test_the_stalled_worker_thread_dies_and_every_later_room_waits_for_ever():
    worker = BootstrapWorker(stall_on_unexpected_abort=True)
    worker.start()
    try:
        room, _ = handshake(worker, "r1")
        worker.decoding("r1")
        wait_until(lambda: room.state is RoomState.DECODING, what="the handshake")
        worker.abort("r1")  # a client left while its answer streamed: the worker did not expect this
        wait_until(lambda: not worker.alive(), what="the worker to die")
        assert isinstance(worker.error, UnexpectedAbort)
        later, _ = handshake(worker, "r2")
        assert later.state is RoomState.BOOTSTRAPPING and not worker.inbox.empty()
    finally:
        worker.stop()


def test_the_clean_worker_thread_survives_the_same_abort():
    worker = BootstrapWorker()
    worker.start()
    try:
        room, _ = handshake(worker, "r1")
        worker.decoding("r1")
        worker.abort("r1")
        later, _ = handshake(worker, "r2")
        wait_until(lambda: later.state is RoomState.BOOTSTRAPPED, what="the next handshake")
        assert worker.alive() and room.state is RoomState.DECODING
    finally:
        worker.stop()
