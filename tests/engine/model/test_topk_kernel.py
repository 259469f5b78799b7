"""The indexer's top-k kernel (triton_ops._topk_blocks) against reference.topk_blocks: the same
blocks in the same order, for rows shorter than k, of one tile, of many tiles and longer than
the 4,096 columns a whole-row sort once capped. On a GPU the kernel runs as compiled; on CPU,
Triton's interpreter runs the same kernel (in a subprocess: the interpreter is chosen when the
kernel is defined)."""

from __future__ import annotations

import pytest
import torch

# (rows, columns, k): a 1B decode batch at a page-table width of 128, fewer columns than k,
# exactly one tile, one column past a tile, past the old cap (4,096), k not a power of two
CASES = [(256, 1032, 32), (5, 20, 32), (4, 512, 32), (6, 513, 16), (3, 4500, 32), (9, 300, 24)]


def check_cases(device: str, max_rows: int) -> None:
    from dsv4bench.engine.kernels import reference, triton_ops

    for rows, NB, topk in CASES:
        rows = min(rows, max_rows)
        gen = torch.Generator().manual_seed(rows * NB)
        scores = torch.randn(rows, NB, generator=gen)  # either sign: head weights are signed
        scores[:, ::7] = 0.0  # relu's exact zeros, which the reference breaks by recency
        n_elig = torch.randint(0, NB + 1, (rows,), generator=gen)
        n_elig[0] = NB
        n_elig[-1] = min(NB, topk // 2)  # fewer eligible than k: -1 pads the row
        want = reference.topk_blocks(scores, n_elig, topk)
        got = triton_ops._topk_blocks(scores.to(device), n_elig.to(device), topk).cpu()
        assert torch.equal(got, want), ((rows, NB, topk), (got != want).sum())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_topk_kernel_matches_the_reference_on_the_gpu():
    from .conftest import triton_kernels  # here: the file also runs as a script

    triton_kernels("triton_ops")
    check_cases("cuda", max_rows=1 << 20)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU test runs the kernel itself")
def test_topk_kernel_matches_the_reference_in_tritons_interpreter():
    from .conftest import run_in_tritons_interpreter  # here: the file also runs as a script

    run_in_tritons_interpreter(__file__)


if __name__ == "__main__":
    check_cases("cpu", max_rows=2)  # the interpreter takes ~0.2 s a tile of a row
    print("all cases agree")
