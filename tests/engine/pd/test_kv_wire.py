"""The wire between the prefill and decode processes: frames over a real socket pair, refused
frames, and pages packed on one pool and unpacked on another byte for byte."""

from __future__ import annotations

import json
import socket
import struct

import pytest
import torch

from dsv4bench.engine.model.kv_pools import KVPools
from dsv4bench.engine.pd.bootstrap_server import RemoteKVTransfer
from dsv4bench.engine.pd.kv_wire import MAX_HEADER_BYTES, PageCodec, WireError, recv, send
from dsv4bench.engine.pd.transfer import TransferStatus, TransferWorker

from .helpers import tiny_cfg


def test_frames_round_trip_and_eof_is_a_wire_error():
    a, b = socket.socketpair()
    with a, b:
        send(a, {"op": "prealloc", "room": 2**63 - 1, "num_pages": 3})
        send(a, {"op": "kv", "offset": 0}, b"\x00\xff" * 1000)
        assert recv(b) == ({"op": "prealloc", "room": 2**63 - 1, "num_pages": 3}, b"")
        assert recv(b) == ({"op": "kv", "offset": 0}, b"\x00\xff" * 1000)
        a.close()
        with pytest.raises(WireError, match="closed"):
            recv(b)


@pytest.mark.parametrize(
    "frame,needle",
    [
        (struct.pack(">I", MAX_HEADER_BYTES + 1), "over the"),
        (struct.pack(">I", 5) + b"nope!" + struct.pack(">Q", 0), "not JSON"),
        (struct.pack(">I", 2) + b"[]" + struct.pack(">Q", 0), "no JSON object"),
        (struct.pack(">I", 12) + json.dumps({"op": "kv"}).encode() + struct.pack(">Q", 2**62), "payload is over"),
    ],
)
def test_refused_frames(frame, needle):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frame)
        with pytest.raises(WireError, match=needle):
            recv(b)


def test_pages_move_byte_for_byte_between_pools():
    cfg = tiny_cfg(num_pages=8)
    src, dst = KVPools(cfg), KVPools(cfg)
    torch.manual_seed(0)
    for t in src.page_tensors():
        t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, dtype=torch.uint8))
    codec_src, codec_dst = PageCodec(src), PageCodec(dst)
    before = [d[1].clone() for d in dst.page_tensors()]
    data = codec_src.pack([5, 1, 2])
    assert len(data) == 3 * src.bytes_per_page()
    codec_dst.unpack([0, 7, 3], data)
    for s, d in zip(src.page_tensors(), dst.page_tensors()):
        for i, j in ((5, 0), (1, 7), (2, 3)):
            assert torch.equal(s[i].view(torch.uint8), d[j].view(torch.uint8))
    assert all(torch.equal(d[1], b) for d, b in zip(dst.page_tensors(), before))  # untouched pages stay
    with pytest.raises(WireError, match="bytes for"):
        codec_dst.unpack([0], data)


@pytest.mark.parametrize("gone", ["the decode closed its end", "the reader closed ours"])
def test_pages_that_cannot_be_sent_abort_the_transfer_not_fail_it(gone):
    """The decode left mid-transfer: its process died (the peer's end is closed), or the
    connection's reader saw the drop and closed the socket while the worker still sent. Either
    way nobody waits for these pages; the transfer ends ABORTED, as the room it belongs to."""
    pools = KVPools(tiny_cfg(num_pages=8))
    ours, peer = socket.socketpair()
    with ours, peer:
        (peer if gone == "the decode closed its end" else ours).close()
        transfer = RemoteKVTransfer("room-1", 4, ours)
        assert transfer.begin([0, 1, 2, 3], first_token=5, cached_tokens=0)
        TransferWorker(pools, None, chunk_pages=2).run(transfer)
        assert transfer.status is TransferStatus.ABORTED
