"""A Triton grouped matrix product for the MoE's routed experts on decode steps (bf16, CUDA).

At a decode step each expert sees a few dozen rows (batch 256, 2 of 8 experts per token: ~64
rows an expert), so the products are bound by reading the expert weights, and
`torch._grouped_mm` reads them at 1.5-2 TB/s of the ~4.2 a copy reaches. Here the rows come
sorted by expert (`offs`: cumulative int32 row counts per expert, as torch._grouped_mm takes
them) and each program owns one (tile of BLOCK_M rows of one expert, BLOCK_N output columns):
the tiles of one column stripe have adjacent program ids, so they run at the same time and the
second tile of an expert with more rows than a tile can find its stripe of weights in L2. Which expert and rows a
program owns is computed in the kernel from `offs` (no host sync, fixed grid: the step is
captured in a CUDA graph); programs past the last tile run an empty loop.

Options the MoE uses (static_moe.py):
- `gather`: row r of the product is a[gather[r]] (the token's hidden state, never copied into
  expert order);
- `swiglu`: b's columns are [gate | up] halves and the result is silu(gate) * up, [M, N / 2],
  from the float32 accumulators;
- `row_scale` with `scatter`: row r of the result is written to row scatter[r], multiplied by
  row_scale[scatter[r]] (the token's gate), so the combine is a sum over k in token order.
triton is imported through triton_support.py; `usable()` says whether the kernel runs here.
"""

from __future__ import annotations

import os

import torch

from .triton_support import AVAILABLE, pow2, tl, triton

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # no triton, or an older one: pointer loads only
    TensorDescriptor = None


if AVAILABLE:
    # NOTE: MT (the row tiles a stripe may need) follows the batch: as a compile-time constant
    # (or an integer Triton specialises on) each CUDA-graph bucket compiled a kernel of its own
    @triton.jit(do_not_specialize=["MT"])
    def _grouped_mm_kernel(
        a_ptr,
        gather_ptr,
        b_ptr,
        offs_ptr,
        c_ptr,
        scale_ptr,
        scatter_ptr,
        K,
        stride_am,
        stride_be,
        stride_bk,
        stride_cm,
        HALF,
        MT,
        E: tl.constexpr,
        E_P: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GATHER: tl.constexpr,
        SWIGLU: tl.constexpr,
        SCATTER: tl.constexpr,
        TMA: tl.constexpr,
    ):
        pid = tl.program_id(0)
        pid_n = pid // MT
        slot = pid % MT
        # the expert whose tiles hold this slot, from the per-expert tile counts
        e = tl.arange(0, E_P)
        ends = tl.load(offs_ptr + e, mask=e < E, other=0)
        starts = tl.load(offs_ptr + e - 1, mask=(e > 0) & (e < E), other=0)
        counts = tl.where(e < E, tl.maximum(ends - starts, 0), 0)
        tiles = (counts + BLOCK_M - 1) // BLOCK_M
        cum = tl.cumsum(tiles, 0)
        ex = tl.sum((cum <= slot).to(tl.int32), 0)
        sel = e == ex
        first = tl.sum(tl.where(sel, cum - tiles, 0), 0)
        row0 = tl.sum(tl.where(sel, starts, 0), 0) + (slot - first) * BLOCK_M
        end = tl.sum(tl.where(sel, ends, 0), 0)  # 0 past the last tile: nothing to do
        k_end = tl.where(ex < E, K, 0)
        ex = tl.minimum(ex, E - 1)

        rm = row0 + tl.arange(0, BLOCK_M)
        mmask = rm < end
        if GATHER:
            src = tl.load(gather_ptr + rm, mask=mmask, other=0).to(tl.int64)
        else:
            src = rm.to(tl.int64)
        rk = tl.arange(0, BLOCK_K)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        a_ptrs = a_ptr + src[:, None] * stride_am + rk[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if TMA:  # b_ptr is a descriptor of b as [E * K, N], blocks [BLOCK_K, BLOCK_N]
            kb = ex * K
            n0 = pid_n * BLOCK_N
            for k0 in range(0, k_end, BLOCK_K):
                a = tl.load(a_ptrs, mask=mmask[:, None], other=0.0)
                acc = tl.dot(a, b_ptr.load([kb + k0, n0]), acc)
                if SWIGLU:
                    acc_up = tl.dot(a, b_ptr.load([kb + k0, n0 + HALF]), acc_up)
                a_ptrs += BLOCK_K
        else:
            b_ptrs = b_ptr + ex.to(tl.int64) * stride_be + rk[:, None] * stride_bk + rn[None, :]
            for _ in range(0, k_end, BLOCK_K):
                a = tl.load(a_ptrs, mask=mmask[:, None], other=0.0)
                acc = tl.dot(a, tl.load(b_ptrs), acc)
                if SWIGLU:
                    acc_up = tl.dot(a, tl.load(b_ptrs + HALF), acc_up)
                a_ptrs += BLOCK_K
                b_ptrs += BLOCK_K * stride_bk
        if SWIGLU:
            acc = acc / (1.0 + tl.exp(-acc)) * acc_up
        if SCATTER:
            dst = tl.load(scatter_ptr + rm, mask=mmask, other=0).to(tl.int64)
            acc = acc * tl.load(scale_ptr + dst, mask=mmask, other=0.0).to(tl.float32)[:, None]
        else:
            dst = rm.to(tl.int64)
        c_ptrs = c_ptr + dst[:, None] * stride_cm + rn[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mmask[:, None])


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, b through the tensor-memory copy engine),
# by (SwiGLU product, at least 128 rows an expert on average), from a sweep on an H200 at the
# 1B config's experts (scripts/bench_moe.py --sweep): 64-row tiles at a decode batch of 80-256,
# 128-row tiles at 1024 (there the products are no longer bound by the weights alone); the
# copy engine for b was no faster. A tuning sweep may replace the entries.
CONFIG = {
    (True, False): (64, 64, 64, 4, 4, False),
    (True, True): (128, 64, 64, 8, 4, False),
    (False, False): (64, 128, 64, 4, 4, False),
    (False, True): (128, 128, 64, 8, 4, False),
}


