"""Compressor: an entry is a function of its own block only, in isolation and in the pools."""

from __future__ import annotations

import torch

from dsv4bench.engine.model import ForwardBatch, KVPools, SeqSlice
from dsv4bench.engine.model.compressor import Compressor

from .conftest import SMALL, engine_cfg, random_tokens


def test_entry_depends_only_on_its_block():
    torch.manual_seed(0)
    comp = Compressor(32, 4)
    blocks = torch.randn(6, 4, 32)
    base = comp(blocks)
    changed = blocks.clone()
    changed[2] += torch.randn(4, 32)
    after = comp(changed)
    assert not torch.allclose(after[2], base[2])
    keep = [0, 1, 3, 4, 5]
    torch.testing.assert_close(after[keep], base[keep], atol=0, rtol=0)


def test_gates_are_a_convex_pooling():
    """With the output map set to identity, an entry lies inside its block's per-dim range."""
    torch.manual_seed(1)
    comp = Compressor(8, 4)
    with torch.no_grad():
        comp.out.weight.copy_(torch.eye(8))
        comp.slot_bias.normal_()
    blocks = torch.randn(10, 4, 8)
    entry = comp(blocks)
    assert bool((entry <= blocks.amax(1) + 1e-6).all() and (entry >= blocks.amin(1) - 1e-6).all())


def test_pooled_entries_depend_only_on_their_blocks(model):
    """Layer 0's KV at a position depends only on that token, so two sequences that share the
    tokens of block b share its compressed entry, whatever the rest of the sequences."""
    r = SMALL.rate(0)
    a = random_tokens(64, seed=20)
    b = random_tokens(64, seed=21)
    b[10:12] = a[10:12]  # block 5 of rate 2 is identical
    pools = KVPools(engine_cfg())
    model(ForwardBatch([SeqSlice(a, 0, [0, 1, 2, 3]), SeqSlice(b, 0, [4, 5, 6, 7])]), pools)
    ea = pools.read_ckv_at(0, [0, 1, 2, 3], torch.tensor([10]))
    eb = pools.read_ckv_at(0, [4, 5, 6, 7], torch.tensor([10]))
    torch.testing.assert_close(ea, eb, atol=1e-6, rtol=0)
    other = pools.read_ckv_at(0, [4, 5, 6, 7], torch.tensor([12]))
    assert not torch.allclose(other, pools.read_ckv_at(0, [0, 1, 2, 3], torch.tensor([12])))
    assert r == 2


def test_incomplete_block_has_no_entry_yet(model):
    """The entry of a block is written only by the token that completes it."""
    pools = KVPools(engine_cfg())
    tokens = random_tokens(15, seed=22)
    model(ForwardBatch([SeqSlice(tokens, 0, [3])]), pools)
    hca = 1  # layer 1 is HCA, rate 8: block 1 (positions 8..15) is still open
    assert bool(pools.ckv[hca][3, 0].any()) and not bool(pools.ckv[hca][3, 1].any())
    model(ForwardBatch([SeqSlice([7], 15, [3])]), pools)
    assert bool(pools.ckv[hca][3, 1].any())
