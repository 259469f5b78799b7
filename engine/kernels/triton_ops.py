"""Triton kernels for the two hot ops on CUDA; semantics are those of kernels/reference.py.

- `indexer_topk`: a kernel computes the lightning indexer scores straight from the paged
  index-K pool (fp8 e4m3 dequantised with its per-entry scale, or bf16) for every (query,
  candidate block); a second kernel takes each query's top-k with tl.topk, partial bitonic
  sorts of its row of scores in tiles of fixed width, merged as it goes
  (reference.topk_blocks' masking and zero tie-break; torch.topk of rows of ~1k blocks is a
  radix select and a sort, ~25 us a layer at 256 queries).
- `sparse_decode_attention`: one program per sequence, all heads at once; it walks the window
  slots then the compressed entries in tiles, rotates keys by their positions at read time
  (half-split partial RoPE), and keeps an online softmax whose running max and denominator
  start at the sink logit (so the sink is in the denominator and never NaN).

Float32 inputs are computed in float32 with elementwise products (no tl.dot: heads are few and
tf32 would break agreement with the reference). Bfloat16 queries (a bf16 model) take tensor-core
variants: tl.dot on bf16 operands with float32 accumulation (keys rotated in float32, then
rounded to bf16; probabilities rounded to bf16 for the value product), what a bf16 model's
attention does anyway; wide heads (a 1B config's 16 x 128) spill registers in the elementwise
form. triton is imported through triton_support.py: AVAILABLE is False when it is missing,
and kernels/__init__.py then never selects this module.
"""

from __future__ import annotations

import torch

from . import reference
from .triton_support import AVAILABLE, pow2, tl, triton