def config(swiglu: bool, rows: int = 0, experts: int = 1) -> tuple[int, int, int, int, int, bool]:
    return CONFIG[(swiglu, rows >= 128 * experts)]


def shapes_ok(b: torch.Tensor, swiglu: bool) -> bool:
    """Whether the kernel takes weights b [E, K, N]: contiguous, K and the output columns
    whole multiples of the tiles."""
    _, K, N = b.shape
    n_out = N // 2 if swiglu else N
    tiles = [CONFIG[(swiglu, many)][1:3] for many in (False, True)]
    return b.is_contiguous() and (not swiglu or N % 2 == 0) and all(K % bk == 0 and n_out % bn == 0 for bn, bk in tiles)


def _grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    gather: torch.Tensor | None,
    row_scale: torch.Tensor | None,
    scatter: torch.Tensor | None,
    swiglu: bool,
) -> torch.Tensor:
    E, K, N = b.shape
    M = gather.shape[0] if gather is not None else a.shape[0]
    n_out = N // 2 if swiglu else N
    out = torch.empty(M, n_out, dtype=a.dtype, device=a.device)
    if M == 0:
        return out
    a = a if a.stride(-1) == 1 else a.contiguous()
    bm, bn, bk, warps, stages, tma = config(swiglu, M, E)
    mt = triton.cdiv(M, bm) + E  # at most this many row tiles over all experts
    grid = (mt * (n_out // bn),)
    b_arg = TensorDescriptor.from_tensor(b.view(E * K, N), [bk, bn]) if tma else b
    _grouped_mm_kernel[grid](
        a,
        gather.contiguous() if gather is not None else offs,
        b_arg,
        offs.contiguous(),
        out,
        row_scale.contiguous() if row_scale is not None else offs,
        scatter.contiguous() if scatter is not None else offs,
        K,
        a.stride(0),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        n_out,
        mt,
        E=E,
        E_P=pow2(E),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GATHER=gather is not None,
        SWIGLU=swiglu,
        SCATTER=scatter is not None,
        TMA=tma,
        num_warps=warps,
        num_stages=stages,
    )
    return out


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    gather: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    scatter: torch.Tensor | None = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """Rows r in [offs[e-1], offs[e]) of the result are (a[gather[r]] if gather else a[r]) @
    b[e] (b: [E, K, N]), the options applied (module docstring); rows past offs[-1] are not
    written. With scatter, offs[-1] must be the row count and scatter a permutation of it."""
    assert AVAILABLE and a.is_cuda
    assert (row_scale is None) == (scatter is None)
    # NOTE: under torch.compile the launch goes through an opaque custom op, as in
    # triton_ops.py: the tracer never looks inside the kernel
    if torch.compiler.is_compiling():
        return torch.ops.dsv4.grouped_mm(a, b, offs, gather, row_scale, scatter, swiglu)
    return _grouped_mm(a, b, offs, gather, row_scale, scatter, swiglu)


if AVAILABLE:
    _grouped_mm_op = torch.library.custom_op(
        "dsv4::grouped_mm",
        _grouped_mm,
        mutates_args=(),
        schema="(Tensor a, Tensor b, Tensor offs, Tensor? gather, Tensor? row_scale, "
        "Tensor? scatter, bool swiglu) -> Tensor",
    )

    @_grouped_mm_op.register_fake
    def _(a, b, offs, gather, row_scale, scatter, swiglu):
        M = gather.shape[0] if gather is not None else a.shape[0]
        N = b.shape[2] // 2 if swiglu else b.shape[2]
        return a.new_empty(M, N)


_USABLE: dict[str, bool] = {}


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernel runs here and agrees with a per-expert loop (probed once per device
    type and dtype; bf16 on CUDA only, and never under DSV4_MOE_KERNEL=torch)."""
    key = f"{device.type}:{dtype}"
    if key not in _USABLE:
        ok = False
        if (
            AVAILABLE
            and device.type == "cuda"
            and dtype == torch.bfloat16
            and os.environ.get("DSV4_MOE_KERNEL", "") != "torch"
        ):
            try:
                g = torch.Generator(device=device).manual_seed(0)
                a = torch.randn(40, 128, device=device, dtype=dtype, generator=g)
                b = torch.randn(2, 128, 256, device=device, dtype=dtype, generator=g)
                offs = torch.tensor([13, 40], device=device, dtype=torch.int32)
                got = _grouped_mm(a, b, offs, None, None, None, False).float()
                ref = torch.cat((a[:13].float() @ b[0].float(), a[13:].float() @ b[1].float()))
                ok = bool(((got - ref).norm() / ref.norm()).item() < 1e-2)
            except Exception:  # noqa: BLE001 - any failure to build or run means: not here
                ok = False
        _USABLE[key] = ok
    return _USABLE[key]
