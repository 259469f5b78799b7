"""The paged serving path (forward with pools) computes exactly the dense math (forward_dense):
token by token, in mixed chunks, with scattered page tables, and with sequences batched."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4bench.engine.model import ForwardBatch, KVPools, SeqSlice

from .conftest import engine_cfg, random_tokens, run_chunks

ATOL = 1e-4


@pytest.mark.parametrize("index_k_dtype", ["fp8", "bf16"])
def test_token_by_token_equals_dense(model, index_k_dtype):
    tokens = random_tokens(150, seed=1)
    ref = model.forward_dense(torch.tensor(tokens), index_k_dtype=index_k_dtype).detach()
    pools = KVPools(engine_cfg(index_k_dtype))
    got = run_chunks(model, pools, tokens, [1] * 150, list(range(10)))
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_mixed_chunks_equal_dense(model):
    tokens = random_tokens(180, seed=2)
    chunks = [37] + [1] * 20 + [5] + [1] * 7 + [64, 3, 1, 2] + [1] * 41
    ref = model.forward_dense(torch.tensor(tokens)).detach()
    pools = KVPools(engine_cfg())
    got = run_chunks(model, pools, tokens, chunks, list(range(12)))
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_prefill_longer_than_window_in_one_chunk(model):
    """One 200-token chunk: several query blocks of the blocked band, many compressed blocks."""
    tokens = random_tokens(200, seed=3)
    ref = model.forward_dense(torch.tensor(tokens)).detach()
    got = run_chunks(model, KVPools(engine_cfg()), tokens, [200], list(range(13)))
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_scattered_page_tables_equal_contiguous(model):
    tokens = random_tokens(120, seed=4)
    chunks = [50, 1, 1, 9, 1, 30, 1, 1, 26]
    contiguous = run_chunks(model, KVPools(engine_cfg()), tokens, chunks, list(range(8)))
    scattered = random.Random(0).sample(range(128), 8)  # shuffled, non-contiguous ids
    got = run_chunks(model, KVPools(engine_cfg()), tokens, chunks, scattered)
    torch.testing.assert_close(got, contiguous, atol=ATOL, rtol=0)


def test_batched_sequences_equal_each_alone(model):
    """Three sequences in one pool and one batch per step (decodes and chunks mixed) give each
    sequence's logits as if it ran alone."""
    seqs = [random_tokens(n, seed=10 + n) for n in (90, 61, 75)]
    plans = [[40] + [1] * 50, [1] * 30 + [31], [20, 1, 1, 1, 2] + [1] * 50]
    tables = [list(range(0, 8)), list(range(40, 48)), [99, 7 + 60, 3 + 80, 120, 17, 101]]
    alone = [run_chunks(model, KVPools(engine_cfg()), s, p, t) for s, p, t in zip(seqs, plans, tables)]
    pools = KVPools(engine_cfg())
    cursors = [0, 0, 0]  # chunk index per sequence
    pos = [0, 0, 0]
    got: list[list[torch.Tensor]] = [[], [], []]
    while any(c < len(p) for c, p in zip(cursors, plans)):
        active = [i for i in range(3) if cursors[i] < len(plans[i])]
        batch = ForwardBatch(
            [SeqSlice(seqs[i][pos[i] : pos[i] + plans[i][cursors[i]]], pos[i], tables[i]) for i in active]
        )
        logits = model.forward_all_logits(batch, pools)
        offsets = batch.offsets()
        for j, i in enumerate(active):
            got[i].append(logits[offsets[j] : offsets[j + 1]])
            pos[i] += plans[i][cursors[i]]
            cursors[i] += 1
    for i in range(3):
        torch.testing.assert_close(torch.cat(got[i]), alone[i], atol=ATOL, rtol=0)


def test_last_token_logits_are_rows_of_all_logits(model):
    tokens = random_tokens(40, seed=5)
    batch = ForwardBatch([SeqSlice(tokens[:25], 0, [0, 1]), SeqSlice(tokens[:3], 0, [5])])
    last = model(batch, KVPools(engine_cfg()))
    every = model.forward_all_logits(batch, KVPools(engine_cfg()))
    assert last.shape == (2, 512)
    torch.testing.assert_close(last, every[[24, 27]], atol=1e-5, rtol=0)


def test_batch_validation_rejects_short_page_table(model):
    with pytest.raises(AssertionError):
        model(ForwardBatch([SeqSlice([1] * 20, 0, [0])]), KVPools(engine_cfg()))


def test_default_config_prefill_then_decode():
    """The shipped shape (window 128, HCA 32, CSA 4, top-32) also matches its dense math."""
    from dsv4bench.engine.config import EngineConfig, ModelConfig
    from dsv4bench.engine.model import DSV4Mini

    torch.manual_seed(1)
    m = DSV4Mini(ModelConfig()).eval()
    tokens = random_tokens(330, seed=6, vocab=8192)
    ref = m.forward_dense(torch.tensor(tokens)).detach()
    pools = KVPools(EngineConfig(num_pages=16))
    got = run_chunks(m, pools, tokens, [290] + [1] * 40, list(range(15, 4, -1)))
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_bf16_pools_under_a_float32_model(model):
    """The model runner keeps float32 weights with bf16 pools on CUDA: reads are cast, and the
    only difference from the dense math is bf16 rounding of the stored vectors (which can
    flip an occasional top-k choice, hence a loose bound on the median, not the max)."""
    tokens = random_tokens(60, seed=7)
    ref = model.forward_dense(torch.tensor(tokens)).detach()
    pools = KVPools(engine_cfg(), dtype=torch.bfloat16)
    got = run_chunks(model, pools, tokens, [30] + [1] * 30, list(range(4)))
    assert got.dtype == torch.float32
    assert (got - ref).abs().amax(-1).median() < 0.05
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
