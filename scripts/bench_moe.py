"""The routed experts of one MoE layer on a GPU: torch._grouped_mm against the Triton grouped
kernels (kernels/grouped_moe.py), at the 1B benchmark config's shapes (bench_decode.py).

    python scripts/bench_moe.py [--batches 80,256,1024] [--sweep]

Each variant is captured in a CUDA graph over LAYERS layers' weights (so that no layer's
weights sit in L2 from the previous replay, as in a step) and timed over replays with CUDA
events (median); times are per layer. Bytes: the weights of the experts some row chose, read
once. Rows are routed as a step routes them (top 2 of 8 by random scores). Every variant is
first checked against a float32 per-expert loop (relative error of its output). `--sweep`
(`--sweep2`) times the tile shapes in SWEEP_* (SWEEP2_*) instead of the configured ones, and
the last line of a batch combines the fastest; the table ends the output.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from dsv4bench.engine.kernels import grouped_moe as gm
from dsv4bench.engine.cuda_graphs import capture_graph
from bench_decode import CONFIGS, copy_bandwidth, time_replays
from dsv4bench.engine.model.static_moe import _expert_order

LAYERS = 4

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, tma)
SWEEP_SWIGLU = [
    (64, 64, 64, 4, 4, False),
    (64, 64, 128, 4, 3, False),
    (64, 64, 64, 4, 6, False),
    (128, 64, 64, 8, 4, False),
    (128, 64, 128, 8, 3, False),
    (32, 64, 128, 4, 4, False),
    (64, 32, 128, 4, 4, False),
    (64, 128, 64, 8, 3, False),
    (64, 64, 64, 4, 4, True),
    (64, 64, 128, 4, 3, True),
    (128, 64, 64, 8, 4, True),
    (64, 64, 64, 4, 6, True),
    (32, 64, 128, 4, 4, True),
]
SWEEP_OUT = [
    (64, 128, 64, 4, 4, False),
    (64, 128, 128, 4, 3, False),
    (64, 64, 128, 4, 4, False),
    (128, 128, 64, 8, 4, False),
    (64, 256, 64, 8, 3, False),
    (32, 128, 128, 4, 4, False),
    (64, 64, 64, 4, 6, False),
    (64, 128, 64, 4, 4, True),
    (64, 128, 128, 4, 3, True),
    (64, 64, 128, 4, 4, True),
    (128, 128, 64, 8, 4, True),
    (32, 128, 128, 4, 4, True),
]

# around the best of the first sweep at batch 80-256 (64-row tiles)
SWEEP2_SWIGLU = [
    (64, 64, 64, 4, 4, False),
    (64, 64, 64, 4, 3, False),
    (64, 64, 64, 4, 5, False),
    (64, 64, 64, 8, 4, False),
    (64, 64, 32, 4, 6, False),
    (64, 64, 32, 4, 8, False),
    (32, 64, 64, 4, 4, False),
    (64, 128, 64, 4, 3, False),
    (64, 128, 32, 8, 5, False),
]
SWEEP2_OUT = [
    (64, 128, 64, 4, 4, False),
    (64, 128, 64, 4, 3, False),
    (64, 128, 64, 4, 5, False),
    (64, 128, 64, 8, 4, False),
    (64, 128, 32, 4, 6, False),
    (64, 128, 32, 4, 8, False),
    (32, 128, 64, 4, 4, False),
    (64, 256, 64, 4, 3, False),
    (64, 64, 64, 4, 4, False),
    (64, 256, 32, 8, 5, False),
]


def time_graph(fn, n: int = 50) -> float:
    """Median ms of a replay of fn() captured in a CUDA graph."""
    return time_replays(capture_graph(fn)[0], n)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="80,256,1024")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep2", action="store_true", help="time the tile shapes in SWEEP2_*")
    args = ap.parse_args()
    dev = "cuda"
    m = CONFIGS["1b"]
    E, k, d, h = m.n_experts, m.experts_per_token, m.d_model, m.expert_dim
    bw = copy_bandwidth(dev)
    print(
        f"{torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s (read + written); "
        f"experts {E} x (w_in [{d}, {2 * h}], w_out [{h}, {d}]) bf16, top {k}",
        flush=True,
    )
    torch.manual_seed(0)
    w_in = [torch.randn(E, d, 2 * h, device=dev, dtype=torch.bfloat16) * d**-0.5 for _ in range(LAYERS)]
    w_out = [torch.randn(E, h, d, device=dev, dtype=torch.bfloat16) * h**-0.5 for _ in range(LAYERS)]
    table = [f"{'batch':>5} {'variant':<44} {'us/layer':>9} {'TB/s':>6} {'of copy':>8} {'err':>8}"]

    def row(B: int, name: str, ms: float, nbytes: int, err: float) -> None:
        us = ms * 1e3 / LAYERS
        rate = nbytes / (us / 1e6)
        line = f"{B:>5} {name:<44} {us:>9.1f} {rate / 1e12:>6.2f} {rate / bw:>7.1%} {err:>8.1e}"
        table.append(line)
        print(line, flush=True)

    for B in (int(b) for b in args.batches.split(",")):
        x = torch.randn(B, d, device=dev, dtype=torch.bfloat16)
        scores = torch.rand(B, E, device=dev)
        experts = scores.topk(k, -1).indices
        gates = torch.softmax(scores.gather(-1, experts), -1)
        order, dest, offs = _expert_order(E, experts)
        tok = order // k
        hit = int((torch.bincount(experts.flatten(), minlength=E) > 0).sum())
        counts = torch.diff(offs, prepend=offs.new_zeros(1)).tolist()
        print(f"batch {B}: rows per expert {counts}", flush=True)
        b_in = hit * d * 2 * h * 2
        b_out = hit * h * d * 2
        # float32 references, layer 0
        xs = x[tok].float()
        ref_h = torch.empty(B * k, 2 * h, device=dev)
        s = 0
        for e, o in enumerate(offs.tolist()):
            ref_h[s:o] = xs[s:o] @ w_in[0][e].float()
            s = o
        g_, u_ = ref_h.chunk(2, -1)
        ref_act = F.silu(g_) * u_
        act_bf = ref_act.bfloat16()
        ref_y = torch.empty(B * k, d, device=dev)
        s = 0
        for e, o in enumerate(offs.tolist()):
            ref_y[s:o] = act_bf[s:o].float() @ w_out[0][e].float()
            s = o
        ref_out = (ref_y[dest].view(B, k, d) * gates.unsqueeze(-1)).sum(1)
        flat_gates = gates.reshape(-1)

        # torch._grouped_mm, as static_moe._grouped
        got = torch._grouped_mm(x[tok], w_in[0], offs=offs)
        row(
            B,
            "torch._grouped_mm w_in (+ x[tok])",
            time_graph(lambda: [torch._grouped_mm(x[tok], w, offs=offs) for w in w_in]),
            b_in,
            rel(got, ref_h),
        )
        got = torch._grouped_mm(act_bf, w_out[0], offs=offs)
        row(
            B,
            "torch._grouped_mm w_out",
            time_graph(lambda: [torch._grouped_mm(act_bf, w, offs=offs) for w in w_out]),
            b_out,
            rel(got, ref_y),
        )

        def torch_moe(wi: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
            hh = torch._grouped_mm(x[tok], wi, offs=offs)
            g, u = hh.chunk(2, -1)
            y = torch._grouped_mm((F.silu(g) * u).contiguous(), wo, offs=offs)
            return (y[dest].view(B, k, d) * gates.unsqueeze(-1).to(y.dtype)).sum(1)

        row(
            B,
            "torch: both products + silu + combine",
            time_graph(lambda: [torch_moe(a, b) for a, b in zip(w_in, w_out)]),
            b_in + b_out,
            rel(torch_moe(w_in[0], w_out[0]), ref_out),
        )

        saved = dict(gm.CONFIG)
        if args.sweep2:
            in_cfgs, out_cfgs = SWEEP2_SWIGLU, SWEEP2_OUT
        elif args.sweep:
            in_cfgs, out_cfgs = SWEEP_SWIGLU, SWEEP_OUT
        else:
            in_cfgs, out_cfgs = [gm.config(True, B * k, E)], [gm.config(False, B * k, E)]
        best = {}

        def use(swiglu: bool, cfg: tuple) -> None:
            gm.CONFIG[(swiglu, False)] = gm.CONFIG[(swiglu, True)] = cfg

        for swiglu, cfgs in ((True, in_cfgs), (False, out_cfgs)):
            for cfg in cfgs:
                use(swiglu, cfg)
                name = ("triton w_in+silu (gather) " if swiglu else "triton w_out (gate,scatter) ") + ",".join(
                    str(int(v)) for v in cfg
                )
                try:
                    if swiglu:
                        got = gm._grouped_mm(x, w_in[0], offs, tok, None, None, True)
                        err = rel(got, ref_act)
                        ms = time_graph(lambda: [gm._grouped_mm(x, w, offs, tok, None, None, True) for w in w_in])
                        nb = b_in
                    else:
                        got = gm._grouped_mm(act_bf, w_out[0], offs, None, flat_gates, order, False)
                        want = ref_y[dest] * flat_gates.unsqueeze(-1)
                        err = rel(got, want)
                        ms = time_graph(
                            lambda: [gm._grouped_mm(act_bf, w, offs, None, flat_gates, order, False) for w in w_out]
                        )
                        nb = b_out
                except Exception as exc:  # noqa: BLE001 - a tile shape that does not build
                    print(f"{B:>5} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
                    continue
                row(B, name, ms, nb, err)
                if err < 2e-2 and (swiglu not in best or ms < best[swiglu][0]):
                    best[swiglu] = (ms, cfg)
            gm.CONFIG.update(saved)
        for swiglu in (True, False):
            if swiglu in best:
                use(swiglu, best[swiglu][1])

        def triton_moe(wi: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
            act = gm._grouped_mm(x, wi, offs, tok, None, None, True)
            y = gm._grouped_mm(act, wo, offs, None, flat_gates, order, False)
            return y.view(B, k, d).sum(1)

        label = (
            "triton: both (best "
            + "/".join(",".join(str(int(v)) for v in gm.config(s, B * k, E)) for s in (True, False))
            + ")"
        )
        row(
            B,
            label,
            time_graph(lambda: [triton_moe(a, b) for a, b in zip(w_in, w_out)]),
            b_in + b_out,
            rel(triton_moe(w_in[0], w_out[0]), ref_out),
        )
        gm.CONFIG.update(saved)
    print("\n".join(table))


if __name__ == "__main__":
    main()
