"""Decode step of DSV4Mini on a GPU, replayed as a CUDA graph, against the bytes it must read.

    python scripts/bench_decode.py [--config default|1b] [--batches 1,80,256,1024]
        [--dtype float32|bfloat16] [--ctx 2048,4096] [--eager] [--compile] [--profile 256] [--profile-out DIR]

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
`--compile` also times the step compiled by torch.compile (compiled_step.py), captured and
replayed the same way, beside the uncompiled graph of the same batch (its compile time, and the
relative difference of its logits from the uncompiled step's, and the share of rows with the
same argmax; `eager err` is the same difference between the uncompiled graph and eager
forward(), the noise floor of the dtype). `--profile B,...` prints, for
those batches, the kernels of a replayed step (count per step, top kernels by time), after
every batch is timed (the profiler slows the replays that follow it), and `--profile-out DIR`
writes every kernel's row and the step's timeline there.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.cuda_graphs import capture_graph
from dsv4bench.engine.model.batch import ForwardBatch, SeqSlice
from bench_model import Pages
from dsv4bench.engine.model.fused_projections import fuse_projections
from dsv4bench.engine.model.kv_pools import KVPools
from dsv4bench.engine.model.model import DSV4Mini


def time_replays(g: torch.cuda.CUDAGraph, n: int) -> float:
    """Median ms of a replay over n replays (after 3 untimed)."""
    for _ in range(3):
        g.replay()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def profile_replays(label: str, g: torch.cuda.CUDAGraph, n: int = 5, top: int = 25, out_dir: str = "") -> None:
    """Kernels of n replays of g: count and time per step, top kernels by total time. With
    out_dir, also every kernel's row (`<label>.kernels.txt`) and the timeline as a Chrome trace
    (`<label>.trace.json`) there."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            g.replay()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = e.self_cuda_time_total
        if t > 0:
            rows.append((t / n, e.count / n, e.key))
    rows.sort(reverse=True)
    total_us = sum(r[0] for r in rows)
    count = sum(r[1] for r in rows)
    print(f"profile {label}: {count:.0f} kernels a step, {total_us / 1e3:.3f} ms of kernel time a step")
    table = [f"{'us/step':>9} {'calls':>6} {'us/call':>8}  kernel"]
    table += [f"{t:>9.1f} {c:>6.0f} {t / max(c, 1e-9):>8.2f}  {k[:110]}" for t, c, k in rows]
    print("\n".join(table[: top + 1]))
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        stem = os.path.join(out_dir, label.replace(" ", "_"))
        with open(f"{stem}.kernels.txt", "w") as f:
            f.write("\n".join(table) + "\n")
        prof.export_chrome_trace(f"{stem}.trace.json")


