"""Launch settings of the bf16 decode-attention kernel (kernels/triton_ops.py), swept on a GPU.

    python scripts/sweep_decode_attention.py [--split]

The 1B benchmark config's shapes at a decode batch of 256 (16 heads of 128, RoPE on 64 dims,
128 window and 64 compressed keys a row, at random slots of a large pool): every (key tile,
warps, stages) through the engine's own launch (triton_ops._decode_attention, with
_DECODE_DOT_LAUNCH set to it), timed as CUDA-graph replays (triton.testing.do_bench_cudagraph),
fastest first, with each one's relative difference from the tiles-of-32 output (bf16
probabilities rounded per tile). The winner is what _DECODE_DOT_LAUNCH holds.

`--split` instead times the kernel of one program per sequence against the split by key tile
(one program per sequence and tile, then the merge) at 80, 256 and 1,024 rows of 32, 64 and
128 compressed keys, with the relative difference between the two: where the split pays is
what _DECODE_SPLIT_ROWS holds.
"""

import argparse
import itertools

import torch
import triton

from dsv4bench.engine.model.rope import Rope  # the model package first: the kernels' import order
from dsv4bench.engine.kernels import triton_ops

ROWS, HEADS, HEAD_DIM, WINDOW, COMPRESSED, ROPE_DIM = 256, 16, 128, 128, 64, 64
POOL_SLOTS = 300_000


def inputs(rows: int = ROWS, compressed: int = COMPRESSED) -> tuple:
    torch.manual_seed(0)
    dev = "cuda"
    rope = Rope(ROPE_DIM, 10000.0, 8192)
    cos, sin = rope.cos.to(dev), rope.sin.to(dev)
    kv = torch.randn(POOL_SLOTS, HEAD_DIM, device=dev).bfloat16()
    ckv = torch.randn(POOL_SLOTS // 4, HEAD_DIM, device=dev).bfloat16()
    q = torch.randn(rows, HEADS, HEAD_DIM, device=dev).bfloat16()
    win = torch.randint(0, POOL_SLOTS, (rows, WINDOW), device=dev, dtype=torch.int32)
    win_pos = torch.randint(0, 8000, (rows, WINDOW), device=dev, dtype=torch.int32)
    c_ids = torch.randint(0, POOL_SLOTS // 4, (rows, compressed), device=dev, dtype=torch.int32)
    c_pos = torch.randint(0, 8000, (rows, compressed), device=dev, dtype=torch.int32)
    sink = torch.zeros(HEADS, device=dev)
    return q, kv, win, win_pos, ckv, c_ids, c_pos, sink, cos, sin, HEAD_DIM**-0.5


def compare_split() -> None:
    in_use = triton_ops._DECODE_SPLIT_ROWS
    print(f"rows compressed  one program a row  split by tile  ratio  difference (in use: split up to {in_use} rows)")
    for rows in (80, 256, 1024):
        for compressed in (32, 64, 128):
            args = inputs(rows, compressed)
            times, outs = [], []
            for split_rows in (0, 1 << 30):
                triton_ops._DECODE_SPLIT_ROWS = split_rows
                outs.append(triton_ops._decode_attention(*args).float())
                times.append(
                    triton.testing.do_bench_cudagraph(lambda: triton_ops._decode_attention(*args), rep=50) * 1e3
                )
            err = ((outs[1] - outs[0]).norm() / outs[0].norm()).item()
            print(
                f"{rows:>4} {compressed:>10}  {times[0]:>14.2f} us  {times[1]:>10.2f} us  "
                f"{times[1] / times[0]:>5.2f}  {err:.1e}",
                flush=True,
            )
    triton_ops._DECODE_SPLIT_ROWS = in_use


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", action="store_true", help="time the split by key tile instead")
    if ap.parse_args().split:
        compare_split()
        return
    q, kv, win, win_pos, ckv, c_ids, c_pos, sink, cos, sin, _ = inputs()
    triton_ops._DECODE_SPLIT_ROWS = 0  # the launch settings of the kernel of one program a row
    in_use = triton_ops._DECODE_DOT_LAUNCH

    def attend() -> torch.Tensor:
        return triton_ops._decode_attention(q, kv, win, win_pos, ckv, c_ids, c_pos, sink, cos, sin, HEAD_DIM**-0.5)

    def launch(block_k: int, warps: int, stages: int) -> None:
        triton_ops._DECODE_DOT_LAUNCH = dict(BLOCK_K=block_k, num_warps=warps, num_stages=stages)

    launch(32, 4, 3)  # Triton's default warps and stages, the tiles the kernel first had
    ref = attend().float()
    results = []
    for setting in itertools.product([16, 32, 64, 128], [2, 4, 8], [1, 2, 3, 4]):
        launch(*setting)
        try:
            out = attend().float()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a setting the compiler refuses is reported, not fatal
            print(setting, "failed:", str(e)[:80])
            continue
        err = ((out - ref).norm() / ref.norm()).item()
        us = triton.testing.do_bench_cudagraph(attend, rep=50) * 1e3
        results.append((us, setting, err))
    triton_ops._DECODE_DOT_LAUNCH = in_use
    for us, (block_k, warps, stages), err in sorted(results)[:12]:
        print(f"{us:.2f} us  BLOCK_K {block_k} warps {warps} stages {stages} err {err:.1e}")
    print(
        "in use:",
        in_use,
        "; tiles of 32, 4 warps, 3 stages:",
        [f"{us:.2f} us" for us, s, _ in results if s == (32, 4, 3)],
    )


if __name__ == "__main__":
    main()
