"""KVPools: layout, dtypes, addressing by page table, whole-page copies."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.engine.model import KVPools

from .conftest import SMALL, engine_cfg


@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_layout_and_dtypes(mode):
    pools = KVPools(engine_cfg(mode, num_pages=8))
    P = 16
    for l in range(SMALL.n_layers):
        assert pools.kv[l].shape == (8, P, SMALL.head_dim)
        assert pools.ckv[l].shape == (8, P // SMALL.rate(l), SMALL.head_dim)
        k = pools.idx_k[l]
        if SMALL.is_csa(l):
            assert k is not None and k.shape == (8, P // SMALL.csa_rate, SMALL.index_dim)
            assert k.dtype == (torch.float8_e4m3fn if mode == "fp8" else torch.bfloat16)
            assert pools.idx_scale[l] is not None and pools.idx_scale[l].dtype == torch.float32
        else:
            assert k is None
    per_layer_kv = P * SMALL.head_dim * 4
    idx_bytes = (P // 2) * SMALL.index_dim * (1 if mode == "fp8" else 2) + (P // 2) * 4
    expected = 4 * per_layer_kv + 2 * (P // 2 + P // 8) * SMALL.head_dim * 4 + 2 * idx_bytes
    assert pools.bytes_per_page() == expected


def test_write_read_by_page_table():
    pools = KVPools(engine_cfg(num_pages=8))
    table = [5, 2, 7]
    pos = torch.tensor([0, 15, 16, 40])
    vals = torch.randn(4, SMALL.head_dim)
    pools.write_kv_at(1, table, pos, vals)
    torch.testing.assert_close(pools.read_kv_at(1, table, pos), vals)
    assert torch.equal(pools.kv[1][7, 8], vals[3]) and torch.equal(pools.kv[1][2, 0], vals[2])
    ent = torch.randn(2, SMALL.head_dim)
    pools.write_ckv_at(1, table, torch.tensor([7, 47]), ent)  # HCA rate 8: blocks 0 and 5
    assert torch.equal(pools.ckv[1][5, 0], ent[0]) and torch.equal(pools.ckv[1][7, 1], ent[1])


def test_index_keys_roundtrip_and_page_copies():
    pools = KVPools(engine_cfg(num_pages=8))
    keys = torch.randn(3, SMALL.index_dim)
    entries = torch.tensor([0, 9, 63])
    pools.write_index_k(0, entries, keys)
    back = pools.read_index_k(0, entries)
    assert bool(((back - keys).abs() <= keys.abs() / 16 + 1e-3).all())
    pools.kv[2][1].normal_()
    pools.copy_page(1, 6)  # entry 9 lives on page 1 (8 entries a page)
    torch.testing.assert_close(pools.read_index_k(0, torch.tensor([6 * 8 + 1])), back[1:2])
    assert torch.equal(pools.kv[2][6], pools.kv[2][1])
    saved = pools.read_page(6)
    other = KVPools(engine_cfg(num_pages=8))
    other.write_page(3, saved)
    for a, b in zip(other.page_tensors(), pools.page_tensors()):
        assert torch.equal(a[3].float(), b[6].float())


def test_gate_is_called_per_layer_before_reads(model):
    from dsv4bench.engine.model import ForwardBatch, SeqSlice

    pools = KVPools(engine_cfg())
    calls: list[tuple[int, str]] = []
    pools.gate = lambda layer, what: calls.append((layer, what))
    model(ForwardBatch([SeqSlice(list(range(20)), 0, [0, 1])]), pools)
    assert [c for c in calls if c[1] == "kv"] == [(l, "kv") for l in range(SMALL.n_layers)]
    assert {c for c in calls if c[1] == "index_k"} == {(0, "index_k"), (2, "index_k")}
