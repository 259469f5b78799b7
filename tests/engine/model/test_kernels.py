"""Triton kernels against the reference ops (GPU only: skipped without CUDA and triton)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.engine.kernels import ops_for, reference

from .test_attention import decode_inputs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cpu_selects_reference():
    assert ops_for(torch.device("cpu")) is reference


@cuda
@pytest.mark.parametrize("shape", [(5, 8, 6), (80, 128, 40), (3, 64, 0), (7, 20, 70)])
def test_sparse_decode_attention_matches_reference(shape):
    triton_ops = pytest.importorskip("dsv4bench.engine.kernels.triton_ops")
    if not triton_ops.AVAILABLE:
        pytest.skip("triton not installed")
    S, W, Kc = shape
    args = [a.cuda() if isinstance(a, torch.Tensor) else a
            for a in decode_inputs(S=S, W=W, Kc=Kc, hd=64)]
    want = reference.sparse_decode_attention(*args)
    got = triton_ops.sparse_decode_attention(*args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@cuda
@pytest.mark.parametrize("mode", ["fp8", "bf16"])
@pytest.mark.parametrize("G,Q,NB", [(16, 1, 300), (1, 257, 130), (4, 3, 5)])
def test_indexer_topk_matches_reference(mode, G, Q, NB):
    triton_ops = pytest.importorskip("dsv4bench.engine.kernels.triton_ops")
    if not triton_ops.AVAILABLE:
        pytest.skip("triton not installed")
    from dsv4bench.engine.model.kv_pools import quantize_index_k

    gen = torch.Generator().manual_seed(G * 1000 + Q + NB)
    H, D, E = 4, 32, 8192
    keys, scale = quantize_index_k(torch.randn(E, D, generator=gen) * 3, mode)
    cand = torch.randperm(E, generator=gen)[: G * NB].view(G, NB)
    cand[:, NB - NB // 5 :] = -1  # padding tail
    n_elig = torch.randint(0, NB - NB // 5 + 1, (G, Q), generator=gen)
    q = torch.randn(G, Q, H, D, generator=gen)
    w = torch.randn(G, Q, H, generator=gen)
    args = [q, w, keys, scale, cand, n_elig]
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    want = reference.indexer_topk(*args, 16)
    got = triton_ops.indexer_topk(*args, 16)
    same = (got.sort(-1).values == want.sort(-1).values).float().mean().item()
    assert same > 0.999  # near-ties may swap an element in rare rows


@cuda
@pytest.mark.parametrize("rows,NB,topk", [(256, 1032, 32), (3, 4096, 32), (5, 20, 32), (9, 300, 24)])
def test_topk_blocks_kernel_matches_reference(rows, NB, topk):
    triton_ops = pytest.importorskip("dsv4bench.engine.kernels.triton_ops")
    if not triton_ops.AVAILABLE:
        pytest.skip("triton not installed")
    gen = torch.Generator().manual_seed(rows * NB)
    scores = torch.randn(rows, NB, generator=gen)  # either sign: head weights are signed
    scores[:, ::7] = 0.0  # relu's exact zeros, which the reference breaks by recency
    n_elig = torch.randint(0, NB + 1, (rows,), generator=gen)
    n_elig[0] = NB
    scores, n_elig = scores.cuda(), n_elig.cuda()
    want = reference.topk_blocks(scores, n_elig, topk)
    got = triton_ops._topk_blocks(scores, n_elig, topk)
    assert torch.equal(got, want)


@cuda
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_model_decode_on_cuda_matches_dense(pool_dtype):
    from dsv4bench.engine.model import DSV4Mini, ForwardBatch, KVPools, SeqSlice

    from .conftest import SMALL, engine_cfg, random_tokens

    torch.manual_seed(0)
    m = DSV4Mini(SMALL).cuda().eval()
    tokens = random_tokens(100, seed=1)
    ref = m.forward_dense(torch.tensor(tokens).cuda()).detach()
    pools = KVPools(engine_cfg(), dtype=pool_dtype, device="cuda")
    out = [m.forward_all_logits(ForwardBatch([SeqSlice(tokens[:30], 0, list(range(7)))]), pools)]
    for t in range(30, 100):
        out.append(m(ForwardBatch([SeqSlice([tokens[t]], t, list(range(7)))]), pools))
    got = torch.cat(out)
    if pool_dtype == torch.float32:
        torch.testing.assert_close(got, ref, atol=2e-3, rtol=0)
    else:  # bf16 rounding of stored vectors (the model runner's CUDA setup)
        assert (got - ref).abs().amax(-1).median() < 0.05
