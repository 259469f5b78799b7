"""Decode step of DSV4Mini on a GPU, replayed as a CUDA graph, against the bytes it must read.

    python -m dsv4bench.engine.model.bench_decode [--config default|1b] [--batches 1,80,256,1024]
        [--dtype float32|bfloat16] [--ctx 2048,4096] [--eager]

For each batch: sequences at contexts drawn from --ctx, pools filled with random KV, one decode
step (forward_static_decode, the step cuda_graphs.py captures) timed over graph replays with
CUDA events (median). Bytes read by a step, counted from the contexts:
  - weights: every parameter outside the routed experts (the tied embedding is read whole by
    the logits), plus the routed experts that at least one row chose (counted on an eager
    step of the same batch);
  - per row and layer: raw KV of the window, the compressed entries attended (HCA: every
    complete block; CSA: the top-k) and, in CSA layers, the index key and scale of every
    complete block.
Bandwidth = bytes / step time, as a share of a device-to-device copy measured in the same
run (bytes read + written over its time). `--eager` also times the eager forward() step.
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from ..config import EngineConfig, ModelConfig
from .batch import ForwardBatch, SeqSlice
from .bench import Pages, fill_random
from .kv_pools import KVPools
from .model import DSV4Mini

# About 1.07B parameters: DSV4-mini's layout, wider and deeper. For this benchmark only.
CONFIGS = {
    "default": ModelConfig(),
    "1b": ModelConfig(d_model=2048, n_layers=16, n_heads=16, head_dim=128, rope_dim=64,
                      index_heads=8, index_dim=64, n_experts=8, experts_per_token=2,
                      expert_dim=1024, shared_expert_dim=1024),
}


def copy_bandwidth(device: str, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (median of 10)."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) / 1e3)
    return 2 * nbytes / statistics.median(times)


def step_bytes(model: DSV4Mini, pools: KVPools, ctx: list[int], experts_hit: list[int]) -> dict[str, int]:
    """Bytes a decode step over rows at positions `ctx` must read (module docstring)."""
    m = model.cfg
    elt = pools.kv[0].element_size()
    routed = 0
    other = 0
    for name, p in model.named_parameters():
        if name.endswith(("moe.w_in", "moe.w_out")):
            routed += p.numel() * p.element_size()
        else:
            other += p.numel() * p.element_size()
    per_expert = routed // (m.n_layers * m.n_experts)
    weights = other + per_expert * sum(experts_hit)
    window = compressed = index = 0
    idx_elt = 1 if pools.index_k_dtype == "fp8" else 2
    for t in ctx:
        for l in range(m.n_layers):
            window += min(m.window, t + 1) * m.head_dim * elt
            nb = (t + 1) // m.rate(l)
            if m.is_csa(l):
                compressed += min(m.index_topk, nb) * m.head_dim * elt
                index += nb * (m.index_dim * idx_elt + (4 if idx_elt == 1 else 0))
            else:
                compressed += nb * m.head_dim * elt
    return {"weights": weights, "window": window, "compressed": compressed, "index_k": index}


def routed_experts(model: DSV4Mini, step) -> list[int]:
    """Distinct experts each layer's MoE routes to during `step()`."""
    hit: list[int] = []
    for blk in model.blocks:
        route = blk.moe.route

        def record(x, token_ids, route=route):
            experts, gates = route(x, token_ids)
            hit.append(int(experts.unique().numel()))
            return experts, gates

        blk.moe.route = record
    try:
        step()
    finally:
        for blk in model.blocks:
            del blk.moe.route
    return hit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="default", choices=sorted(CONFIGS))
    ap.add_argument("--batches", default="1,80,256,1024")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--index-k-dtype", default="fp8", choices=["fp8", "bf16"])
    ap.add_argument("--ctx", default="2048,4096", help="contexts drawn uniformly from this range")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--eager", action="store_true", help="also time the eager forward() step")
    args = ap.parse_args()
    dev = "cuda"
    batches = [int(b) for b in args.batches.split(",")]
    lo, hi = (int(x) for x in args.ctx.split(","))
    mcfg = CONFIGS[args.config]
    rng = random.Random(0)
    ctx_all = [rng.randint(lo, hi) for _ in range(max(batches))]
    P = EngineConfig().page_size
    pages_needed = sum(c // P + 1 for c in ctx_all) + 1
    cfg = EngineConfig(model=mcfg, device=dev, index_k_dtype=args.index_k_dtype,
                       num_pages=max(1024, pages_needed))
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = DSV4Mini(mcfg).to(dev, dtype).eval()
    pools = KVPools(cfg, dtype=torch.bfloat16, device=dev, scratch_page=True)
    alloc = Pages(cfg.num_pages, seed=0)
    tables = [alloc.take(c // P + 1) for c in ctx_all]
    fill_random(pools, [p for t in tables for p in t])
    bw = copy_bandwidth(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"config {args.config}: {n_params / 1e9:.3f}B parameters ({args.dtype}), KV bf16, index-K "
          f"{args.index_k_dtype}, contexts {lo}-{hi}; {torch.cuda.get_device_name()}; copy bandwidth "
          f"{bw / 1e12:.2f} TB/s (read + written)")
    print(f"{'batch':>5} {'graph step':>11} {'eager step':>11} {'MB read':>9} {'(weights':>9} {'window':>7} "
          f"{'compr.':>7} {'index-K)':>8} {'TB/s':>6} {'of copy':>8} {'tok/s':>10}")
    for B in batches:
        ctx = ctx_all[:B]
        NP = max(c // P + 1 for c in ctx)
        pt = torch.full((B, NP), pools.scratch_page, dtype=torch.int32)
        for i, t in enumerate(tables[:B]):
            pt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        tok = torch.tensor([rng.randrange(mcfg.vocab_size) for _ in range(B)], dtype=torch.int32, device=dev)
        pos = torch.tensor(ctx, dtype=torch.int32, device=dev)
        pt = pt.to(dev)
        # eager forward() once: the experts it routes to, and its time when asked
        batch = ForwardBatch([SeqSlice([int(tok[i])], ctx[i], tables[i]) for i in range(B)])
        experts_hit = routed_experts(model, lambda: model(batch, pools))
        eager_ms = float("nan")
        if args.eager:
            ts = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                model(batch, pools)
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b))
            eager_ms = statistics.median(ts)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model.forward_static_decode(tok, pos, pt, pools)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model.forward_static_decode(tok, pos, pt, pools)
        for _ in range(3):
            g.replay()
        ts = []
        for _ in range(args.replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        ms = statistics.median(ts)
        nbytes = step_bytes(model, pools, ctx, experts_hit)
        total = sum(nbytes.values())
        rate = total / (ms / 1e3)
        print(f"{B:>5} {ms:>8.3f} ms {eager_ms:>8.2f} ms {total / 1e6:>9.1f} {nbytes['weights'] / 1e6:>9.1f} "
              f"{nbytes['window'] / 1e6:>7.1f} {nbytes['compressed'] / 1e6:>7.1f} {nbytes['index_k'] / 1e6:>8.1f} "
              f"{rate / 1e12:>6.2f} {rate / bw:>7.1%} {B / ms * 1e3:>10.0f}", flush=True)
        del g


if __name__ == "__main__":
    main()
