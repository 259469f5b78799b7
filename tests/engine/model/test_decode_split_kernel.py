"""Decode attention split by key tile (triton_ops._sparse_decode_split_kernel, merged by
_sparse_decode_combine_kernel) against reference.sparse_decode_attention and against the kernel
of one program per sequence: windows and compressed lists of one tile, of several, none at all,
heads and head widths that are not powers of two, and rows whose every key is padding (the
sink alone). On a GPU the kernels run as compiled, float32 and the bf16 tensor-core form at the
1B config's heads; on CPU, Triton's interpreter runs the float32 form (in a subprocess: the
interpreter is chosen when the kernel is defined)."""

from __future__ import annotations

import pytest
import torch

# (sequences, window, compressed, heads, head width)
CASES = [(5, 8, 6, 4, 32), (3, 64, 0, 4, 32), (7, 20, 70, 4, 32), (4, 40, 33, 3, 64), (3, 33, 65, 2, 32)]


def _inputs(S, W, Kc, H, hd, device, dtype=torch.float32, seed=0, rope_dim=16):
    from dsv4bench.engine.model.rope import Rope

    gen = torch.Generator().manual_seed(seed + S * W + Kc)
    rope = Rope(rope_dim, 10000.0, 256)
    kv, ckv = torch.randn(300, hd, generator=gen), torch.randn(120, hd, generator=gen)
    win = torch.randint(0, 300, (S, W), generator=gen)
    win[0, :3] = -1
    win[-1, :] = -1  # the last row: every key padding, its output the sink's (zero)
    c_ids = torch.randint(0, 120, (S, Kc), generator=gen)
    c_ids[-1, :] = -1
    if S > 2 and Kc > 4:
        c_ids[1, Kc // 2 :] = -1
    win_pos = torch.randint(0, 256, (S, W), generator=gen)
    c_pos = torch.randint(0, 256, (S, Kc), generator=gen)
    q = torch.randn(S, H, hd, generator=gen)
    sink = torch.randn(H, generator=gen)
    to = lambda t, dt=None: t.to(device=device, dtype=dt) if dt else t.to(device)
    return (
        to(q, dtype),
        to(kv, dtype),
        to(win),
        to(win_pos),
        to(ckv, dtype),
        to(c_ids),
        to(c_pos),
        to(sink),
        to(rope.cos),
        to(rope.sin),
        hd**-0.5,
    )


def check_cases(device: str, dtype: torch.dtype = torch.float32, cases=CASES, rope_dim=16) -> None:
    from dsv4bench.engine.kernels import reference, triton_ops

    for case in cases:
        args = _inputs(*case, device, dtype, rope_dim=rope_dim)
        want = reference.sparse_decode_attention(
            *[a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        )
        saved = triton_ops._DECODE_SPLIT_ROWS
        try:
            triton_ops._DECODE_SPLIT_ROWS = 1 << 30
            split = triton_ops._decode_attention(*args).float()
            triton_ops._DECODE_SPLIT_ROWS = 0
            whole = triton_ops._decode_attention(*args).float()
        finally:
            triton_ops._DECODE_SPLIT_ROWS = saved
        assert torch.isfinite(split).all(), case
        assert split[-1].abs().max().item() < 1e-6, case  # the sink alone: nothing attended
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        err = ((split - want.float()).norm() / want.float().norm()).item()
        assert err < tol, (case, err)
        err = ((split - whole).norm() / whole.norm()).item()
        assert err < tol, (case, err)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_split_decode_attention_matches_the_reference_on_the_gpu():
    from .conftest import triton_kernels  # here: the file also runs as a script

    triton_kernels("triton_ops")
    check_cases("cuda")
    # the bf16 tensor-core form at the 1B config's heads (16 of 128, RoPE on 64 dims)
    check_cases(
        "cuda",
        torch.bfloat16,
        [(256, 128, 64, 16, 128), (9, 128, 32, 16, 128), (5, 70, 129, 16, 128), (3, 128, 0, 4, 128)],
        rope_dim=64,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU test runs the kernels themselves")
def test_split_decode_attention_matches_the_reference_in_tritons_interpreter():
    from .conftest import run_in_tritons_interpreter  # here: the file also runs as a script

    run_in_tritons_interpreter(__file__)


if __name__ == "__main__":
    check_cases("cpu")
    print("all cases agree")
