"""The CUDA path (steps replayed as CUDA graphs, cuda_graphs.py) gives the CPU path's tokens
under greedy decoding, and the eager CUDA path's under aborts, page reuse and contexts that
cross page-table buckets; the bf16 tensor-core kernels and the grouped MoE match their
references. Skipped without CUDA."""

from __future__ import annotations

import random

import pytest
import torch

from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.memory import PageAllocator
from dsv4bench.engine.model import DSV4Mini
from dsv4bench.engine.model_runner import ModelRunner
from dsv4bench.engine.radix_cache import RadixCache
from dsv4bench.engine.request import Request, SamplingParams
from dsv4bench.engine.scheduler import Scheduler
from dsv4bench.engine.weights import load_weights

from .model.conftest import SMALL

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def prompts(n: int, lengths: tuple[int, int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def serve(
    runner: ModelRunner,
    cfg: EngineConfig,
    batch: list[list[int]],
    max_tokens: int,
    abort_at: dict[int, int] | None = None,
    late: list[list[int]] | None = None,
) -> dict[str, list[int]]:
    """Every prompt at once, greedy, to completion; `abort_at` {step: request index} aborts a
    request at that step, and `late` prompts arrive then, on the freed pages."""
    alloc = PageAllocator(cfg.num_pages)
    s = Scheduler(cfg, alloc, RadixCache(cfg.page_size, alloc), eos_token_id=-1)
    reqs = [Request(f"r{i}", p, SamplingParams(max_tokens=max_tokens, temperature=0.0)) for i, p in enumerate(batch)]
    for r in reqs:
        s.add(r)
    step = 0
    late = list(late or [])
    while s.has_work:
        if abort_at and step in abort_at:
            s.abort(reqs[abort_at[step]].rid)
            if late:
                r = Request(f"late{step}", late.pop(0), SamplingParams(max_tokens=max_tokens, temperature=0.0))
                reqs.append(r)
                s.add(r)
        b = s.schedule()
        assert b is not None
        s.postprocess(b, runner(b))
        s.check_integrity()
        step += 1
    return {r.rid: list(r.output_ids) for r in reqs}


def test_shipped_weights_same_greedy_tokens_on_cuda_as_on_cpu():
    model_cfg = ModelConfig()
    batch = prompts(12, (60, 1500), model_cfg.vocab_size, seed=1)
    outs = {}
    for device in ("cpu", "cuda"):
        cfg = EngineConfig(device=device, num_pages=1024, enable_prefix_cache=False)
        runner = ModelRunner(cfg, load_weights(model_cfg))
        outs[device] = serve(runner, cfg, batch, max_tokens=40)
        if device == "cuda":
            assert runner.graphs is not None and runner.graphs.replays > 0
    assert outs["cuda"] == outs["cpu"]


def test_graphs_equal_eager_under_aborts_page_reuse_and_growing_contexts():
    # SMALL: pages of 16 tokens, so contexts of 100-160 tokens cross the 8-page bucket
    cfg = EngineConfig(
        model=SMALL, device="cuda", page_size=16, num_pages=128, enable_prefix_cache=False, max_running_requests=12
    )
    torch.manual_seed(0)
    model = DSV4Mini(SMALL)
    batch = prompts(10, (20, 120), SMALL.vocab_size, seed=2)
    late = prompts(3, (5, 90), SMALL.vocab_size, seed=3)
    aborts = {14: 3, 20: 0, 31: 7}
    outs = []
    for graphs in (True, False):
        runner = ModelRunner(cfg, model)
        if not graphs:
            runner.graphs = None
        outs.append(serve(runner, cfg, batch, max_tokens=60, abort_at=aborts, late=late))
        if graphs:
            assert runner.graphs is not None and len(runner.graphs.captured()) >= 2
    assert outs[0] == outs[1]


def test_a_new_bucket_compiles_no_triton_kernel():
    """A capture in the middle of a run stalls every stream; one that compiles a Triton kernel
    stalls them for seconds (the indexer's top-k once compiled per page-table width, 0.8-3.5 s
    each). Once decode rows and prefill rows have each been captured, no bucket compiles."""
    cfg = EngineConfig(device="cuda", num_pages=4096, enable_prefix_cache=False)
    graphs = ModelRunner(cfg, DSV4Mini(ModelConfig())).graphs
    assert graphs is not None
    first = [(16, 8), (2048, 8)]
    later = [(16, 64), (80, 512), (2048, 512), (256, 128), (24, 16), (1, 32), (640, 256)]
    for B, NP in first + later:
        graphs.graph(B, NP)
    assert {b: graphs.compiled[b] for b in later if graphs.compiled[b]} == {}


@pytest.mark.parametrize("S,W,Kc", [(5, 128, 40), (80, 128, 100), (3, 64, 0)])
def test_bf16_tensor_core_decode_attention_matches_reference(S, W, Kc):
    from dsv4bench.engine.kernels import reference, triton_ops
    from dsv4bench.engine.model.rope import Rope

    gen = torch.Generator().manual_seed(S + W + Kc)
    H, hd = 16, 128  # the 1B benchmark config's heads
    rope = Rope(64, 10000.0, 4096)
    kv, ckv = torch.randn(500, hd, generator=gen), torch.randn(200, hd, generator=gen)
    win = torch.randint(0, 500, (S, W), generator=gen)
    win[0, :7] = -1
    c_ids = torch.randint(0, 200, (S, Kc), generator=gen)
    if Kc:
        c_ids[1, Kc // 2 :] = -1
    args = [
        torch.randn(S, H, hd, generator=gen),
        kv,
        win,
        torch.randint(0, 4000, (S, W), generator=gen),
        ckv,
        c_ids,
        torch.randint(0, 4000, (S, Kc), generator=gen),
        torch.randn(H, generator=gen),
        rope.cos,
        rope.sin,
        hd**-0.5,
    ]
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    for i in (0, 1, 4):
        args[i] = args[i].bfloat16()
    want = reference.sparse_decode_attention(args[0].float(), *args[1:]).float()
    got = triton_ops.sparse_decode_attention(*args).float()
    assert ((got - want).norm() / want.norm()).item() < 2e-2


@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_bf16_tensor_core_indexer_scores_match_reference(mode):
    from dsv4bench.engine.kernels import reference, triton_ops
    from dsv4bench.engine.model.kv_pools import quantize_index_k

    gen = torch.Generator().manual_seed(7)
    G, H, D, E, NB = 64, 8, 64, 65536, 700
    keys, scale = quantize_index_k(torch.randn(E, D, generator=gen), mode)
    cand = torch.randperm(E, generator=gen)[: G * NB].view(G, NB)
    n_elig = torch.randint(1, NB + 1, (G, 1), generator=gen)
    q = torch.randn(G, 1, H, D, generator=gen).bfloat16()
    w = torch.randn(G, 1, H, generator=gen).bfloat16()
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in (q, w, keys, scale, cand, n_elig)]
    want = reference.indexer_topk(*args, 32)
    got = triton_ops.indexer_topk(*args, 32)
    same = (got.sort(-1).values == want.sort(-1).values).float().mean().item()
    assert same > 0.99  # bf16 products: near-ties may swap


def test_static_moe_grouped_matches_moe_forward_in_bf16():
    from dsv4bench.engine.model.moe import MoE
    from dsv4bench.engine.model.static_moe import grouped_mm_usable, static_moe

    if not grouped_mm_usable(torch.device("cuda"), torch.bfloat16):
        pytest.skip("torch._grouped_mm does not run here")
    torch.manual_seed(0)
    mcfg = ModelConfig(d_model=256, n_experts=8, experts_per_token=2, expert_dim=256, n_hash_layers=0)
    moe = MoE(mcfg, layer=1).cuda().bfloat16()
    x = torch.randn(300, 256, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 8192, (300,), device="cuda")
    want = moe(x, ids).float()
    got = static_moe(moe, x, ids).float()
    assert ((got - want).norm() / want.norm()).item() < 1e-2
