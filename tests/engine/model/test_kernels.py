"""Triton kernels against the reference ops (GPU only: skipped without CUDA and triton)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.engine.kernels import ops_for, reference

from .conftest import triton_kernels
from .test_attention import decode_inputs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cpu_selects_reference():
    assert ops_for(torch.device("cpu")) is reference


@cuda
@pytest.mark.parametrize("shape", [(5, 8, 6), (80, 128, 40), (3, 64, 0), (7, 20, 70)])
def test_sparse_decode_attention_matches_reference(shape):
    triton_ops = triton_kernels("triton_ops")
    S, W, Kc = shape
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in decode_inputs(S=S, W=W, Kc=Kc, hd=64)]
    want = reference.sparse_decode_attention(*args)
    got = triton_ops.sparse_decode_attention(*args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@cuda
@pytest.mark.parametrize("mode", ["fp8", "bf16"])
@pytest.mark.parametrize("G,Q,NB", [(16, 1, 300), (1, 257, 130), (4, 3, 5)])
def test_indexer_topk_matches_reference(mode, G, Q, NB):
    triton_ops = triton_kernels("triton_ops")
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


def _grouped_ref(a, b, offs, gather=None, swiglu=False, row_scale=None, scatter=None):
    """kernels/grouped_moe.grouped_mm as a float32 loop over the experts."""
    a = (a[gather] if gather is not None else a).float()
    rows = []
    s = 0
    for e, o in enumerate(offs.tolist()):
        h = a[s:o] @ b[e].float()
        if swiglu:
            g, u = h.chunk(2, -1)
            h = torch.nn.functional.silu(g) * u
        rows.append(h)
        s = o
    out = torch.cat(rows)
    if scatter is not None:
        placed = torch.empty_like(out)
        placed[scatter] = out * row_scale[scatter].float().unsqueeze(-1)
        out = placed
    return out


def _poison_allocator(numel: int) -> None:
    """Leave NaN in the blocks the caching allocator hands out next, so a row the kernel
    fails to write shows as NaN instead of stale numbers."""
    junk = torch.full((numel,), float("nan"), device="cuda", dtype=torch.bfloat16)
    del junk


def _grouped_moe():
    gm = pytest.importorskip("dsv4bench.engine.kernels.grouped_moe")
    if not gm.usable(torch.device("cuda"), torch.bfloat16):
        pytest.skip("the Triton grouped kernel does not run here")
    return gm


@cuda
@pytest.mark.parametrize(
    "counts",
    [
        [84, 66, 68, 58, 56, 63, 53, 64],  # a batch-256 step of the 1B config (2 of 8 per token)
        [0, 130, 0, 1, 63, 65, 0, 1],  # empty experts, one row, just under/over a tile
        [0, 0, 0, 512, 0, 0, 0, 0],  # every row on one expert
        [20, 21, 19, 20, 20, 20, 20, 20],  # batch 80
        [254, 262, 277, 254, 236, 234, 268, 263],  # batch 1024: the 128-row tiles
        [0, 1100, 0, 1, 127, 129, 0, 1],  # the same, awkward
    ],
)
@pytest.mark.parametrize("mode", ["plain", "gather_swiglu", "scale_scatter"])
def test_triton_grouped_mm_matches_loop(counts, mode):
    gm = _grouped_moe()
    gen = torch.Generator(device="cuda").manual_seed(sum(counts) + len(mode))
    E, d, h = 8, 2048, 1024  # the 1B benchmark config's experts
    M = sum(counts)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    if mode == "gather_swiglu":
        b = torch.randn(E, d, 2 * h, device="cuda", generator=gen).bfloat16() * d**-0.5
        a = torch.randn(M // 2 + 3, d, device="cuda", generator=gen).bfloat16()
        gather = torch.randint(0, a.shape[0], (M,), device="cuda", generator=gen)
        kw = dict(gather=gather, swiglu=True)
    else:
        K = h if mode == "scale_scatter" else d
        b = torch.randn(E, K, d, device="cuda", generator=gen).bfloat16() * K**-0.5
        a = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        kw = {}
        if mode == "scale_scatter":
            kw = dict(
                row_scale=torch.rand(M, device="cuda", generator=gen),
                scatter=torch.randperm(M, device="cuda", generator=gen),
            )
    _poison_allocator(M * b.shape[2] * 2)
    got = gm.grouped_mm(a, b, offs, **kw).float()
    want = _grouped_ref(a, b, offs, **kw)
    assert got.shape == want.shape
    assert torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 1e-2  # bf16 operands and output
    if mode == "plain" and hasattr(torch, "_grouped_mm"):
        base = torch._grouped_mm(a, b, offs=offs).float()
        assert ((got - base).norm() / base.norm()).item() < 1e-2


@cuda
def test_triton_grouped_mm_leaves_rows_past_the_last_expert_alone():
    gm = _grouped_moe()
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(100, 256, device="cuda", generator=gen).bfloat16()
    b = torch.randn(3, 256, 256, device="cuda", generator=gen).bfloat16()
    offs = torch.tensor([10, 10, 70], device="cuda", dtype=torch.int32)  # rows 70.. unrouted
    got = gm.grouped_mm(a, b, offs)
    want = _grouped_ref(a[:70], b, offs)
    assert ((got[:70].float() - want).norm() / want.norm()).item() < 1e-2


@cuda
def test_static_moe_triton_path_matches_grouped_mm_path():
    from dsv4bench.engine.config import ModelConfig
    from dsv4bench.engine.model import static_moe as sm
    from dsv4bench.engine.model.moe import MoE

    _grouped_moe()
    if not sm.grouped_mm_usable(torch.device("cuda"), torch.bfloat16):
        pytest.skip("torch._grouped_mm does not run here")
    torch.manual_seed(0)
    mcfg = ModelConfig(
        d_model=2048, n_experts=8, experts_per_token=2, expert_dim=1024, shared_expert_dim=1024, n_hash_layers=0
    )
    moe = MoE(mcfg, layer=1).cuda().bfloat16()
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 8192, (256,), device="cuda")
    assert sm.triton_moe_usable(moe, x)
    experts, gates = moe.route(x, ids)
    got = sm._grouped_triton(moe, x, ids, None).float()  # its own routing kernel
    base = sm._grouped(moe, x, experts, gates).float()
    assert ((got - base).norm() / base.norm()).item() < 1e-2
    want = moe(x, ids).float()
    assert ((sm.static_moe(moe, x, ids).float() - want).norm() / want.norm()).item() < 1e-2


def test_static_moe_takes_no_triton_path_on_cpu():
    from dsv4bench.engine.config import ModelConfig
    from dsv4bench.engine.model import static_moe as sm
    from dsv4bench.engine.model.moe import MoE

    moe = MoE(ModelConfig(d_model=64, n_experts=4, experts_per_token=2, expert_dim=64), layer=1)
    assert not sm.triton_moe_usable(moe, torch.randn(3, 64))
