"""DSV4Mini: embeddings, pre-norm blocks (attention + MoE), final norm, lm_head.

Layer i is CSA (compression rate csa_rate, lightning indexer top-k) when cfg.is_csa(i), else
HCA (compression rate hca_rate, every complete entry). Two ways to run it:
- `forward(batch, pools)`: the serving path over paged pools (decode and chunked prefill mixed);
  `forward_static_decode`, the same over rows of fixed shapes, for CUDA graphs;
- `forward_dense(token_ids)`: full recompute over [T] or [B, T] tokens, no pools, differentiable
  (training, and the reference the serving path is tested against).
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from .attention import Attention
from .batch import ForwardBatch
from .kv_pools import KVPools
from .moe import MoE
from .norm import RMSNorm
from .plan import BatchPlan, build_plan, build_static_decode_plan
from .rope import Rope
from .static_moe import static_moe


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.moe = MoE(cfg, layer)

    def forward(self, x: torch.Tensor, plan: BatchPlan, pools: KVPools, rope: Rope) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), plan, pools, rope)
        h = self.ffn_norm(x)
        # NOTE: on CUDA every step takes the MoE without a host sync (MoE.forward reads the
        # expert counts back: four syncs a step that leave the GPU idle behind Python)
        return x + (
            static_moe(self.moe, h, plan.token_ids, plan.static)
            if plan.static or h.is_cuda
            else self.moe(h, plan.token_ids)
        )

    def forward_dense(
        self, x: torch.Tensor, token_ids: torch.Tensor, rope: Rope, index_k_dtype: str | None, want_aux: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, aux = self.attn.forward_dense(self.attn_norm(x), rope, index_k_dtype, want_aux)
        x = x + a
        B, T, d = x.shape
        ffn = self.moe(self.ffn_norm(x).reshape(B * T, d), token_ids.reshape(B * T))
        return x + ffn.view(B, T, d), aux


class DSV4Mini(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # NOTE: std d^-0.5 so that tied logits h . e start with unit scale (h is RMS-normed)
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.rope = Rope(cfg.rope_dim, cfg.rope_theta, cfg.max_context)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + lm_head of hidden states [..., d_model] -> [..., vocab]."""
        h = self.norm(h)
        return h @ self.embed.weight.t() if self.lm_head is None else self.lm_head(h)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pools: KVPools, all_logits: bool = False) -> torch.Tensor:
        """Compute the new tokens of `batch` against `pools` (and write their KV, compressed
        entries and index keys there).

        Returns logits [num_seqs, vocab] of each sequence's last new token, in batch order; with
        all_logits, [batch.num_tokens, vocab] for every new token (sequence after sequence).
        """
        assert pools.cfg.model == self.cfg, "pools were built for another model config"
        batch.validate(pools.page_size, pools.num_pages, self.cfg.max_context)
        plan = build_plan(batch, self.cfg, pools.page_size, self.embed.weight.device)
        x = self.embed(plan.token_ids)
        for block in self.blocks:
            x = block(x, plan, pools, self.rope)
        return self.logits(x if all_logits else x[plan.last_rows])

    @torch.inference_mode()
    def forward_static_decode(
        self, token_ids: torch.Tensor, positions: torch.Tensor, page_table: torch.Tensor, pools: KVPools
    ) -> torch.Tensor:
        """One step of B rows, one new token each (a prefill chunk is a row per token), with
        every shape fixed by the inputs' sizes and no host sync (plan.build_static_decode_plan;
        MoE through static_moe): what a CUDA graph captures. Needs pools built with a scratch
        page. Returns logits [B, vocab] of every row."""
        return self.static_decode_step(token_ids, positions, page_table, pools)

    def static_decode_step(
        self, token_ids: torch.Tensor, positions: torch.Tensor, page_table: torch.Tensor, pools: KVPools
    ) -> torch.Tensor:
        """forward_static_decode without its inference-mode wrapper: what torch.compile traces
        (model/compiled_step.py; compiling in inference mode fails on the pools' in-place
        writes), to be called under no_grad."""
        assert pools.scratch_page is not None, "a static decode needs pools with a scratch page"
        plan = build_static_decode_plan(token_ids, positions, page_table, self.cfg, pools.page_size, pools.scratch_page)
        x = self.embed(plan.token_ids)
        for block in self.blocks:
            x = block(x, plan, pools, self.rope)
        return self.logits(x)

    def forward_all_logits(self, batch: ForwardBatch, pools: KVPools) -> torch.Tensor:
        """forward(..., all_logits=True)."""
        return self.forward(batch, pools, all_logits=True)

    def set_csa_pick(self, mode: str, hca: bool = True) -> None:
        """Which compressed entries CSA layers attend on the dense path (Attention.csa_pick),
        and whether HCA layers read theirs."""
        assert mode in ("indexer", "all", "random", "none")
        for block in self.blocks:
            block.attn.csa_pick = mode
            block.attn.read_compressed = hca or block.attn.indexer is not None

    def forward_dense(
        self, token_ids: torch.Tensor, index_k_dtype: str | None = "fp8", return_indexer_loss: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Full recompute of token_ids [T] or [B, T] (positions 0..T-1) -> logits [T, vocab] or
        [B, T, vocab]. Differentiable (top-k selections are not).

        index_k_dtype rounds index keys like the pools ("fp8", "bf16"; None = exact) so the
        selections match a serving run. With return_indexer_loss, also returns the indexer
        distillation loss averaged over CSA layers (0 if none); only the indexers get its
        gradient, and only it reaches the indexers.
        """
        squeeze = token_ids.dim() == 1
        ids = token_ids.unsqueeze(0) if squeeze else token_ids
        x, aux = self.hidden_dense(ids, index_k_dtype, return_indexer_loss)
        logits = self.logits(x)
        logits = logits[0] if squeeze else logits
        if not return_indexer_loss:
            return logits
        return logits, (aux if aux is not None else logits.sum() * 0.0)

    def hidden_dense(
        self, ids: torch.Tensor, index_k_dtype: str | None = "fp8", want_aux: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hidden states [B, T, d_model] before the final norm, and the indexer loss averaged
        over CSA layers (None when not asked or no CSA layer). Training takes logits only
        where it needs them, from these."""
        assert ids.dim() == 2 and ids.shape[1] <= self.cfg.max_context
        x = self.embed(ids)
        losses = []
        for block in self.blocks:
            x, aux = block.forward_dense(x, ids, self.rope, index_k_dtype, want_aux)
            if aux is not None:
                losses.append(aux)
        return x, (torch.stack(losses).mean() if losses else None)
