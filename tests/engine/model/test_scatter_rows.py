"""The pools' row scatter (kernels/scatter_rows.py) against index_copy_: rows of bf16 KV cast
from float32, fp8 index keys as bytes, float32 scales one value a row, widths that are not
powers of two, row counts that are not whole tiles, int32 and int64 indices, and the rows it
must leave alone. On a GPU through scatter_rows (as KVPools calls it); on CPU, Triton's
interpreter runs the same kernel (in a subprocess: the interpreter is chosen when the kernel
is defined)."""

from __future__ import annotations

import pytest
import torch

# (pool rows, row shape, written rows, pool dtype, source dtype, index dtype)
CASES = [
    (500, (128,), 256, torch.bfloat16, torch.float32, torch.int64),
    (300, (72,), 17, torch.float32, torch.float32, torch.int32),
    (64, (), 33, torch.float32, torch.float32, torch.int64),
    (200, (64,), 1, torch.uint8, torch.uint8, torch.int32),
    (90, (4, 8), 40, torch.bfloat16, torch.bfloat16, torch.int64),
]


def check_cases(device: str, launch, exact_casts: bool = True) -> None:
    for rows, shape, n, dt, src_dt, idx_dt in CASES:
        gen = torch.Generator().manual_seed(rows + n)
        if dt == torch.uint8:
            pool = torch.randint(0, 256, (rows, *shape), generator=gen, dtype=torch.uint8)
            src = torch.randint(0, 256, (n, *shape), generator=gen, dtype=torch.uint8)
        else:
            pool = torch.randn(rows, *shape, generator=gen).to(dt)
            src = torch.randn(n, *shape, generator=gen).to(src_dt)
        index = torch.randperm(rows, generator=gen)[:n].to(idx_dt)
        want = pool.clone().index_copy_(0, index.long(), src.to(dt))
        got = pool.to(device)
        launch(got, index.to(device), src.to(device))
        got = got.cpu()
        if exact_casts or src_dt == dt:
            assert torch.equal(got, want), (rows, shape, n, dt)
        else:  # Triton's interpreter truncates float32 to bf16 where a GPU rounds
            kept = torch.ones(rows, dtype=torch.bool)
            kept[index.long()] = False
            assert torch.equal(got[kept], want[kept])
            torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_scatter_rows_is_index_copy_on_the_gpu():
    from .conftest import triton_kernels  # here: the file also runs as a script

    sr = triton_kernels("scatter_rows")
    check_cases("cuda", sr.scatter_rows)
    # fp8 keys, as the index-K pool holds them: copied as bytes
    pool = torch.zeros(50, 64, device="cuda").to(torch.float8_e4m3fn)
    src = torch.randn(10, 64, device="cuda").to(torch.float8_e4m3fn)
    index = torch.arange(10, 30, 2, device="cuda")
    sr.scatter_rows(pool, index, src)
    assert torch.equal(pool[index].view(torch.uint8), src.view(torch.uint8))
    assert not pool[1::2].view(torch.uint8).any()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU test runs the kernel itself")
def test_scatter_rows_is_index_copy_in_tritons_interpreter():
    from .conftest import run_in_tritons_interpreter  # here: the file also runs as a script

    run_in_tritons_interpreter(__file__)


if __name__ == "__main__":
    from dsv4bench.engine.kernels import scatter_rows

    check_cases("cpu", scatter_rows._scatter, exact_casts=False)
    print("all cases agree")