# About 1.07B parameters: DSV4-mini's layout, wider and deeper. For this benchmark only.
CONFIGS = {
    "default": ModelConfig(),
    "1b": ModelConfig(
        d_model=2048,
        n_layers=16,
        n_heads=16,
        head_dim=128,
        rope_dim=64,
        index_heads=8,
        index_dim=64,
        n_experts=8,
        experts_per_token=2,
        expert_dim=1024,
        shared_expert_dim=1024,
    ),
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


def routed_experts(model: DSV4Mini, step, token_ids: torch.Tensor) -> list[int]:
    """Distinct experts each layer's MoE routes to during `step()` over rows of `token_ids`:
    MoE.route on each MoE's input (its pre-norm's output), whichever path the step routes by."""
    hit: list[int] = []

    def recorder(moe):
        def record(norm, args, out):
            experts, _ = moe.route(out, token_ids)
            hit.append(int(experts.unique().numel()))

        return record

    hooks = [blk.ffn_norm.register_forward_hook(recorder(blk.moe)) for blk in model.blocks]
    try:
        step()
    finally:
        for h in hooks:
            h.remove()
    assert len(hit) == len(model.blocks), hit
    return hit


def parse_batches(text: str) -> list[int]:
    """--batches as this and scripts/bench_engine.py take it: whole numbers of at least 1."""
    try:
        batches = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--batches takes whole numbers separated by commas, e.g. 1,8,80; got {text!r}") from None
    if not batches or min(batches) < 1:
        raise SystemExit(f"--batches takes batch sizes of at least 1, e.g. 1,8,80; got {text!r}")
    return batches


def parse_contexts(text: str, max_context: int) -> tuple[int, int]:
    """--ctx LO,HI: a decode step's row holds at least one token and leaves room for the next."""
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--ctx takes two whole numbers LO,HI, e.g. 2048,4096; got {text!r}") from None
    if not 1 <= lo <= hi < max_context:
        raise SystemExit(f"--ctx needs 1 <= LO <= HI < {max_context} (the model's context); got {text!r}")
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default", choices=sorted(CONFIGS))
    ap.add_argument("--batches", default="1,80,256,1024")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--index-k-dtype", default="fp8", choices=["fp8", "bf16"])
    ap.add_argument("--ctx", default="2048,4096", help="contexts drawn uniformly from this range")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--eager", action="store_true", help="also time the eager forward() step")
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile'd step (compiled_step.py)")
    ap.add_argument("--profile", default="", help="batches whose replayed steps are profiled")
    ap.add_argument(
        "--profile-out", default="", help="folder for the profiled steps' full kernel tables and Chrome traces"
    )
    args = ap.parse_args()
    batches = parse_batches(args.batches)
    prof_batches = set(parse_batches(args.profile)) if args.profile else set()
    if not prof_batches <= set(batches):
        raise SystemExit(f"--profile names batches that --batches does not run: {sorted(prof_batches - set(batches))}")
    if args.replays < 1:
        raise SystemExit(f"--replays takes at least 1; got {args.replays}")
    mcfg = CONFIGS[args.config]
    lo, hi = parse_contexts(args.ctx, mcfg.max_context)
    if not torch.cuda.is_available():
        raise SystemExit(f"this benchmark times CUDA graphs; torch {torch.__version__} sees no CUDA device here")
    dev = "cuda"
    rng = random.Random(0)
    ctx_all = [rng.randint(lo, hi) for _ in range(max(batches))]
    P = EngineConfig().page_size
    pages_needed = sum(c // P + 1 for c in ctx_all) + 1
    cfg = EngineConfig(model=mcfg, device=dev, index_k_dtype=args.index_k_dtype, num_pages=max(1024, pages_needed))
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = DSV4Mini(mcfg).to(dev, dtype).eval()
    fuse_projections(model)  # as cuda_graphs.py captures the step
    pools = KVPools(cfg, dtype=torch.bfloat16, device=dev, scratch_page=True)
    alloc = Pages(cfg.num_pages, seed=0)
    tables = [alloc.take(c // P + 1) for c in ctx_all]
    pools.fill_random([p for t in tables for p in t])
    bw = copy_bandwidth(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"config {args.config}: {n_params / 1e9:.3f}B parameters ({args.dtype}), KV bf16, index-K "
        f"{args.index_k_dtype}, contexts {lo}-{hi}; {torch.cuda.get_device_name()}; copy bandwidth "
        f"{bw / 1e12:.2f} TB/s (read + written)"
    )
    compiled = None
    if args.compile:
        from .compiled_step import compile_static_decode

        compiled = compile_static_decode(model)
    head = (
        f"{'batch':>5} {'graph step':>11} {'eager step':>11} {'MB read':>9} {'(weights':>9} {'window':>7} "
        f"{'compr.':>7} {'index-K)':>8} {'TB/s':>6} {'of copy':>8} {'tok/s':>10} {'eager err':>8}"
    )
    if compiled is not None:
        head += f" {'compiled':>11} {'of copy':>8} {'speedup':>8} {'compile':>8} {'logit err':>9} {'argmax=':>7}"
    lines = [head]
    to_profile: list[tuple[str, torch.cuda.CUDAGraph]] = []  # (label, graph), profiled last
    print(head)
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
        eager_logits: list[torch.Tensor] = []
        experts_hit = routed_experts(model, lambda: eager_logits.append(model(batch, pools)), tok)
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
        g, logits = capture_graph(lambda: model.forward_static_decode(tok, pos, pt, pools))
        ms = time_replays(g, args.replays)
        nbytes = step_bytes(model, pools, ctx, experts_hit)
        total = sum(nbytes.values())
        rate = total / (ms / 1e3)
        line = (
            f"{B:>5} {ms:>8.3f} ms {eager_ms:>8.2f} ms {total / 1e6:>9.1f} {nbytes['weights'] / 1e6:>9.1f} "
            f"{nbytes['window'] / 1e6:>7.1f} {nbytes['compressed'] / 1e6:>7.1f} {nbytes['index_k'] / 1e6:>8.1f} "
            f"{rate / 1e12:>6.2f} {rate / bw:>7.1%} {B / ms * 1e3:>10.0f}"
        )
        g.replay()
        torch.cuda.synchronize()
        # the bf16 noise floor of the logits: eager forward() (other kernels, other sums)
        # against the graph of the same step
        ref = eager_logits[0].float()
        ref_err = ((logits.float() - ref).norm() / ref.norm()).item()
        line += f" {ref_err:>8.1e}"
        if B in prof_batches:
            to_profile.append((f"graph batch {B}", g))
        gc = None
        if compiled is not None:
            t0 = time.perf_counter()
            try:
                compiled(tok, pos, pt, pools)
            except Exception as e:  # noqa: BLE001 - a graph break under fullgraph: compile the pieces instead
                print(
                    f"fullgraph compile failed ({str(e).splitlines()[0][:300]}); compiling with graph breaks",
                    flush=True,
                )
                from .compiled_step import compile_static_decode

                compiled = compile_static_decode(model, fullgraph=False)
                compiled(tok, pos, pt, pools)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            gc, logits_c = capture_graph(lambda: compiled(tok, pos, pt, pools))
            ms_c = time_replays(gc, args.replays)
            # NOTE: a step reads only pool contents that precede it or that it wrote itself
            # earlier in the same step, so either graph's last replay leaves its own logits
            g.replay()
            gc.replay()
            torch.cuda.synchronize()
            err = ((logits_c.float() - logits.float()).norm() / logits.float().norm()).item()
            same = (logits_c.argmax(-1) == logits.argmax(-1)).float().mean().item()
            rate_c = total / (ms_c / 1e3)
            line += (
                f" {ms_c:>8.3f} ms {rate_c / bw:>7.1%} {ms / ms_c:>7.2f}x {compile_s:>7.1f}s {err:>9.1e} {same:>7.1%}"
            )
            if B in prof_batches:
                to_profile.append((f"compiled batch {B}", gc))
        lines.append(line)
        print(line, flush=True)
        del g, gc
    if len(lines) > 2:
        print("\n".join(lines))
    # NOTE: profiled after every timing: once the profiler has run, every later replay is
    # slower (a compiled step timed after a profiled one read 2.65 ms instead of 2.27)
    for label, graph in to_profile:
        profile_replays(label, graph, out_dir=args.profile_out)


if __name__ == "__main__":
    main()
