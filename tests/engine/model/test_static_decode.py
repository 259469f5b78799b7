"""The static-shape decode step (forward_static_decode: what a CUDA graph captures) computes
what forward() computes, on CPU: same logits, same pool writes, with padding rows, page tables
wider than needed, and sequences at every stage of their blocks."""

from __future__ import annotations

import copy

import pytest
import torch

from dsv4bench.engine.model import ForwardBatch, KVPools, SeqSlice
from dsv4bench.engine.model.fused_projections import fuse_projections
from dsv4bench.engine.model.plan import build_static_decode_plan

from .conftest import SMALL, engine_cfg, random_tokens


def _pool_tensors(pools: KVPools) -> list[torch.Tensor]:
    """Every pooled tensor without the scratch page (fp8 compared as bytes)."""
    n = pools.num_pages
    return [(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)[:n] for t in pools.page_tensors()]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("index_k_dtype", ["fp8", "bf16"])
def test_static_decode_equals_forward(model, index_k_dtype, fused):
    if fused:  # the projections sharing an input as one product (fused_projections.py)
        model = copy.deepcopy(model)
        fuse_projections(model)
    cfg = engine_cfg(index_k_dtype)
    eager, static = KVPools(cfg, scratch_page=True), KVPools(cfg, scratch_page=True)
    lengths = [3, 15, 16, 40, 77]  # before, at and past window, block and page bounds
    tables = [list(range(i * 12, i * 12 + 12))[::-1] for i in range(len(lengths))]
    seqs = [random_tokens(n + 30, seed=n) for n in lengths]
    for pools in (eager, static):
        model.forward(ForwardBatch([SeqSlice(s[:n], 0, t) for s, n, t in zip(seqs, lengths, tables)]), pools)
    B, NP = 8, 12  # 3 padding rows; the longest sequence needs 8 pages
    for step in range(30):
        pos = [n + step for n in lengths]
        toks = [s[p] for s, p in zip(seqs, pos)]
        ref = model.forward(ForwardBatch([SeqSlice([tk], p, t) for tk, p, t in zip(toks, pos, tables)]), eager)
        pt = torch.full((B, NP), static.scratch_page, dtype=torch.int32)
        for i, (p, t) in enumerate(zip(pos, tables)):
            need = p // cfg.page_size + 1
            pt[i, :need] = torch.tensor(t[:need])
        tok = torch.tensor(toks + [0] * (B - len(toks)), dtype=torch.int32)
        p_t = torch.tensor(pos + [0] * (B - len(pos)), dtype=torch.int32)
        got = model.forward_static_decode(tok, p_t, pt, static)[: len(toks)]
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
        for a, b in zip(_pool_tensors(eager), _pool_tensors(static)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_static_plan_sends_unneeded_writes_to_the_scratch_page():
    P, scratch = 16, 99
    pos = torch.tensor([6, 7, 15, 0])  # CSA rate 2, HCA rate 8
    pt = torch.tensor([[3, scratch], [4, scratch], [5, scratch], [scratch, scratch]])
    plan = build_static_decode_plan(torch.zeros(4, dtype=torch.long), pos, pt, SMALL, P, scratch)
    assert plan.static and not plan.extends
    assert plan.new_slots.tolist() == [3 * P + 6, 4 * P + 7, 5 * P + 15, scratch * P]
    hca = plan.compress[8]
    # only position 7 and 15 complete an HCA block
    assert hca.entries.tolist() == [scratch * 2, 4 * 2 + 0, 5 * 2 + 1, scratch * 2]
    assert hca.kv_slots[1].tolist() == list(range(4 * P, 4 * P + 8))
    csa = plan.compress[2]
    assert csa.entries.tolist() == [scratch * 8, 4 * 8 + 3, 5 * 8 + 7, scratch * 8]


def test_prefill_chunks_as_rows_equal_forward(model):
    """Chunks of several tokens, one row per token (as cuda_graphs.py runs a mixed step),
    beside decode rows: the logits of every token and the pools match forward()'s."""
    cfg = engine_cfg()
    eager, static = KVPools(cfg, scratch_page=True), KVPools(cfg, scratch_page=True)
    toks = [random_tokens(200, seed=20 + i) for i in range(3)]
    tables = [list(range(i * 14, i * 14 + 14)) for i in range(3)]
    steps = [
        [(0, 37), (0, 1), (0, 16)],
        [(37, 40), (1, 1), (16, 1)],
        [(77, 1), (2, 90), (17, 31)],
        [(78, 50), (92, 1), (48, 1)],
    ]  # (start, length) of each sequence per step
    for plan in steps:
        ref = model.forward_all_logits(
            ForwardBatch([SeqSlice(t[s : s + n], s, tb) for t, (s, n), tb in zip(toks, plan, tables)]), eager
        )
        rows = [(t[p], p, tb) for t, (s, n), tb in zip(toks, plan, tables) for p in range(s, s + n)]
        B, NP = len(rows) + 3, 14
        pt = torch.full((B, NP), static.scratch_page, dtype=torch.int32)
        for i, (_, p, tb) in enumerate(rows):
            pt[i, :NP] = torch.tensor(tb)
        tok = torch.tensor([r[0] for r in rows] + [0] * 3, dtype=torch.int32)
        pos = torch.tensor([r[1] for r in rows] + [0] * 3, dtype=torch.int32)
        got = model.forward_static_decode(tok, pos, pt, static)[: len(rows)]
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
        for a, b in zip(_pool_tensors(eager), _pool_tensors(static)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_pack_rows_lays_out_decode_and_prefill_rows():
    from types import SimpleNamespace

    import numpy as np

    from dsv4bench.engine.cuda_graphs import pack_rows, pages_needed

    def entry(tokens, start, pages):
        return SimpleNamespace(token_ids=tokens, start_pos=start, req=SimpleNamespace(pages=pages))

    P, S = 16, 99
    decodes = [entry([5], 0, [3, 4]), entry([6], 31, [7, 8, 9])]
    buf = np.full((4, 2 + 4), -7, dtype=np.int32)
    pack_rows(decodes, pages_needed(decodes, P), buf, S)
    assert buf.tolist() == [[5, 0, 3, S, S, S], [6, 31, 7, 8, S, S], [0, 0, S, S, S, S], [0, 0, S, S, S, S]]
    mixed = [entry([5], 16, [3, 4]), entry([1, 2, 3], 30, [7, 8, 9])]  # the chunk ends at 32
    need = pages_needed(mixed, P)
    assert need.tolist() == [2, 3]
    buf = np.full((5, 2 + 4), -7, dtype=np.int32)
    pack_rows(mixed, need, buf, S)
    assert buf.tolist() == [
        [5, 16, 3, 4, S, S],
        [1, 30, 7, 8, 9, S],
        [2, 31, 7, 8, 9, S],
        [3, 32, 7, 8, 9, S],
        [0, 0, S, S, S, S],
    ]
