"""The MoE's routing and expert order as two Triton kernels, for static steps on CUDA.

Under torch.compile the routing of a layer (MoE.route with top_k_by_argmax, then
static_moe._expert_order's counting sort) is about ten generated kernels of 1-2 us each at a
decode batch of 256, plus the gap between each two: some 17 us a layer, more than the shared
expert's two products. Here it is two launches over tiles of rows, one program a tile (no host
sync, no data-dependent shape; one program for the whole batch was as slow as the ten kernels
at 256 rows and slower at 1,024):
1. `_choose_kernel`: each row's experts (k rounds of argmax over the biased scores, as
   top_k_by_argmax: the first column among equal ones) and gates, and each entry's rank within
   its expert in the tile: an expert is chosen at most once by a row, so that rank is the
   number of earlier rows of the tile that chose it (a cumulative sum down the tile's
   [rows, experts] one-hot); and the tile's count per expert;
2. `_place_kernel`: every tile's counts give each expert's first row and the rows earlier
   tiles took; each entry goes to its row in expert order (the counting sort's stable order).
Outputs, as static_moe's Triton path takes them (kernels/grouped_moe.py): `order` (the entry
row * k + choice at each sorted row), `tok` (its row: the grouped product's gather), `gates`
[N * k] in entry order (the gate product's row scale) and `offs` (cumulative int32 row counts
per expert). Arithmetic follows MoE.route in the logits' dtype (float32 or bfloat16): scores,
biased scores, the gates' sum and quotient are each rounded as there, so the choices and gates
are MoE.route's (up to the last bit of an exp).
triton is imported through triton_support.py.
"""

from __future__ import annotations

import torch

from .triton_support import AVAILABLE, pow2, tl, triton

ROWS_PER_TILE = 32  # rows a program routes: a decode batch of 256 is 8 programs
MAX_TILE = 4096  # values a program holds at once (rows or tiles x padded experts)