if AVAILABLE:

    @triton.jit
    def _indexer_scores_kernel(
        q_ptr,
        w_ptr,
        k_ptr,
        s_ptr,
        cand_ptr,
        nelig_ptr,
        out_ptr,
        Q,
        NB,
        H: tl.constexpr,
        D: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr,
        HAS_SCALE: tl.constexpr,
    ):
        gq = tl.program_id(0)  # one (group, query) row
        g = gq // Q
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        hm = h < H
        dm = d < D
        q = tl.load(q_ptr + gq * H * D + h[:, None] * D + d[None, :], mask=hm[:, None] & dm[None, :], other=0.0).to(
            tl.float32
        )
        w = tl.load(w_ptr + gq * H + h, mask=hm, other=0.0).to(tl.float32)
        n_elig = tl.load(nelig_ptr + gq)
        nm = (n < NB) & (n < n_elig)
        ids = tl.load(cand_ptr + g * NB + n, mask=nm, other=0)
        nm = nm & (ids >= 0)
        ids = tl.where(nm, ids, 0)
        k = tl.load(k_ptr + ids[:, None] * D + d[None, :], mask=nm[:, None] & dm[None, :], other=0.0).to(tl.float32)
        dots = tl.maximum(tl.sum(q[:, None, :] * k[None, :, :], axis=2), 0.0)  # [BH, BN]
        score = tl.sum(dots * w[:, None], axis=0)
        if HAS_SCALE:  # relu commutes with the positive per-entry scale (as in reference.py)
            score = score * tl.load(s_ptr + ids, mask=nm, other=0.0)
        score = tl.where(nm, score, float("-inf"))
        tl.store(out_ptr + gq * NB + n, score, mask=n < NB)

    @triton.jit
    def _attend_tile(
        acc_a,
        acc_b,
        acc_c,
        m_i,
        l_i,
        qa,
        qb,
        qc,
        src_ptr,
        ids_ptr,
        pos_ptr,
        cos_ptr,
        sin_ptr,
        k0,
        K,
        max_pos,
        scale,
        HD: tl.constexpr,
        HALF: tl.constexpr,
        REST: tl.constexpr,
        REST_P: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        kk = k0 + tl.arange(0, BLOCK_K)
        km = kk < K
        ids = tl.load(ids_ptr + kk, mask=km, other=-1)
        valid = km & (ids >= 0)
        ids = tl.where(valid, ids, 0)
        pos = tl.load(pos_ptr + kk, mask=km, other=0)
        pos = tl.minimum(tl.maximum(pos, 0), max_pos - 1)
        j = tl.arange(0, HALF)
        r = tl.arange(0, REST_P)
        base = src_ptr + ids[:, None] * HD
        va = tl.load(base + j[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        vb = tl.load(base + HALF + j[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        vc = tl.load(base + 2 * HALF + r[None, :], mask=valid[:, None] & (r < REST)[None, :], other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + pos[:, None] * HALF + j[None, :])
        s = tl.load(sin_ptr + pos[:, None] * HALF + j[None, :])
        ka = va * c - vb * s
        kb = vb * c + va * s
        logits = (
            tl.sum(qa[:, None, :] * ka[None, :, :], axis=2)
            + tl.sum(qb[:, None, :] * kb[None, :, :], axis=2)
            + tl.sum(qc[:, None, :] * vc[None, :, :], axis=2)
        ) * scale
        logits = tl.where(valid[None, :], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(logits - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc_a = acc_a * alpha[:, None] + tl.sum(p[:, :, None] * va[None, :, :], axis=1)
        acc_b = acc_b * alpha[:, None] + tl.sum(p[:, :, None] * vb[None, :, :], axis=1)
        acc_c = acc_c * alpha[:, None] + tl.sum(p[:, :, None] * vc[None, :, :], axis=1)
        return acc_a, acc_b, acc_c, m_new, l_i

    @triton.jit
    def _sparse_decode_kernel(
        q_ptr,
        kv_ptr,
        win_ptr,
        winpos_ptr,
        ckv_ptr,
        cid_ptr,
        cpos_ptr,
        sink_ptr,
        cos_ptr,
        sin_ptr,
        out_ptr,
        W,
        KC,
        max_pos,
        scale,
        H: tl.constexpr,
        HD: tl.constexpr,
        HALF: tl.constexpr,
        REST: tl.constexpr,
        REST_P: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        sid = tl.program_id(0)
        h = tl.arange(0, BLOCK_H)
        hm = h < H
        j = tl.arange(0, HALF)
        r = tl.arange(0, REST_P)
        rm = r < REST
        qbase = q_ptr + sid * H * HD + h[:, None] * HD
        qa = tl.load(qbase + j[None, :], mask=hm[:, None], other=0.0).to(tl.float32)
        qb = tl.load(qbase + HALF + j[None, :], mask=hm[:, None], other=0.0).to(tl.float32)
        qc = tl.load(qbase + 2 * HALF + r[None, :], mask=hm[:, None] & rm[None, :], other=0.0).to(tl.float32)
        # NOTE: the sink starts the online softmax: running max = sink, denominator = 1
        m_i = tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32)
        l_i = tl.full([BLOCK_H], 1.0, tl.float32)
        acc_a = tl.zeros([BLOCK_H, HALF], tl.float32)
        acc_b = tl.zeros([BLOCK_H, HALF], tl.float32)
        acc_c = tl.zeros([BLOCK_H, REST_P], tl.float32)
        for k0 in range(0, W, BLOCK_K):
            acc_a, acc_b, acc_c, m_i, l_i = _attend_tile(
                acc_a,
                acc_b,
                acc_c,
                m_i,
                l_i,
                qa,
                qb,
                qc,
                kv_ptr,
                win_ptr + sid * W,
                winpos_ptr + sid * W,
                cos_ptr,
                sin_ptr,
                k0,
                W,
                max_pos,
                scale,
                HD,
                HALF,
                REST,
                REST_P,
                BLOCK_K,
            )
        for k0 in range(0, KC, BLOCK_K):
            acc_a, acc_b, acc_c, m_i, l_i = _attend_tile(
                acc_a,
                acc_b,
                acc_c,
                m_i,
                l_i,
                qa,
                qb,
                qc,
                ckv_ptr,
                cid_ptr + sid * KC,
                cpos_ptr + sid * KC,
                cos_ptr,
                sin_ptr,
                k0,
                KC,
                max_pos,
                scale,
                HD,
                HALF,
                REST,
                REST_P,
                BLOCK_K,
            )
        inv = 1.0 / l_i
        obase = out_ptr + sid * H * HD + h[:, None] * HD
        ty = out_ptr.dtype.element_ty
        tl.store(obase + j[None, :], (acc_a * inv[:, None]).to(ty), mask=hm[:, None])
        tl.store(obase + HALF + j[None, :], (acc_b * inv[:, None]).to(ty), mask=hm[:, None])
        tl.store(obase + 2 * HALF + r[None, :], (acc_c * inv[:, None]).to(ty), mask=hm[:, None] & rm[None, :])


if AVAILABLE:

    @triton.jit
    def _indexer_scores_dot_kernel(
        q_ptr,
        w_ptr,
        k_ptr,
        s_ptr,
        cand_ptr,
        nelig_ptr,
        out_ptr,
        Q,
        NB,
        H: tl.constexpr,
        D: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_N: tl.constexpr,
        HAS_SCALE: tl.constexpr,
    ):
        gq = tl.program_id(0)
        g = gq // Q
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, D)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        hm = h < H
        q = tl.load(q_ptr + gq * H * D + h[:, None] * D + d[None, :], mask=hm[:, None], other=0.0)
        w = tl.load(w_ptr + gq * H + h, mask=hm, other=0.0).to(tl.float32)
        n_elig = tl.load(nelig_ptr + gq)
        nm = (n < NB) & (n < n_elig)
        ids = tl.load(cand_ptr + g * NB + n, mask=nm, other=0)
        nm = nm & (ids >= 0)
        ids = tl.where(nm, ids, 0)
        k = tl.load(k_ptr + ids[:, None] * D + d[None, :], mask=nm[:, None], other=0.0)
        dots = tl.maximum(tl.dot(q.to(tl.bfloat16), tl.trans(k.to(tl.bfloat16))), 0.0)  # [BH, BN]
        score = tl.sum(dots * w[:, None], axis=0)
        if HAS_SCALE:
            score = score * tl.load(s_ptr + ids, mask=nm, other=0.0)
        score = tl.where(nm, score, float("-inf"))
        tl.store(out_ptr + gq * NB + n, score, mask=n < NB)

    @triton.jit
    def _topk_keys(scores_ptr, n_elig, NB, c0, BLOCK: tl.constexpr):
        """Sort keys of columns c0 .. c0 + BLOCK of a row: int64, score above column, so a
        top-k carries its columns."""
        col = c0 + tl.arange(0, BLOCK)
        s = tl.load(scores_ptr + col, mask=col < NB, other=0.0)
        s = tl.where(s == 0.0, (col + 1).to(tl.float32) * 1e-30, s)
        s = tl.where((col < NB) & (col < n_elig), s, float("-inf"))
        # NOTE: a float's bits with the magnitude bits flipped when negative order as signed
        # integers the way the floats do
        bits = s.to(tl.int32, bitcast=True)
        return ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32) | col.to(tl.int64)

    @triton.jit(do_not_specialize=["NB"])
    def _topk_blocks_kernel(
        scores_ptr, nelig_ptr, out_ptr, NB, TOPK: tl.constexpr, TOPK_P: tl.constexpr, BLOCK: tl.constexpr
    ):
        # NOTE: the row is read in tiles of BLOCK columns and a running top TOPK_P kept (the
        # tile's top merged with it), so the kernel's shape never depends on the row's length:
        # one compile serves every page-table width (sorting the whole row at once compiled a
        # kernel per width, 0.8-3.5 s each, in the middle of a run)
        row = tl.program_id(0)
        n_elig = tl.load(nelig_ptr + row)
        base = scores_ptr + row.to(tl.int64) * NB
        best = tl.topk(_topk_keys(base, n_elig, NB, 0, BLOCK), TOPK_P)  # descending
        for c0 in range(BLOCK, NB, BLOCK):
            tile = tl.topk(_topk_keys(base, n_elig, NB, c0, BLOCK), TOPK_P)
            best = tl.topk(tl.reshape(tl.join(best, tile), (2 * TOPK_P,)), TOPK_P)
        pick = best & 0x7FFFFFFF  # the column
        pick = tl.where((pick < NB) & (pick < n_elig), pick, -1)
        k = tl.arange(0, TOPK_P)
        tl.store(out_ptr + row * TOPK + k, pick, mask=k < TOPK)

    @triton.jit
    def _attend_tile_dot(
        acc_a,
        acc_b,
        acc_c,
        m_i,
        l_i,
        qa,
        qb,
        qc,
        src_ptr,
        ids_ptr,
        pos_ptr,
        cos_ptr,
        sin_ptr,
        k0,
        K,
        max_pos,
        scale,
        HD: tl.constexpr,
        HALF: tl.constexpr,
        REST: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        kk = k0 + tl.arange(0, BLOCK_K)
        km = kk < K
        ids = tl.load(ids_ptr + kk, mask=km, other=-1)
        valid = km & (ids >= 0)
        ids = tl.where(valid, ids, 0)
        pos = tl.load(pos_ptr + kk, mask=km, other=0)
        pos = tl.minimum(tl.maximum(pos, 0), max_pos - 1)
        j = tl.arange(0, HALF)
        r = tl.arange(0, REST)
        base = src_ptr + ids[:, None] * HD
        va = tl.load(base + j[None, :], mask=valid[:, None], other=0.0)
        vb = tl.load(base + HALF + j[None, :], mask=valid[:, None], other=0.0)
        vc = tl.load(base + 2 * HALF + r[None, :], mask=valid[:, None], other=0.0).to(tl.bfloat16)
        c = tl.load(cos_ptr + pos[:, None] * HALF + j[None, :])
        s = tl.load(sin_ptr + pos[:, None] * HALF + j[None, :])
        fa = va.to(tl.float32)
        fb = vb.to(tl.float32)
        ka = (fa * c - fb * s).to(tl.bfloat16)
        kb = (fb * c + fa * s).to(tl.bfloat16)
        logits = tl.dot(qa, tl.trans(ka))
        logits = tl.dot(qb, tl.trans(kb), logits)
        logits = tl.dot(qc, tl.trans(vc), logits) * scale
        logits = tl.where(valid[None, :], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(logits - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pb = p.to(tl.bfloat16)
        acc_a = tl.dot(pb, va.to(tl.bfloat16), acc_a * alpha[:, None])
        acc_b = tl.dot(pb, vb.to(tl.bfloat16), acc_b * alpha[:, None])
        acc_c = tl.dot(pb, vc, acc_c * alpha[:, None])
        return acc_a, acc_b, acc_c, m_new, l_i

    @triton.jit
    def _sparse_decode_dot_kernel(
        q_ptr,
        kv_ptr,
        win_ptr,
        winpos_ptr,
        ckv_ptr,
        cid_ptr,
        cpos_ptr,
        sink_ptr,
        cos_ptr,
        sin_ptr,
        out_ptr,
        W,
        KC,
        max_pos,
        scale,
        H: tl.constexpr,
        HD: tl.constexpr,
        HALF: tl.constexpr,
        REST: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        sid = tl.program_id(0)
        h = tl.arange(0, BLOCK_H)
        hm = h < H
        j = tl.arange(0, HALF)
        r = tl.arange(0, REST)
        qbase = q_ptr + sid * H * HD + h[:, None] * HD
        qa = tl.load(qbase + j[None, :], mask=hm[:, None], other=0.0)
        qb = tl.load(qbase + HALF + j[None, :], mask=hm[:, None], other=0.0)
        qc = tl.load(qbase + 2 * HALF + r[None, :], mask=hm[:, None], other=0.0)
        m_i = tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32)
        l_i = tl.full([BLOCK_H], 1.0, tl.float32)
        acc_a = tl.zeros([BLOCK_H, HALF], tl.float32)
        acc_b = tl.zeros([BLOCK_H, HALF], tl.float32)
        acc_c = tl.zeros([BLOCK_H, REST], tl.float32)
        for k0 in range(0, W, BLOCK_K):
            acc_a, acc_b, acc_c, m_i, l_i = _attend_tile_dot(
                acc_a,
                acc_b,
                acc_c,
                m_i,
                l_i,
                qa,
                qb,
                qc,
                kv_ptr,
                win_ptr + sid * W,
                winpos_ptr + sid * W,
                cos_ptr,
                sin_ptr,
                k0,
                W,
                max_pos,
                scale,
                HD,
                HALF,
                REST,
                BLOCK_K,
            )
        for k0 in range(0, KC, BLOCK_K):
            acc_a, acc_b, acc_c, m_i, l_i = _attend_tile_dot(
                acc_a,
                acc_b,
                acc_c,
                m_i,
                l_i,
                qa,
                qb,
                qc,
                ckv_ptr,
                cid_ptr + sid * KC,
                cpos_ptr + sid * KC,
                cos_ptr,
                sin_ptr,
                k0,
                KC,
                max_pos,
                scale,
                HD,
                HALF,
                REST,
                BLOCK_K,
            )
        inv = 1.0 / l_i
        obase = out_ptr + sid * H * HD + h[:, None] * HD
        ty = out_ptr.dtype.element_ty
        tl.store(obase + j[None, :], (acc_a * inv[:, None]).to(ty), mask=hm[:, None])
        tl.store(obase + HALF + j[None, :], (acc_b * inv[:, None]).to(ty), mask=hm[:, None])
        tl.store(obase + 2 * HALF + r[None, :], (acc_c * inv[:, None]).to(ty), mask=hm[:, None])


if AVAILABLE:

    @triton.jit
    def _attend_one_tile(
        acc_a,
        acc_b,
        acc_c,
        m_i,
        l_i,
        qa,
        qb,
        qc,
        src_ptr,
        ids_ptr,
        pos_ptr,
        cos_ptr,
        sin_ptr,
        k0,
        K,
        max_pos,
        scale,
        HD: tl.constexpr,
        HALF: tl.constexpr,
        REST: tl.constexpr,
        REST_P: tl.constexpr,
        BLOCK_K: tl.constexpr,
        DOT: tl.constexpr,
    ):
        if DOT:
            return _attend_tile_dot(
                acc_a,
                acc_b,
                acc_c,
                m_i,
                l_i,
                qa,
                qb,
                qc,
                src_ptr,
                ids_ptr,
                pos_ptr,
                cos_ptr,
                sin_ptr,
                k0,
                K,
                max_pos,
                scale,
                HD,
                HALF,
                REST,
                BLOCK_K,
            )
        return _attend_tile(
            acc_a,
            acc_b,
            acc_c,
            m_i,
            l_i,
            qa,
            qb,
            qc,
            src_ptr,
            ids_ptr,
            pos_ptr,
            cos_ptr,
            sin_ptr,
            k0,
            K,
            max_pos,
            scale,
            HD,
            HALF,
            REST,
            REST_P,
            BLOCK_K,
        )

    @triton.jit
    def _sparse_decode_split_kernel(
        q_ptr,
        kv_ptr,
        win_ptr,
        winpos_ptr,
        ckv_ptr,
        cid_ptr,
        cpos_ptr,
        sink_ptr,
        cos_ptr,
        sin_ptr,
        part_ptr,
        ml_ptr,
        W,
        KC,
        TW,
        NT,
        max_pos,
        scale,
        H: tl.constexpr,
        HD: tl.constexpr,
        HD_P: tl.constexpr,
        HALF: tl.constexpr,
        REST: tl.constexpr,
        REST_P: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_K: tl.constexpr,
        DOT: tl.constexpr,
    ):
        # one program per (sequence, key tile): tiles 0 .. TW-1 of the window, then the
        # compressed entries'; the partial softmax (running max, denominator, unnormalised
        # output) goes to part/ml for _sparse_decode_combine_kernel. Tile 0 carries the sink.
        sid = tl.program_id(0)
        t = tl.program_id(1)
        h = tl.arange(0, BLOCK_H)
        hm = h < H
        j = tl.arange(0, HALF)
        r = tl.arange(0, REST_P)
        rm = r < REST
        qbase = q_ptr + sid * H * HD + h[:, None] * HD
        qa = tl.load(qbase + j[None, :], mask=hm[:, None], other=0.0)
        qb = tl.load(qbase + HALF + j[None, :], mask=hm[:, None], other=0.0)
        qc = tl.load(qbase + 2 * HALF + r[None, :], mask=hm[:, None] & rm[None, :], other=0.0)
        if not DOT:
            qa, qb, qc = qa.to(tl.float32), qb.to(tl.float32), qc.to(tl.float32)
        # NOTE: -1e30, not -inf, for the tiles without the sink: a tile whose keys are all
        # padding keeps a finite max, so no exp(-inf - -inf) turns into NaN
        first = t == 0
        m_i = tl.where(first, tl.load(sink_ptr + h, mask=hm, other=0.0).to(tl.float32), -1e30)
        l_i = tl.where(first, 1.0, 0.0) + tl.zeros([BLOCK_H], tl.float32)
        acc_a = tl.zeros([BLOCK_H, HALF], tl.float32)
        acc_b = tl.zeros([BLOCK_H, HALF], tl.float32)
        acc_c = tl.zeros([BLOCK_H, REST_P], tl.float32)
        if t < TW:
            acc_a, acc_b, acc_c, m_i, l_i = _attend_one_tile(
                acc_a,
                acc_b,
                acc_c,
                m_i,
                l_i,
                qa,
                qb,
                qc,
                kv_ptr,
                win_ptr + sid * W,
                winpos_ptr + sid * W,
                cos_ptr,
                sin_ptr,
                t * BLOCK_K,
                W,
                max_pos,
                scale,
                HD,
                HALF,
                REST,
                REST_P,
                BLOCK_K,
                DOT,
            )
        else:
            acc_a, acc_b, acc_c, m_i, l_i = _attend_one_tile(
                acc_a,
                acc_b,
                acc_c,
                m_i,
                l_i,
                qa,
                qb,
                qc,
                ckv_ptr,
                cid_ptr + sid * KC,
                cpos_ptr + sid * KC,
                cos_ptr,
                sin_ptr,
                (t - TW) * BLOCK_K,
                KC,
                max_pos,
                scale,
                HD,
                HALF,
                REST,
                REST_P,
                BLOCK_K,
                DOT,
            )
        tile = sid * NT + t
        pbase = part_ptr + tile * BLOCK_H * HD_P + h[:, None] * HD_P
        tl.store(pbase + j[None, :], acc_a)
        tl.store(pbase + HALF + j[None, :], acc_b)
        tl.store(pbase + 2 * HALF + r[None, :], acc_c, mask=rm[None, :])
        tl.store(ml_ptr + tile * 2 * BLOCK_H + h, m_i)
        tl.store(ml_ptr + tile * 2 * BLOCK_H + BLOCK_H + h, l_i)

    @triton.jit
    def _sparse_decode_combine_kernel(
        part_ptr, ml_ptr, out_ptr, NT, H: tl.constexpr, HD: tl.constexpr, HD_P: tl.constexpr, BLOCK_H: tl.constexpr
    ):
        # the partial softmaxes of a sequence's tiles, merged as the online softmax would
        sid = tl.program_id(0)
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, HD_P)
        m = tl.full([BLOCK_H], -1e30, tl.float32)
        den = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, HD_P], tl.float32)
        for t in range(0, NT):
            tile = sid * NT + t
            m_t = tl.load(ml_ptr + tile * 2 * BLOCK_H + h)
            l_t = tl.load(ml_ptr + tile * 2 * BLOCK_H + BLOCK_H + h)
            a_t = tl.load(part_ptr + tile * BLOCK_H * HD_P + h[:, None] * HD_P + d[None, :])
            m_new = tl.maximum(m, m_t)
            alpha = tl.exp(m - m_new)
            beta = tl.exp(m_t - m_new)
            den = den * alpha + l_t * beta
            acc = acc * alpha[:, None] + a_t * beta[:, None]
            m = m_new
        acc = acc / den[:, None]
        mask = (h < H)[:, None] & (d < HD)[None, :]
        tl.store(out_ptr + sid * H * HD + h[:, None] * HD + d[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


def _dot_ok(*dims: int) -> bool:
    """tl.dot needs every dimension a power of two of at least 16."""
    return all(d >= 16 and d & (d - 1) == 0 for d in dims)


def _indexer_scores(
    q: torch.Tensor,
    w: torch.Tensor,
    idx_k: torch.Tensor,
    idx_scale: torch.Tensor | None,
    cand: torch.Tensor,
    n_eligible: torch.Tensor,
) -> torch.Tensor:
    """Index scores [G, Q, NB] float32 of queries q [G, Q, H, D] over candidates cand [G, NB]."""
    G, Q, H, D = q.shape
    NB = cand.shape[1]
    scores = torch.empty(G, Q, NB, dtype=torch.float32, device=q.device)
    BLOCK_N = 64
    grid = (G * Q, triton.cdiv(NB, BLOCK_N))
    if q.dtype == torch.bfloat16 and _dot_ok(D):
        _indexer_scores_dot_kernel[grid](
            q.contiguous(),
            w.contiguous(),
            idx_k.contiguous(),
            idx_scale if idx_scale is not None else idx_k,
            cand.contiguous(),
            n_eligible.contiguous(),
            scores,
            Q,
            NB,
            H=H,
            D=D,
            BLOCK_H=max(16, pow2(H)),
            BLOCK_N=BLOCK_N,
            HAS_SCALE=idx_scale is not None,
        )
        return scores
    _indexer_scores_kernel[grid](
        q.float().contiguous(),
        w.float().contiguous(),
        idx_k.contiguous(),
        idx_scale if idx_scale is not None else idx_k,
        cand.contiguous(),
        n_eligible.contiguous(),
        scores,
        Q,
        NB,
        H=H,
        D=D,
        BLOCK_H=pow2(H),
        BLOCK_D=pow2(D),
        BLOCK_N=BLOCK_N,
        HAS_SCALE=idx_scale is not None,
    )
    return scores


# Tiles of 512 columns and 8 warps: the fastest of 12 (tile, warps) for rows of 1,024-4,096
# columns at 256 rows on an H200, 11.5 us against 14.4 us for tiles of 256 and 4 warps at 1,024
# columns; prefill-sized steps (2,560 rows of 512) about even (bench-plan.md, "the stalls in
# README's GPU run")
_TOPK_TILE = 512  # columns the top-k kernel sorts at a time
_TOPK_LAUNCH = dict(num_warps=8)


def _topk_blocks(scores: torch.Tensor, n_eligible: torch.Tensor, topk: int) -> torch.Tensor:
    """reference.topk_blocks of scores [..., NB] float32: the same blocks, in descending score
    order; on exact ties (other than zeros, which it breaks like the reference) the later
    block first, where the reference's order is unspecified."""
    NB = scores.shape[-1]
    rows = scores.numel() // NB
    out = torch.empty(*scores.shape[:-1], topk, dtype=torch.long, device=scores.device)
    _topk_blocks_kernel[(rows,)](
        scores.contiguous(),
        n_eligible.contiguous(),
        out,
        NB,
        TOPK=topk,
        TOPK_P=pow2(topk),
        BLOCK=max(_TOPK_TILE, pow2(topk)),
        **_TOPK_LAUNCH,
    )
    return out


def _indexer_topk(
    q: torch.Tensor,
    w: torch.Tensor,
    idx_k: torch.Tensor,
    idx_scale: torch.Tensor | None,
    cand: torch.Tensor,
    n_eligible: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    return _topk_blocks(_indexer_scores(q, w, idx_k, idx_scale, cand, n_eligible), n_eligible, topk)


def indexer_topk(
    q: torch.Tensor,
    w: torch.Tensor,
    idx_k: torch.Tensor,
    idx_scale: torch.Tensor | None,
    cand: torch.Tensor,
    n_eligible: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """reference.indexer_topk with the scores and the top-k computed by Triton kernels."""
    assert AVAILABLE and q.is_cuda
    G, Q, H, D = q.shape
    NB = cand.shape[1]
    if NB == 0 or G * Q == 0:
        return reference.topk_blocks(q.new_zeros(G, Q, NB), n_eligible, topk)
    # NOTE: under torch.compile the launches go through an opaque custom op, so the tracer
    # never looks inside the kernels and the compiled graph needs no break around them
    if _compiling():
        return torch.ops.dsv4.indexer_topk(q, w, idx_k, idx_scale, cand, n_eligible, topk)
    return _indexer_topk(q, w, idx_k, idx_scale, cand, n_eligible, topk)


# Key tiles of 64 and no software pipelining: the fastest of 48 (tile, warps, stages) at the 1B
# config's batch 256 (16 heads of 128, 128 window and 64 compressed keys a row) on an H200,
# 10.5 us against 12.6 us for tiles of 32 with Triton's default 3 stages
# (scripts/sweep_decode_attention.py; bench-plan.md, "Routing in two kernels").
_DECODE_DOT_LAUNCH = dict(BLOCK_K=64, num_warps=4, num_stages=1)


# Each (sequence, key tile) its own program, merged by a second kernel, while the step has at
# most this many sequences: with fewer programs than the GPU has SMs, one per sequence walks its
# tiles one after the other, each tile two trips to memory (slots, then keys). On an H200 at
# the 1B config's heads the split took 0.78-0.87x the time at 80 rows, 1.27-1.33x at 256 and
# 1.13-1.15x at 1,024 (scripts/sweep_decode_attention.py --split; bench-plan.md)
_DECODE_SPLIT_ROWS = 128


def _decode_attention(
    q: torch.Tensor,
    kv_flat: torch.Tensor,
    win_slots: torch.Tensor,
    win_pos: torch.Tensor,
    ckv_flat: torch.Tensor,
    c_ids: torch.Tensor,
    c_pos: torch.Tensor,
    sink: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    S, H, HD = q.shape
    half = cos.shape[1]
    rest = HD - 2 * half
    W, KC = win_slots.shape[1], c_ids.shape[1]
    out = torch.empty_like(q)
    dot = q.dtype == torch.bfloat16 and _dot_ok(half, rest)
    args = (
        q.contiguous(),
        kv_flat,
        win_slots.contiguous(),
        win_pos.contiguous(),
        ckv_flat,
        c_ids.contiguous(),
        c_pos.contiguous(),
        sink.float().contiguous(),
        cos.float().contiguous(),
        sin.float().contiguous(),
    )
    block_k = _DECODE_DOT_LAUNCH["BLOCK_K"] if dot else 32
    block_h = max(16, pow2(H)) if dot else pow2(H)  # tl.dot takes 16 rows at least
    rest_p = rest if dot else pow2(max(rest, 1))
    tw = triton.cdiv(W, block_k)
    nt = tw + triton.cdiv(KC, block_k)
    if S <= _DECODE_SPLIT_ROWS and tw >= 1 and nt >= 2:
        hd_p = pow2(HD)
        part = torch.empty(S * nt * block_h * hd_p, dtype=torch.float32, device=q.device)
        ml = torch.empty(S * nt * 2 * block_h, dtype=torch.float32, device=q.device)
        launch = {k: v for k, v in _DECODE_DOT_LAUNCH.items() if k != "BLOCK_K"} if dot else {}
        _sparse_decode_split_kernel[(S, nt)](
            *args,
            part,
            ml,
            W,
            KC,
            tw,
            nt,
            cos.shape[0],
            scale,
            H=H,
            HD=HD,
            HD_P=hd_p,
            HALF=half,
            REST=rest,
            REST_P=rest_p,
            BLOCK_H=block_h,
            BLOCK_K=block_k,
            DOT=dot,
            **launch,
        )
        _sparse_decode_combine_kernel[(S,)](part, ml, out, nt, H=H, HD=HD, HD_P=hd_p, BLOCK_H=block_h)
        return out
    if dot:
        _sparse_decode_dot_kernel[(S,)](
            *args,
            out,
            W,
            KC,
            cos.shape[0],
            scale,
            H=H,
            HD=HD,
            HALF=half,
            REST=rest,
            BLOCK_H=block_h,
            **_DECODE_DOT_LAUNCH,
        )
        return out
    _sparse_decode_kernel[(S,)](
        *args,
        out,
        W,
        KC,
        cos.shape[0],
        scale,
        H=H,
        HD=HD,
        HALF=half,
        REST=rest,
        REST_P=rest_p,
        BLOCK_H=block_h,
        BLOCK_K=block_k,
    )
    return out


def sparse_decode_attention(
    q: torch.Tensor,
    kv_flat: torch.Tensor,
    win_slots: torch.Tensor,
    win_pos: torch.Tensor,
    ckv_flat: torch.Tensor,
    c_ids: torch.Tensor,
    c_pos: torch.Tensor,
    sink: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """reference.sparse_decode_attention as one Triton program per sequence."""
    assert AVAILABLE and q.is_cuda
    S, H, HD = q.shape
    half = cos.shape[1]
    if half & (half - 1) or S == 0:  # tl.arange needs a power of two
        return reference.sparse_decode_attention(
            q, kv_flat, win_slots, win_pos, ckv_flat, c_ids, c_pos, sink, cos, sin, scale
        )
    if _compiling():
        return torch.ops.dsv4.sparse_decode_attention(
            q, kv_flat, win_slots, win_pos, ckv_flat, c_ids, c_pos, sink, cos, sin, scale
        )
    return _decode_attention(q, kv_flat, win_slots, win_pos, ckv_flat, c_ids, c_pos, sink, cos, sin, scale)


def _compiling() -> bool:
    return bool(torch.compiler.is_compiling())


if AVAILABLE:
    # Opaque to torch.compile: the kernels read the pools (graph inputs that the step mutates
    # before these reads); functionalization orders the reads after the writes.
    _indexer_topk_op = torch.library.custom_op(
        "dsv4::indexer_topk",
        _indexer_topk,
        mutates_args=(),
        schema="(Tensor q, Tensor w, Tensor idx_k, Tensor? idx_scale, Tensor cand, "
        "Tensor n_eligible, int topk) -> Tensor",
    )

    @_indexer_topk_op.register_fake
    def _(q, w, idx_k, idx_scale, cand, n_eligible, topk):
        G, Q = q.shape[:2]
        return q.new_empty(G, Q, topk, dtype=torch.long)

    _decode_attention_op = torch.library.custom_op(
        "dsv4::sparse_decode_attention",
        _decode_attention,
        mutates_args=(),
        schema="(Tensor q, Tensor kv_flat, Tensor win_slots, Tensor win_pos, Tensor ckv_flat, "
        "Tensor c_ids, Tensor c_pos, Tensor sink, Tensor cos, Tensor sin, float scale) "
        "-> Tensor",
    )

    @_decode_attention_op.register_fake
    def _(q, kv_flat, win_slots, win_pos, ckv_flat, c_ids, c_pos, sink, cos, sin, scale):
        return torch.empty_like(q)
