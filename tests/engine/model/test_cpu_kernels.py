"""The CPU reference ops' fast forms compute what the plain forms compute, bit for bit: the fp8
decode of index keys, the in-place RoPE and row gathers; and the decode attention over key-major
buffers still matches a naive loop."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.engine.kernels import reference
from dsv4bench.engine.model.kv_pools import quantize_index_k
from dsv4bench.engine.kernels.reference import apply_rope_
from dsv4bench.engine.model.rope import Rope, apply_rope

from .test_attention import decode_inputs, naive_decode


def test_fp8_keys_over_256_decodes_every_value_exactly():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = codes[(codes != 0x7F) & (codes != 0xFF)]  # e4m3fn's two NaNs, never stored
    fp8 = codes.view(torch.float8_e4m3fn)
    got = reference.fp8_keys_over_256(fp8)
    assert got.dtype == torch.float32
    assert torch.equal(got * 256, fp8.float())


@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_indexer_topk_equals_topk_of_dequantised_scores(mode):
    gen = torch.Generator().manual_seed(3)
    G, Q, H, D, E, NB = 6, 3, 4, 32, 4096, 200
    keys, scale = quantize_index_k(torch.randn(E, D, generator=gen) * 3, mode)
    cand = torch.randperm(E, generator=gen)[: G * NB].view(G, NB)
    cand[:, 150:] = -1
    n_elig = torch.randint(0, 151, (G, Q), generator=gen)
    q, w = torch.randn(G, Q, H, D, generator=gen), torch.randn(G, Q, H, generator=gen)
    ids = cand.clamp(min=0)
    scores = reference.indexer_scores(q, w, keys[ids].float())
    if scale is not None:
        scores = scores * scale[ids].unsqueeze(1)
    want = reference.topk_blocks(scores, n_elig, 16)
    assert torch.equal(reference.indexer_topk(q, w, keys, scale, cand, n_elig, 16), want)


def test_apply_rope_in_place_equals_apply_rope():
    rope = Rope(16, 10000.0, 512)
    x = torch.randn(7, 5, 32)
    pos = torch.randint(0, 512, (7, 5))
    cos, sin = rope.cos[pos], rope.sin[pos]
    want = apply_rope(x, cos, sin)
    got = x.clone()
    assert apply_rope_(got, cos, sin) is got
    assert torch.equal(got, want)


def test_take_rows_equals_indexing():
    table = torch.randn(50, 3, 4)
    ids = torch.randint(0, 50, (6, 7))
    assert torch.equal(reference.take_rows(table, ids), table[ids])


def test_decode_attention_matches_naive_loop_on_float32_and_bf16_pools():
    """Padded window slots and compressed ids; bf16 pools are read into the float32 queries'
    dtype."""
    args = decode_inputs(S=47, W=8, Kc=6)
    got = reference.sparse_decode_attention(*args)
    torch.testing.assert_close(got, naive_decode(*args), atol=1e-5, rtol=0)
    q, kv, ws, wp, ckv, ci, cp, *rest = args
    bf16 = reference.sparse_decode_attention(q, kv.bfloat16(), ws, wp, ckv.bfloat16(), ci, cp, *rest)
    want = naive_decode(q, kv.bfloat16().float(), ws, wp, ckv.bfloat16().float(), ci, cp, *rest)
    torch.testing.assert_close(bf16, want, atol=1e-5, rtol=0)