if AVAILABLE:

    @triton.jit
    def _round(x, ROUND: tl.constexpr):
        """x (float32, finite) rounded to the nearest bfloat16, ties to even, as a bf16 op of
        MoE.route stores it; on the bits, so that Triton's interpreter (whose cast truncates)
        rounds as the GPU does."""
        if ROUND:
            bits = x.to(tl.int32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
            x = bits.to(tl.float32, bitcast=True)
        return x

    @triton.jit
    def _scores(logits_ptr, stride_l, rows, rm, cols, cm, SIGMOID: tl.constexpr, ROUND: tl.constexpr):
        z = tl.load(
            logits_ptr + rows[:, None] * stride_l + cols[None, :], mask=rm[:, None] & cm[None, :], other=0.0
        ).to(tl.float32)
        if SIGMOID:
            s = 1.0 / (1.0 + tl.exp(-z))
        else:
            z = tl.where(cm[None, :], z, float("-inf"))
            p = tl.exp(z - tl.max(z, 1)[:, None])
            s = p / tl.sum(p, 1)[:, None]
        return _round(s, ROUND)

    # NOTE: row and tile counts follow the batch and are never specialised on, so one compile
    # serves every CUDA-graph bucket (grouped_moe.py says why)
    @triton.jit(do_not_specialize=["N"])
    def _choose_kernel(
        logits_ptr,
        stride_l,
        bias_ptr,
        experts_ptr,
        rank_ptr,
        gates_ptr,
        counts_ptr,
        N,
        E: tl.constexpr,
        E_P: tl.constexpr,
        K: tl.constexpr,
        BLOCK_R: tl.constexpr,
        SIGMOID: tl.constexpr,
        ROUND: tl.constexpr,
        ROUND_BIASED: tl.constexpr,
    ):
        """One tile of rows: each entry's expert, gate and rank among the tile's entries of
        that expert; the tile's count per expert."""
        t = tl.program_id(0)
        cols = tl.arange(0, E_P)
        cm = cols < E
        rows = t * BLOCK_R + tl.arange(0, BLOCK_R)
        rm = rows < N
        bias = tl.load(bias_ptr + cols, mask=cm, other=0.0).to(tl.float32)
        s = _scores(logits_ptr, stride_l, rows, rm, cols, cm, SIGMOID, ROUND)
        biased = tl.where(cm[None, :], _round(s + bias[None, :], ROUND_BIASED), float("-inf"))
        left = biased
        chosen = tl.zeros([BLOCK_R, E_P], dtype=tl.int32)
        gate_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
        for _ in tl.static_range(K):  # the sum of the chosen scores, to normalise the gates
            pick = tl.argmax(left, 1, tie_break_left=True)
            hit = cols[None, :] == pick[:, None]
            chosen += (hit & rm[:, None]).to(tl.int32)
            gate_sum += tl.sum(tl.where(hit, s, 0.0), 1)
            left = tl.where(hit, float("-inf"), left)
        gate_sum = tl.where(rm, _round(gate_sum, ROUND), 1.0)
        earlier = tl.cumsum(chosen, 0) - chosen  # [rows, experts]: earlier rows that chose it
        left = biased
        for c in tl.static_range(K):  # the same choices again, now written out
            pick = tl.argmax(left, 1, tie_break_left=True)
            hit = cols[None, :] == pick[:, None]
            j = rows * K + c
            tl.store(experts_ptr + j, pick.to(tl.int32), mask=rm)
            tl.store(rank_ptr + j, tl.sum(tl.where(hit, earlier, 0), 1), mask=rm)
            tl.store(gates_ptr + j, _round(tl.sum(tl.where(hit, s, 0.0), 1) / gate_sum, ROUND), mask=rm)
            left = tl.where(hit, float("-inf"), left)
        tl.store(counts_ptr + t * E_P + cols, tl.sum(chosen, 0))

    @triton.jit(do_not_specialize=["N", "T"])
    def _place_kernel(
        experts_ptr,
        rank_ptr,
        counts_ptr,
        order_ptr,
        tok_ptr,
        offs_ptr,
        N,
        T,
        E: tl.constexpr,
        E_P: tl.constexpr,
        K: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        """One tile of rows: each entry to its row in expert order (every tile's counts read)."""
        t = tl.program_id(0)
        cols = tl.arange(0, E_P)
        total = tl.zeros([E_P], dtype=tl.int32)
        before = tl.zeros([E_P], dtype=tl.int32)  # rows of each expert in earlier tiles
        for t0 in range(0, T, BLOCK_T):
            ts = t0 + tl.arange(0, BLOCK_T)
            c = tl.load(counts_ptr + ts[:, None] * E_P + cols[None, :], mask=(ts < T)[:, None], other=0)
            total += tl.sum(c, 0)
            before += tl.sum(tl.where((ts < t)[:, None], c, 0), 0)
        ends = tl.cumsum(total, 0)
        if t == 0:
            tl.store(offs_ptr + cols, ends, mask=cols < E)
        base = ends - total + before
        rows = t * BLOCK_R + tl.arange(0, BLOCK_R)
        rm = rows < N
        for c in tl.static_range(K):
            j = rows * K + c
            e = tl.load(experts_ptr + j, mask=rm, other=0)
            d = tl.sum(tl.where(cols[None, :] == e[:, None], base[None, :], 0), 1)
            d += tl.load(rank_ptr + j, mask=rm, other=0)
            tl.store(order_ptr + d, j, mask=rm)
            tl.store(tok_ptr + d, rows, mask=rm)


def _route(
    logits: torch.Tensor, bias: torch.Tensor, k: int, sigmoid: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    N, E = logits.shape
    dev = logits.device
    order = torch.empty(N * k, dtype=torch.int32, device=dev)
    tok = torch.empty(N * k, dtype=torch.int32, device=dev)
    gates = torch.empty(N * k, dtype=logits.dtype, device=dev)
    offs = torch.empty(E, dtype=torch.int32, device=dev)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    e_p = pow2(E)
    block_r = max(8, min(ROWS_PER_TILE, MAX_TILE // e_p))
    tiles = triton.cdiv(N, block_r)
    experts = torch.empty(N * k, dtype=torch.int32, device=dev)
    rank = torch.empty(N * k, dtype=torch.int32, device=dev)
    counts = torch.empty(tiles, e_p, dtype=torch.int32, device=dev)
    _choose_kernel[(tiles,)](
        logits,
        logits.stride(0),
        bias.contiguous(),
        experts,
        rank,
        gates,
        counts,
        N,
        E=E,
        E_P=e_p,
        K=k,
        BLOCK_R=block_r,
        SIGMOID=sigmoid,
        ROUND=logits.dtype == torch.bfloat16,
        ROUND_BIASED=torch.promote_types(logits.dtype, bias.dtype) == torch.bfloat16,
    )
    _place_kernel[(tiles,)](
        experts,
        rank,
        counts,
        order,
        tok,
        offs,
        N,
        tiles,
        E=E,
        E_P=e_p,
        K=k,
        BLOCK_R=block_r,
        BLOCK_T=max(2, MAX_TILE // e_p),
    )
    return order, tok, gates, offs


def route(
    logits: torch.Tensor, bias: torch.Tensor, k: int, sigmoid: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits [N, E] (their last axis contiguous) and the selection bias [E] ->
    (order, tok, gates, offs) (module docstring): MoE.route's choices and gates, in the
    counting sort's expert order."""
    assert AVAILABLE and 1 <= k <= logits.shape[1]
    assert logits.dtype in (torch.float32, torch.bfloat16), logits.dtype
    # NOTE: under torch.compile the launch goes through an opaque custom op, as in
    # grouped_moe.py
    if torch.compiler.is_compiling():
        return torch.ops.dsv4.moe_route(logits, bias, k, sigmoid)
    return _route(logits, bias, k, sigmoid)


if AVAILABLE:
    _route_op = torch.library.custom_op(
        "dsv4::moe_route",
        _route,
        mutates_args=(),
        schema="(Tensor logits, Tensor bias, int k, bool sigmoid) -> (Tensor, Tensor, Tensor, Tensor)",
    )

    @_route_op.register_fake
    def _(logits, bias, k, sigmoid):
        N, E = logits.shape
        i32 = dict(dtype=torch.int32, device=logits.device)
        return (
            logits.new_empty(N * k, **i32),
            logits.new_empty(N * k, **i32),
            logits.new_empty(N * k),
            logits.new_empty(E, **i32),
        )
