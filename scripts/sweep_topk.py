"""Tile width and warps of the indexer's top-k kernel (kernels/triton_ops.py), swept on a GPU.

    python scripts/sweep_topk.py

Rows of scores as decode steps of 256 rows see them at page-table widths of 128, 256 and 512
pages (1,024-4,096 candidate blocks), a prefill-sized step (2,560 rows of 512) and a small batch
(80 of 256); top 32. Every (tile, warps) through the engine's own launch (triton_ops._topk_blocks
with _TOPK_TILE and _TOPK_LAUNCH set to it), its output checked equal to reference.topk_blocks,
timed by triton.testing.do_bench (median of three), in microseconds. The winner is what
_TOPK_TILE and _TOPK_LAUNCH hold.
"""

import statistics

import torch
import triton

from dsv4bench.engine.kernels import reference, triton_ops

SHAPES = [(256, 1024), (256, 2048), (256, 4096), (2560, 512), (80, 256)]
TOPK = 32


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    data = {
        (rows, nb): (torch.randn(rows, nb, device="cuda", generator=gen), torch.full((rows,), nb, device="cuda"))
        for rows, nb in SHAPES
    }
    print("tile warps  " + "  ".join(f"{r}x{nb}" for r, nb in SHAPES))
    for tile in (128, 256, 512):
        for warps in (1, 2, 4, 8):
            triton_ops._TOPK_TILE, triton_ops._TOPK_LAUNCH = tile, dict(num_warps=warps)
            cells = []
            for scores, n in data.values():
                ok = torch.equal(triton_ops._topk_blocks(scores, n, TOPK), reference.topk_blocks(scores, n, TOPK))
                us = (
                    statistics.median(
                        triton.testing.do_bench(lambda: triton_ops._topk_blocks(scores, n, TOPK), warmup=10, rep=60)
                        for _ in range(3)
                    )
                    * 1e3
                )
                cells.append(f"{us:.1f}" if ok else f"{us:.1f} WRONG")
            print(f"{tile:>4} {warps:>5}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
