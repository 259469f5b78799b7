"""A Triton row scatter for the KV pools' writes on CUDA: dst[index[i]] = src[i] (cast to dst's
dtype), what index_copy_ along the first axis does.

A decode step writes each layer's new KV, and in blocks it completes the compressed entries,
index keys and their scales: a few hundred rows of 4-256 bytes, four writes a CSA layer. Through
index_copy_ each write is a ~3 us kernel at the 1B config's batch 256 (PyTorch's generic indexed
copy); here it is one launch over tiles of rows. Indices must be distinct where it matters (a
row written twice keeps one of the two, as with index_copy_). triton is imported through
triton_support.py; `scatter_rows` falls back to index_copy_ where the kernel does not apply.
"""

from __future__ import annotations

import torch

from .triton_support import AVAILABLE, pow2, tl, triton

ROWS_PER_PROGRAM = 16

if AVAILABLE:

    @triton.jit
    def _scatter_rows_kernel(
        dst_ptr, idx_ptr, src_ptr, N, W, stride_d, stride_s, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr
    ):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rm = r < N
        i = tl.load(idx_ptr + r, mask=rm, other=0).to(tl.int64)
        c = tl.arange(0, BLOCK_W)
        m = rm[:, None] & (c < W)[None, :]
        v = tl.load(src_ptr + r.to(tl.int64)[:, None] * stride_s + c[None, :], mask=m)
        tl.store(dst_ptr + i[:, None] * stride_d + c[None, :], v.to(dst_ptr.dtype.element_ty), mask=m)


def scatter_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """dst.index_copy_(0, index, src.to(dst.dtype)) for dst [rows, ...] and src [n, ...] of the
    same row shape; by the kernel when both are CUDA tensors with contiguous rows (fp8 rows are
    copied as bytes, so src must then be fp8 already), else by index_copy_."""
    n = index.numel()
    width = dst[0].numel() if dst.shape[0] else 0
    byte_float = dst.element_size() == 1 and dst.dtype != torch.uint8
    if not (
        AVAILABLE
        and dst.is_cuda
        and n
        and width
        and src.shape[1:] == dst.shape[1:]
        and dst.is_contiguous()
        and index.is_contiguous()
        and src.reshape(n, -1).stride(-1) == 1
        and (not byte_float or src.dtype == dst.dtype)
    ):
        dst.index_copy_(0, index, src.to(dst.dtype))
        return
    if byte_float:
        dst, src = dst.view(torch.uint8), src.view(torch.uint8)
    _scatter(dst, index, src)


def _scatter(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """The launch, for rows scatter_rows has checked (and tests in Triton's interpreter)."""
    n, width = index.numel(), dst[0].numel()
    flat_src = src.reshape(n, width)
    _scatter_rows_kernel[(triton.cdiv(n, ROWS_PER_PROGRAM),)](
        dst.view(dst.shape[0], width),
        index,
        flat_src,
        n,
        width,
        width,
        flat_src.stride(0),
        BLOCK_R=ROWS_PER_PROGRAM,
        BLOCK_W=pow2(width),
        num_warps=4,
    )
