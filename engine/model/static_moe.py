"""The MoE FFN with no host sync and no data-dependent shape, for steps captured in a CUDA
graph (MoE.forward reads the per-expert token counts back to the host to slice its batch).

Same routing and gates as MoE.forward (MoE.route's arithmetic); three ways to apply the experts:
- grouped, Triton (bf16 on CUDA, kernels/grouped_moe.py): routing and the sort by expert in
  one kernel (kernels/moe_route.py; hashed layers route as MoE.route), then two grouped
  products, the first gathering the tokens' rows and applying SiLU-gate in its epilogue, the
  second weighting rows by their gates and writing them back in token order;
  `DSV4_MOE_KERNEL=torch` turns it off (the next way then);
- grouped: tokens sorted by expert and one grouped matrix product per projection
  (`torch._grouped_mm`, bf16 on CUDA), reading each expert's weights once;
- dense: every expert on every token, the unchosen ones gated by 0 (any dtype or device;
  the default config's experts are small enough that this costs nothing on a GPU).
Both compute MoE.forward's function; sums are taken in another order, so the last bits differ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import load_triton
from .moe import MoE

_GROUPED_OK: dict[str, bool] = {}


def triton_moe_usable(moe: MoE, x: torch.Tensor) -> bool:
    """Whether the Triton grouped kernels take this MoE's products (CUDA, bf16, tile-aligned
    weights)."""
    if not x.is_cuda:
        return False
    mod = load_triton("grouped_moe")
    return (
        mod is not None
        and mod.usable(x.device, x.dtype)
        and moe.w_in.dtype == x.dtype
        and x.shape[-1] == moe.w_in.shape[1]
        and mod.shapes_ok(moe.w_in, swiglu=True)
        and mod.shapes_ok(moe.w_out, swiglu=False)
    )


def grouped_mm_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch._grouped_mm runs here (probed once per device type and dtype)."""
    key = f"{device.type}:{dtype}"
    if key not in _GROUPED_OK:
        ok = False
        if device.type == "cuda" and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm"):
            try:
                a = torch.randn(32, 64, device=device, dtype=dtype)
                b = torch.randn(2, 64, 32, device=device, dtype=dtype)
                offs = torch.tensor([16, 32], device=device, dtype=torch.int32)
                got = torch._grouped_mm(a, b, offs=offs)
                ref = torch.cat((a[:16] @ b[0], a[16:] @ b[1]))
                ok = bool(torch.allclose(got.float(), ref.float(), rtol=2e-2, atol=2e-1))
            except (RuntimeError, TypeError, NotImplementedError):
                ok = False
        _GROUPED_OK[key] = ok
    return _GROUPED_OK[key]


def static_moe(moe: MoE, x: torch.Tensor, token_ids: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """MoE.forward(x, token_ids) for x [N, d] without reading anything back to the host. With
    `fused` and moe.fused_in set (fused_projections.py), the shared expert's input projection
    and the router's logits come from one product."""
    shared_h = logits = None
    if fused and moe.fused_in is not None:
        E = moe.n_experts
        shared_h, logits = F.linear(x, moe.fused_in).split([moe.fused_in.shape[0] - E, E], -1)
    if triton_moe_usable(moe, x):  # routes by its own kernel
        ys = _grouped_triton(moe, x, token_ids, logits)
    else:
        experts, gates = moe.route(x, token_ids, top_k_by_argmax if x.is_cuda else None, logits)
        if grouped_mm_usable(x.device, x.dtype):
            ys = _grouped(moe, x, experts, gates)
        else:
            ys = _dense(moe, x, experts, gates)
    shared = moe.shared(x) if shared_h is None else moe.shared.down(shared_h)
    return shared + ys.to(x.dtype)


def top_k_by_argmax(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The top k columns of scores [N, E] as k rounds of argmax (for MoE.route on a GPU: there
    torch.topk of 8 columns is a top-k kernel and a sort kernel, some 10 us a layer; the rounds
    are one small fused kernel under torch.compile). topk's columns, but on exact ties, where
    topk's order is unspecified anyway."""
    picks = []
    for _ in range(k):
        i = scores.argmax(-1, keepdim=True)
        picks.append(i)
        scores = scores.scatter(-1, i, float("-inf"))
    return torch.cat(picks, -1)


def _dense(moe: MoE, x: torch.Tensor, experts: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    E = moe.n_experts
    g = torch.zeros(x.shape[0], E, dtype=x.dtype, device=x.device)
    g.scatter_(1, experts, gates.to(x.dtype))
    h = torch.matmul(x.unsqueeze(0), moe.w_in)  # [E, N, 2h]
    gate, up = h.chunk(2, dim=-1)
    y = torch.matmul(F.silu(gate) * up, moe.w_out)  # [E, N, d]
    return (y * g.t().unsqueeze(-1)).sum(0)


def _expert_order(E: int, experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The N * k (token, expert) entries in expert order, without a host sync: (order: the
    flat entry index at each sorted row, dest: each entry's sorted row, offs: cumulative int32
    row counts per expert)."""
    flat = experts.flatten()
    # NOTE: a counting sort (stable: rank within the expert in row order) instead of argsort,
    # whose radix sort costs a GPU some 25 us a layer; no bincount: it reads its max back.
    # [E, N * k], scanned along its contiguous axis (a scan along the outer one is slow)
    onehot = (torch.arange(E, device=flat.device).unsqueeze(1) == flat.unsqueeze(0)).to(torch.int32)
    seen = torch.cumsum(onehot, 1, dtype=torch.int32)
    counts = seen[:, -1]
    rank = seen.gather(0, flat.unsqueeze(0)).squeeze(0) - 1
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    dest = (offs - counts)[flat] + rank
    order = torch.empty_like(flat).scatter_(0, dest.long(), torch.arange(flat.numel(), device=flat.device))
    return order, dest, offs


def _grouped_triton(moe: MoE, x: torch.Tensor, token_ids: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
    gm = load_triton("grouped_moe")
    k = moe.k
    if moe.hashed:
        experts, gates = moe.route(x, token_ids, top_k_by_argmax, logits)
        order, _, offs = _expert_order(moe.n_experts, experts)
        tok, gates = order // k, gates.reshape(-1)
    else:  # routing and expert order in one kernel (kernels/moe_route.py says why)
        order, tok, gates, offs = load_triton("moe_route").route(
            x @ moe.router.t() if logits is None else logits, moe.selection_bias, k, sigmoid=moe.score_fn == "sigmoid"
        )
    act = gm.grouped_mm(x, moe.w_in, offs, gather=tok, swiglu=True)
    # rows back in (token, choice) order, each times its gate: the combine is a sum over k
    y = gm.grouped_mm(act, moe.w_out, offs, row_scale=gates, scatter=order)
    N, d = x.shape
    return y.view(N, k, d).sum(1).to(x.dtype)


def _grouped(moe: MoE, x: torch.Tensor, experts: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    k = moe.k
    order, dest, offs = _expert_order(moe.n_experts, experts)
    tok = order // k
    h = torch._grouped_mm(x[tok], moe.w_in, offs=offs)
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm((F.silu(gate) * up).contiguous(), moe.w_out, offs=offs)
    # NOTE: every token has exactly k entries, so the combine is a gather back to token order
    # (dest: each entry's sorted row) and a sum over k: no atomics, and one fused kernel
    # under torch.compile where index_add_ stays a kernel of its own
    N, d = x.shape
    ys = y[dest.long()].view(N, k, d) * gates.unsqueeze(-1).to(y.dtype)
    return ys.sum(1).to(x.dtype)
