"""Attention of DSV4-mini (STRUCTURE.md "Attention of a query"): shared-KV MQA with partial
RoPE, a sliding window of raw KV, compressed entries (all of them in HCA layers, the lightning
indexer's top-k in CSA layers), and a learned per-head sink logit in one softmax.

One KV head, K = V: the stored vector is the value; its RoPE'd copy (rotated at read time, by
its own position for raw KV and by the block's last position for a compressed entry) is the key.

Three paths compute the same math:
- decode group (one new token per sequence): the two kernel ops on padded gathers;
- extend (a prefill chunk of one sequence): a blocked band over the key span, so queries in
  blocks of `window` share one key tile, plus per-query compressed entries;
- dense: full masks over a [B, T] batch, no pools, differentiable; the reference of the math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..kernels import ops_for
from ..kernels.reference import softmax_with_sink, take_rows
from . import pool_writes
from .compressor import Compressor
from .indexer import Indexer, distill_loss
from .kv_pools import KVPools
from .norm import RMSNorm
from .plan import BatchPlan, DecodeGroup, ExtendSeq
from .rope import Rope

NEG_INF = float("-inf")


class Attention(nn.Module):
    """One layer's attention. Pools may hold a narrower dtype than the model computes in (e.g.
    bf16 pools under a float32 model): every read is cast to the activations' dtype."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.window = cfg.window
        self.rate = cfg.rate(layer)
        self.scale = cfg.head_dim**-0.5
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wkv = nn.Linear(cfg.d_model, cfg.head_dim, bias=False)
        self.kv_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.sink = nn.Parameter(torch.zeros(cfg.n_heads))
        self.compressor = Compressor(cfg.head_dim, self.rate)
        self.indexer = (
            Indexer(cfg.d_model, cfg.head_dim, cfg.index_heads, cfg.index_dim, cfg.index_topk)
            if cfg.is_csa(layer)
            else None
        )
        # Which compressed entries a CSA query attends on the dense path (the pooled path always
        # takes the indexer's top-k): "indexer"; "all" eligible ones, DSV4's dense warm-up that
        # teaches attention where far tokens are before the indexer decides; or, to measure how
        # much the model leans on the indexer, "random" top-k or "none".
        self.csa_pick = "indexer"
        self.read_compressed = True  # False: the dense path reads no compressed entry (measurement)
        # [H * hd + hd (+ index_heads * index_dim + index_heads), d_model]: wq, wkv (and the
        # indexer's wq, ww) as one product on static steps, once fused_projections.py set it
        self.fused_in: torch.Tensor | None = None

    # --- pooled path ----------------------------------------------------------------------
    def forward(self, x: torch.Tensor, plan: BatchPlan, pools: KVPools, rope: Rope) -> torch.Tensor:
        """x [N, d_model] (normed) -> [N, d_model]. Writes the new tokens' KV and the entries
        (and index keys) of blocks they complete into the pools, then attends."""
        N, H, hd, l = x.shape[0], self.n_heads, self.head_dim, self.layer
        q, kv, index_q = self._project(x, plan.static)
        q = rope(q.view(N, H, hd), plan.positions.unsqueeze(-1))
        kv = self.kv_norm(kv)
        # NOTE: new tokens write only pages their own requests hold privately, never a cached
        # page a host-tier load may be filling, so the writes (and the compression, which
        # reads back blocks holding a new token) need no gate.
        # NOTE: written through pool_writes, the KVPools methods, which a torch.compile'd step
        # keeps out of its graphs (pool_writes.py says why)
        pool_writes.write_kv(pools, l, plan.new_slots, kv)
        done = plan.compress[self.rate]
        if done.entries.numel():
            # NOTE: entries read the block's KV back from the pool, so blocks straddling
            # steps (earlier tokens from earlier steps) compress exactly like dense ones.
            entries = self.compressor(take_rows(pools.kv_flat(l), done.kv_slots).to(x.dtype))
            pool_writes.write_ckv(pools, l, done.entries, entries)
            if self.indexer is not None:
                pool_writes.write_index_k(pools, l, done.entries, self.indexer.keys(entries))
        # NOTE: as in DSV4's sparse attention, the indexer picks each query's blocks from the
        # index-K pool first; only then does attention read raw and compressed KV.
        dec_blocks = self._decode_blocks(x, plan.decode, pools, index_q) if plan.decode is not None else None
        ext_picks = [self._extend_picks(x[ext.row0 : ext.row0 + ext.length], ext, pools) for ext in plan.extends]
        pools.gate(l, "kv")
        if plan.decode is not None and plan.decode.every_row:
            out = self._decode(q, plan.decode, pools, rope, dec_blocks).to(x.dtype)
            return self.wo(out.view(N, H * hd))
        out = x.new_empty(N, H, hd)
        if plan.decode is not None:
            rows = plan.decode.rows
            out[rows] = self._decode(q[rows], plan.decode, pools, rope, dec_blocks)
        for ext, picks in zip(plan.extends, ext_picks):
            rows_ = slice(ext.row0, ext.row0 + ext.length)
            out[rows_] = self._extend(q[rows_], ext, pools, rope, picks)
        return self.wo(out.view(N, H * hd))

    def _project(
        self, x: torch.Tensor, static: bool
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(wq(x), wkv(x), the indexer's queries of every row or None): on a static step with
        fused_in set, one product; otherwise the indexer projects the rows it selects for."""
        if not static or self.fused_in is None:
            return self.wq(x), self.wkv(x), None
        H, hd = self.n_heads * self.head_dim, self.head_dim
        if self.indexer is None:
            q, kv = F.linear(x, self.fused_in).split([H, hd], -1)
            return q, kv, None
        ix = self.indexer
        q, kv, iq, iw = F.linear(x, self.fused_in).split([H, hd, ix.heads * ix.dim, ix.heads], -1)
        return q, kv, ix.scale_queries(iq, iw)

    def _select(
        self, queries: tuple[torch.Tensor, torch.Tensor], cand: torch.Tensor, n_eligible: torch.Tensor, pools: KVPools
    ) -> torch.Tensor:
        """Indexer top-k for groups [G] of queries (Indexer.queries: [G, Q, heads, dim],
        [G, Q, heads]) over candidates cand [G, NB]."""
        assert self.indexer is not None
        pools.gate(self.layer, "index_k")
        qi, w = queries
        k_flat, s_flat = pools.idx_flat(self.layer)
        return ops_for(qi.device).indexer_topk(qi, w, k_flat, s_flat, cand, n_eligible, self.indexer.topk)

    def _decode_blocks(
        self, x: torch.Tensor, dg: DecodeGroup, pools: KVPools, index_q: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor | None:
        """CSA layers: the block (index into dg.cand) each decode query selects [S, topk], -1
        pad; None in HCA layers and while no sequence has a complete block. index_q: the
        indexer's queries of every row, where _project made them."""
        cand = dg.cand[self.rate]
        if self.indexer is None or cand.shape[1] == 0:
            return None
        n_blocks = dg.n_blocks[self.rate].unsqueeze(1)
        if index_q is None:
            qi, w = self.indexer.queries(x if dg.every_row else x[dg.rows])
        elif dg.every_row:
            qi, w = index_q
        else:
            qi, w = index_q[0][dg.rows], index_q[1][dg.rows]
        return self._select((qi.unsqueeze(1), w.unsqueeze(1)), cand, n_blocks, pools)[:, 0]

    def _extend_picks(self, x: torch.Tensor, ext: ExtendSeq, pools: KVPools) -> torch.Tensor | None:
        """CSA layers: the blocks each query of the chunk selects [length, topk], -1 pad; None
        in HCA layers and when the sequence has no complete block yet."""
        cand = ext.cand[self.rate]
        if self.indexer is None or cand.shape[0] == 0:
            return None
        pos = torch.arange(ext.start, ext.start + ext.length, device=x.device)
        n_elig = ((pos + 1) // self.rate).unsqueeze(0)
        qi, w = self.indexer.queries(x)
        return self._select((qi.unsqueeze(0), w.unsqueeze(0)), cand.unsqueeze(0), n_elig, pools)[0]

    def _decode(
        self, q: torch.Tensor, dg: DecodeGroup, pools: KVPools, rope: Rope, blocks: torch.Tensor | None
    ) -> torch.Tensor:
        r, l = self.rate, self.layer
        cand = dg.cand[r]
        if cand.shape[1] == 0:  # no sequence has a complete block yet
            c_ids, blocks = cand, cand
        elif blocks is not None:
            c_ids = torch.where(blocks >= 0, cand.gather(1, blocks.clamp(min=0)), -1)
        else:
            c_ids = cand
            blocks = torch.arange(cand.shape[1], device=cand.device).expand_as(cand)
        c_pos = (blocks + 1) * r - 1
        return ops_for(q.device).sparse_decode_attention(
            q,
            pools.kv_flat(l),
            dg.win_slots,
            dg.win_pos,
            pools.ckv_flat(l),
            c_ids,
            c_pos,
            self.sink,
            rope.cos,
            rope.sin,
            self.scale,
        )

    def _extend(
        self, q: torch.Tensor, ext: ExtendSeq, pools: KVPools, rope: Rope, picks: torch.Tensor | None
    ) -> torch.Tensor:
        L, s, W, H, hd, r = ext.length, ext.start, self.window, self.n_heads, self.head_dim, self.rate
        dev = q.device
        # Window as a blocked band: query block n (Bq queries) sees buffer rows
        # n*Bq .. n*Bq + Kw - 1, where buffer row i holds position s - W + 1 + i.
        Bq = min(W, L)
        nblk = -(-L // Bq)
        Lp, Kw = nblk * Bq, Bq + W - 1
        span = take_rows(pools.kv_flat(self.layer), ext.span_slots).to(q.dtype)
        buf = span.new_zeros(Lp + W - 1, hd)
        first = max(0, s - W + 1) - (s - W + 1)
        buf[first : first + span.shape[0]] = span
        kbuf = rope(buf, torch.arange(s - W + 1, s + Lp, device=dev))
        kw = kbuf.unfold(0, Kw, Bq).transpose(1, 2)  # [nblk, Kw, hd]
        vw = buf.unfold(0, Kw, Bq).transpose(1, 2)
        qp = q.new_zeros(Lp, H, hd)
        qp[:L] = q
        lw = torch.einsum("nqhd,nkd->nqhk", qp.view(nblk, Bq, H, hd), kw).reshape(Lp, H, Kw)
        qq = torch.arange(Bq, device=dev).unsqueeze(1)
        kk = torch.arange(Kw, device=dev)
        band = (kk >= qq) & (kk <= qq + W - 1)  # [Bq, Kw]
        kpos = s - W + 1 + torch.arange(nblk, device=dev).unsqueeze(1) * Bq + kk  # [nblk, Kw]
        mask_w = (band.unsqueeze(0) & (kpos >= 0).unsqueeze(1)).reshape(Lp, 1, Kw)

        cand = ext.cand[r]
        NB = cand.shape[0]
        n_elig = torch.zeros(Lp, dtype=torch.long, device=dev)
        n_elig[:L] = (torch.arange(s, s + L, device=dev) + 1) // r
        comp = take_rows(pools.ckv_flat(self.layer), cand).to(q.dtype)  # [NB, hd]
        ck = rope(comp, (torch.arange(NB, device=dev) + 1) * r - 1)
        if NB == 0:
            lc, mask_c, vc = lw.new_zeros(Lp, H, 0), mask_w.new_zeros(Lp, 1, 0), None
        elif picks is not None:
            sel = torch.full((Lp, picks.shape[1]), -1, dtype=torch.long, device=dev)
            sel[:L] = picks
            pick = sel.clamp(min=0)
            lc = torch.einsum("lhd,lkd->lhk", qp, take_rows(ck, pick))
            mask_c, vc = (sel >= 0).unsqueeze(1), take_rows(comp, pick)
        else:
            lc = torch.einsum("lhd,bd->lhb", qp, ck)
            mask_c = (torch.arange(NB, device=dev) < n_elig.unsqueeze(1)).unsqueeze(1)
            vc = comp
        logits = torch.cat((lw, lc), -1) * self.scale
        probs = softmax_with_sink(logits.masked_fill(~torch.cat((mask_w, mask_c), -1), NEG_INF), self.sink)
        pw, pc = probs.split([Kw, lc.shape[-1]], dim=-1)
        out = torch.einsum("nqhk,nkd->nqhd", pw.reshape(nblk, Bq, H, Kw), vw).reshape(Lp, H, hd)
        if vc is not None and vc.dim() == 3:
            out = out + torch.einsum("lhk,lkd->lhd", pc, vc)
        elif vc is not None:
            out = out + torch.einsum("lhb,bd->lhd", pc, vc)
        return out[:L]

    # --- dense path -------------------------------------------------------------------------
    def forward_dense(
        self, x: torch.Tensor, rope: Rope, index_k_dtype: str | None, want_aux: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, T, d_model] (normed), positions 0..T-1 -> ([B, T, d_model], indexer
        distillation loss or None). No pools; differentiable except through top-k indices."""
        B, T, _ = x.shape
        H, hd, W, r = self.n_heads, self.head_dim, self.window, self.rate
        dev = x.device
        pos = torch.arange(T, device=dev)
        q = rope(self.wq(x).view(B, T, H, hd), pos.unsqueeze(-1))
        kv = self.kv_norm(self.wkv(x))
        logits = [torch.einsum("bthd,bsd->bths", q, rope(kv, pos))]
        t, s = pos.unsqueeze(1), pos.unsqueeze(0)
        masks = [((s <= t) & (s > t - W)).unsqueeze(1).expand(B, T, 1, T)]
        values = [kv]
        aux = None
        NB = T // r if self.read_compressed else 0
        if NB > 0:
            comp = self.compressor(kv[:, : NB * r].reshape(B, NB, r, hd))
            blocks = torch.arange(NB, device=dev)
            lc = torch.einsum("bthd,bnd->bthn", q, rope(comp, (blocks + 1) * r - 1))
            eligible = (blocks + 1) * r <= (pos + 1).unsqueeze(1)  # [T, NB]
            mask_c = eligible.expand(B, T, NB)
            if self.indexer is not None:
                chosen, scores = self.indexer.select_dense(x, comp, eligible, index_k_dtype, with_scores=want_aux)
                if self.csa_pick == "random":
                    noise = torch.rand(chosen.shape, device=dev).masked_fill(~eligible, -1.0)
                    chosen = torch.zeros_like(chosen).scatter_(
                        -1, noise.topk(min(self.indexer.topk, NB), -1).indices, True
                    )
                if self.csa_pick != "all":
                    mask_c = mask_c & chosen & (self.csa_pick != "none")
                if scores is not None:
                    aux = distill_loss(scores, lc * self.scale, eligible)
            logits.append(lc)
            masks.append(mask_c.unsqueeze(2))
            values.append(comp)
        lg = torch.cat(logits, -1) * self.scale
        probs = softmax_with_sink(lg.masked_fill(~torch.cat(masks, -1), NEG_INF), self.sink)
        parts = probs.split([v.shape[1] for v in values], dim=-1)
        out = sum(torch.einsum("bthk,bkd->bthd", p, v) for p, v in zip(parts, values))
        assert isinstance(out, torch.Tensor)
        return self.wo(out.reshape(B, T, H * hd)), aux
