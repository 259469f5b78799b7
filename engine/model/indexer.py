"""The lightning indexer of CSA layers: which compressed blocks a query attends.

score(t, b) = sum_h w_h(t) * relu(q_h(t) . k(b)), with index_heads queries q_h of index_dim and
weights w_h from the hidden state at t, and the index key k(b) a learned projection of the
compressed entry of block b. Keys are stored in the index-K pool (fp8 e4m3 + per-entry scale, or
bf16); the dense path rounds them the same way so both paths select the same blocks.

Training: the top-k choice has no gradient, so the LM loss never reaches the indexer. The dense
path can instead return a distillation loss, KL(main attention over eligible blocks, averaged
over heads, detached || softmax of index scores), computed from detached inputs, so the indexer
learns where attention goes without disturbing the main model (DeepSeek-V3.2's recipe).
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.reference import indexer_scores, topk_blocks
from .kv_pools import roundtrip_index_k


class Indexer(nn.Module):
    def __init__(self, d_model: int, head_dim: int, heads: int, dim: int, topk: int) -> None:
        super().__init__()
        self.heads, self.dim, self.topk = heads, dim, topk
        self.wq = nn.Linear(d_model, heads * dim, bias=False)
        self.ww = nn.Linear(d_model, heads, bias=False)
        self.wk = nn.Linear(head_dim, dim, bias=False)

    def queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., d_model] -> (q [..., heads, dim] pre-scaled by dim^-0.5, w [..., heads])."""
        return self.scale_queries(self.wq(x), self.ww(x))

    def scale_queries(self, q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """queries() from the projections wq(x) [..., heads * dim] and ww(x) [..., heads]."""
        return q.view(*q.shape[:-1], self.heads, self.dim) * self.dim**-0.5, w * self.heads**-0.5

    def keys(self, entries: torch.Tensor) -> torch.Tensor:
        """Compressed entries [..., head_dim] -> float index keys [..., dim] (before storage)."""
        return self.wk(entries)

    def select_dense(
        self,
        x: torch.Tensor,
        entries: torch.Tensor,
        eligible: torch.Tensor,
        mode: str | None,
        with_scores: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Dense selection over all blocks of a [B, T] batch.

        x: [B, T, d_model]; entries: [B, NB, head_dim]; eligible: [T, NB] bool; mode: index-K
        storage ("fp8", "bf16") or None for exact keys. Returns (mask [B, T, NB] of selected
        blocks, scores [B, T, NB] with gradient to the indexer's weights when with_scores).
        """
        q, w = self.queries(x.detach())
        k = self.keys(entries.detach())
        if mode is not None:  # straight-through: pool-rounded values, gradient of the exact keys
            k = k + (roundtrip_index_k(k.detach(), mode) - k).detach()
        scores = indexer_scores(q, w, k)
        n_eligible = eligible.sum(-1).expand(x.shape[0], -1)
        sel = topk_blocks(scores.detach(), n_eligible, self.topk)  # [B, T, topk]
        NB = scores.shape[-1]
        # NOTE: padding (-1) scatters into a spare column so it can never clear a real pick
        mask = torch.zeros((*scores.shape[:-1], NB + 1), dtype=torch.bool, device=x.device)
        mask.scatter_(-1, torch.where(sel >= 0, sel, NB), True)
        return mask[..., :NB], (scores if with_scores else None)


def distill_loss(scores: torch.Tensor, attn_logits: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """KL(p_attn || p_index) averaged over queries with at least one eligible block.

    scores: [B, T, NB] index scores; attn_logits: [B, T, H, NB] main attention logits over the
    compressed entries; eligible: [T, NB].
    """
    rows = eligible.any(-1)  # [T]
    if not bool(rows.any()):
        return scores.sum() * 0.0
    # NOTE: a finite fill keeps rows without eligible blocks free of NaN (and their gradient)
    neg = -1e30
    attn = attn_logits.detach().float().masked_fill(~eligible.unsqueeze(1), neg)
    target = torch.softmax(attn, -1).mean(2)
    logp = torch.log_softmax(scores.float().masked_fill(~eligible, neg), -1)
    kl = torch.where(eligible, target * (torch.log(target.clamp(min=1e-20)) - logp), 0.0)
    return kl.sum(-1)[:, rows].mean()
