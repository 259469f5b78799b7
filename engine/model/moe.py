"""Mixture-of-experts FFN: routed SwiGLU experts plus one always-on shared expert.

Routing (DeepSeek-V3 style, aux-loss-free balancing): router scores s = sigmoid(x R^T) (or
softmax); the `experts_per_token` experts with the highest s + selection_bias are chosen, and
their gates are their *unbiased* scores renormalised to sum to 1. The bias only steers which
experts are chosen; training nudges it towards balance (`update_selection_bias`). The first
`n_hash_layers` layers choose experts by a fixed hash of the token id instead (gates still come
from the router's scores of the chosen experts).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig

_M31 = (1 << 31) - 1


def _mix(x: torch.Tensor) -> torch.Tensor:
    """An integer hash on int64 values < 2^31 that never overflows int64 (LCG rounds + xorshift)."""
    for mult in (1103515245, 1664525, 22695477):
        x = (x * mult + 12345) & _M31
        x = x ^ (x >> 13)
    return x


def hash_experts(token_ids: torch.Tensor, n_experts: int, k: int) -> torch.Tensor:
    """k distinct experts per token, a fixed function of the token id: [N] -> [N, k]."""
    keys = _mix(token_ids.long().unsqueeze(-1) * n_experts + torch.arange(n_experts, device=token_ids.device))
    return torch.sort(keys, dim=-1, stable=True).indices[..., :k]


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w_in = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w_out = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.w_in(x))

    def down(self, h: torch.Tensor) -> torch.Tensor:
        """The rest of forward() from h = w_in(x)."""
        gate, up = h.chunk(2, dim=-1)
        return self.w_out(F.silu(gate) * up)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        E, d, h = cfg.n_experts, cfg.d_model, cfg.expert_dim
        self.n_experts, self.k = E, cfg.experts_per_token
        self.score_fn = cfg.router_score
        self.hashed = layer < cfg.n_hash_layers
        self.router = nn.Parameter(torch.randn(E, d) * d**-0.5)
        # NOTE: a buffer, not a parameter: it is set by the balancing rule, never by gradient.
        self.register_buffer("selection_bias", torch.zeros(E))
        self.w_in = nn.Parameter(torch.randn(E, d, 2 * h) * d**-0.5)
        self.w_out = nn.Parameter(torch.randn(E, h, d) * h**-0.5)
        self.shared = SwiGLU(d, cfg.shared_expert_dim)
        # [2 * shared_expert_dim + E, d]: shared.w_in and the router as one product on static
        # steps, once fused_projections.fuse_projections() has set it
        self.fused_in: torch.Tensor | None = None

    def route(
        self,
        x: torch.Tensor,
        token_ids: torch.Tensor,
        top_k: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
        logits: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, d], token_ids [N] -> (experts [N, k] int64, gates [N, k] summing to 1).
        `top_k(biased scores [N, E], k)`: the k chosen columns, torch.topk's by default;
        `logits`: x's router logits [N, E] where the caller has them (fused_projections.py)."""
        if logits is None:
            logits = x @ self.router.t()
        scores = logits.sigmoid() if self.score_fn == "sigmoid" else logits.softmax(-1)
        if self.hashed:
            experts = hash_experts(token_ids, self.n_experts, self.k)
        elif top_k is None:
            experts = (scores + self.selection_bias).topk(self.k, dim=-1).indices
        else:
            experts = top_k(scores + self.selection_bias, self.k)
        gates = scores.gather(-1, experts)
        return experts, gates / gates.sum(-1, keepdim=True)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """x [N, d], token_ids [N] -> [N, d]. Tokens are grouped by expert so each expert runs
        one matmul over all its tokens of the step."""
        assert x.dim() == 2 and token_ids.shape == x.shape[:1]
        experts, gates = self.route(x, token_ids)
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        tok = order // self.k
        counts_t = torch.bincount(flat, minlength=self.n_experts)
        self.last_counts = counts_t.detach()  # read by training's balancing rule
        counts = counts_t.tolist()
        xs = x[tok]
        outs = []
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            gate, up = (xs[start : start + c] @ self.w_in[e]).chunk(2, dim=-1)
            outs.append((F.silu(gate) * up) @ self.w_out[e])
            start += c
        ys = torch.cat(outs) * gates.flatten()[order].unsqueeze(-1).to(x.dtype)
        shared = self.shared(x)
        return shared.index_add(0, tok, ys.to(shared.dtype))  # under autocast the two may differ

    @torch.no_grad()
    def update_selection_bias(self, expert_counts: torch.Tensor, step: float = 1e-3) -> None:
        """Aux-loss-free balancing: raise the bias of under-loaded experts, lower the others."""
        load = expert_counts.float()
        self.selection_bias += step * torch.sign(load.mean() - load)
