"""The torch.compile'd static decode step (model/compiled_step.py), captured in a CUDA graph,
computes what the uncompiled step computes: logits and pool writes, in bfloat16, with padding
rows and contexts past the window and several blocks. Skipped without CUDA."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.model import DSV4Mini, KVPools
from dsv4bench.engine.cuda_graphs import capture_graph

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    # inductor's notes on how it lowered a reduction, not a fault of the code under test
    pytest.mark.filterwarnings("ignore::UserWarning:torch._inductor.*"),
    pytest.mark.filterwarnings("ignore:.*[Oo]nline softmax"),
]

# head_dim 64 / rope 32 / index_dim 32: the tensor-core kernels, as in the 1B benchmark config
CFG = ModelConfig(n_layers=4, max_context=2048)


def _pool_copy(pools: KVPools) -> list[torch.Tensor]:
    return [(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).clone() for t in pools.page_tensors()]


def _restore(pools: KVPools, saved: list[torch.Tensor]) -> None:
    for t, s in zip(pools.page_tensors(), saved):
        (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t).copy_(s)


def test_compiled_static_decode_matches_uncompiled_in_bf16():
    from dsv4bench.engine.model.compiled_step import compile_static_decode

    ecfg = EngineConfig(model=CFG, device="cuda", num_pages=512)
    torch.manual_seed(0)
    model = DSV4Mini(CFG).to("cuda", torch.bfloat16).eval()
    pools = KVPools(ecfg, dtype=torch.bfloat16, device="cuda", scratch_page=True)
    pools.fill_random(list(range(ecfg.num_pages)))
    rng = random.Random(0)
    B, NP, real = 24, 16, 21  # 3 padding rows
    # positions at and around block, window and page bounds
    ctx = [rng.randrange(0, NP * ecfg.page_size - 1) for _ in range(real - 6)] + [0, 3, 127, 128, 31, 32]
    pages = list(range(ecfg.num_pages))
    rng.shuffle(pages)
    pt = torch.full((B, NP), pools.scratch_page, dtype=torch.int32)
    for i, c in enumerate(ctx):
        n = c // ecfg.page_size + 1
        pt[i, :n] = torch.tensor(pages[i * NP : i * NP + n], dtype=torch.int32)
    pos = torch.tensor(ctx + [0] * (B - real), dtype=torch.int32)
    tok = torch.tensor([rng.randrange(CFG.vocab_size) for _ in range(B)], dtype=torch.int32)
    tok, pos, pt = tok.cuda(), pos.cuda(), pt.cuda()
    saved = _pool_copy(pools)

    g, want = capture_graph(lambda: model.forward_static_decode(tok, pos, pt, pools))
    _restore(pools, saved)
    g.replay()
    torch.cuda.synchronize()
    want_pools = _pool_copy(pools)

    step = compile_static_decode(model)
    _restore(pools, saved)
    gc, got = capture_graph(lambda: step(tok, pos, pt, pools))
    _restore(pools, saved)
    gc.replay()
    torch.cuda.synchronize()
    # NOTE: per row: a row whose expert choice (an argmax of bf16 router scores) falls on a
    # near-tie may flip between the two steps' roundings, and that row then differs wholly
    # (rows are separate sequences: a flip stays in its row); seen on an H200 with the MoE's
    # Triton kernels, whose eager launch inside the compiled step gave the same whole-batch
    # error (0.26) as the compiled op (0.15). Most rows must still agree to bf16 rounding.
    g32, w32 = got[:real].float(), want[:real].float()
    row_err = (g32 - w32).norm(dim=-1) / w32.norm(dim=-1)
    assert (row_err < 2e-2).float().mean().item() >= 0.8, row_err
    # same argmax on nearly every row (bf16: near-ties may swap)
    assert (got[:real].argmax(-1) == want[:real].argmax(-1)).float().mean().item() >= 0.9
    n = pools.num_pages  # the scratch page holds padding writes: not compared
    for a, b in zip(_pool_copy(pools), want_pools):
        a, b = a[:n], b[:n]
        if a.dtype == torch.uint8:  # fp8 index keys: nearly all bytes the same
            assert (a != b).float().mean().item() < 0.02
        else:
            assert ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-6)).item() < 1e-2
