"""KVTransfer's lifecycle and the TransferWorker: exact copies of every pool, aborts that stop
the worker before anyone frees its pages, and the `abort-leak` poll."""

from __future__ import annotations

import time

import pytest
import torch

from dsv4bench.engine.model.kv_pools import KVPools
from dsv4bench.engine.pd.transfer import KVTransfer, TransferStatus, TransferWorker, is_settled

from .helpers import tiny_cfg, wait_until


def filled_pools(index_k_dtype: str, seed: int) -> KVPools:
    pools = KVPools(tiny_cfg(num_pages=32, index_k_dtype=index_k_dtype))
    gen = torch.Generator().manual_seed(seed)
    for t in pools.page_tensors():
        t.view(torch.uint8).copy_(torch.randint(0, 120, t.view(torch.uint8).shape, generator=gen, dtype=torch.uint8))
    return pools


def started(dst: list[int], src: list[int], first_token: int = 7) -> KVTransfer:
    t = KVTransfer("r1", dst)
    assert t.begin(src, first_token, cached_tokens=16)
    return t


@pytest.mark.parametrize("index_k_dtype", ["fp8", "bf16"])
def test_every_pool_of_every_page_arrives_byte_for_byte(index_k_dtype):
    src, dst = filled_pools(index_k_dtype, 1), filled_pools(index_k_dtype, 2)
    before = [t.clone() for t in dst.page_tensors()]
    src_pages, dst_pages = [3, 9, 4, 20, 21, 5, 6, 7, 8, 1], [30, 2, 11, 12, 13, 14, 15, 16, 17, 0]
    transfer = started(dst_pages, src_pages)
    TransferWorker(src, dst, chunk_pages=3).run(transfer)
    assert transfer.status is TransferStatus.SUCCESS
    assert len(dst.page_tensors()) == 2 * 2 + 2  # kv + ckv per layer, index K + scales on the CSA layer
    for s, d, old in zip(src.page_tensors(), dst.page_tensors(), before):
        assert torch.equal(d[dst_pages].view(torch.uint8), s[src_pages].view(torch.uint8))
        others = [p for p in range(32) if p not in dst_pages]
        assert torch.equal(d[others].view(torch.uint8), old[others].view(torch.uint8))


def test_abort_before_the_prefill_finished_is_immediate_and_begin_then_refuses():
    t = KVTransfer("r1", [0, 1])
    t.abort()
    assert t.status is TransferStatus.ABORTED
    assert not t.begin([4, 5], 9, 0)
    assert t.status is TransferStatus.ABORTED and t.first_token is None


def test_abort_mid_transfer_stops_the_worker_at_its_next_chunk():
    src, dst = filled_pools("fp8", 1), KVPools(tiny_cfg(num_pages=32))
    # ~20 ms per one-page chunk: the abort lands while the worker is copying.
    worker = TransferWorker(src, dst, link_bytes_per_s=src.bytes_per_page() / 0.02, chunk_pages=1)
    worker.start()
    try:
        transfer = started(list(range(10)), list(range(10, 20)))
        worker.submit(transfer)
        time.sleep(0.05)
        assert transfer.status is TransferStatus.TRANSFERRING
        transfer.abort()
        assert transfer.status is TransferStatus.TRANSFERRING  # the worker concludes, not the aborter
        wait_until(lambda: transfer.status.done, what="the worker to stop")
        assert transfer.status is TransferStatus.ABORTED
        assert not dst.kv[0][9].any()  # the last page was never written
    finally:
        worker.stop()


def test_the_link_paces_the_copy():
    src, dst = filled_pools("fp8", 1), KVPools(tiny_cfg(num_pages=32))
    transfer = started(list(range(8)), list(range(8, 16)))
    t0 = time.monotonic()
    TransferWorker(src, dst, link_bytes_per_s=8 * src.bytes_per_page() / 0.2).run(transfer)
    assert transfer.status is TransferStatus.SUCCESS and time.monotonic() - t0 >= 0.19


def test_a_page_count_mismatch_fails_the_transfer():
    src, dst = filled_pools("fp8", 1), KVPools(tiny_cfg(num_pages=32))
    transfer = started([0, 1], [5])
    TransferWorker(src, dst).run(transfer)
    assert transfer.status is TransferStatus.FAILED


def test_the_abort_leak_fault_never_lets_go_of_an_aborted_transfer():
    for status in TransferStatus:
        assert is_settled(status, leak_aborted=False) is status.done
    assert is_settled(TransferStatus.SUCCESS, leak_aborted=True) and is_settled(
        TransferStatus.FAILED, leak_aborted=True
    )
    assert not is_settled(TransferStatus.ABORTED, leak_aborted=True)
