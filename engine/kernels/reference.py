"""Reference (PyTorch) versions of DSV4-mini's hot ops. They define the semantics the Triton
kernels must match, and they are what runs on CPU.

Conventions shared with triton_ops.py:
- flat pools: raw KV `kv_flat` [slots, head_dim] (un-roped), compressed `ckv_flat`
  [entries, head_dim] (un-roped), index keys `idx_k` [entries, index_dim] (fp8/bf16/float)
  with `idx_scale` [entries] (fp8) or None;
- padding ids are -1 and are never attended nor selected;
- RoPE tables `cos`, `sin` are [max_positions, rope_dim / 2] (half-split layout, model/rope.py).
"""

from __future__ import annotations

import torch

_SCORE_CHUNK = 1 << 23  # elements of a [Q, heads, blocks] intermediate before chunking queries


def apply_rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """model/rope.py's apply_rope in place (same values, bit for bit, with fewer temporaries):
    for inference on a tensor of the caller's own. Returns x."""
    half = cos.shape[-1]
    x1 = x[..., :half]
    x2 = x[..., half : 2 * half]
    x2_sin, x1_sin = x2 * sin, x1 * sin
    x1.mul_(cos).sub_(x2_sin)
    x2.mul_(cos).add_(x1_sin)
    return x


def take_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """table[ids] for row ids of any shape -> [*ids.shape, *table.shape[1:]]. index_select on
    the flattened ids: the same rows as indexing, several times faster on CPU."""
    return table.index_select(0, ids.reshape(-1)).view(*ids.shape, *table.shape[1:])


def fp8_keys_over_256(stored: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn values as float32, divided by 256: exact, and several times faster on CPU
    than `.float()`. The bits s.eeee.mmm moved to s.0eeee.mmm0000000 are the float16 of
    value / 2^8 (the exponent biases are 7 and 15), subnormals included; e4m3fn's NaN is never
    stored (quantize_index_k keeps |value| <= 448)."""
    bits = stored.view(torch.int8).to(torch.int16)  # sign-extended: bits 15..7 copy the sign
    bits <<= 7
    bits &= -16385  # clear bit 14, the extended sign's copy; bit 15 keeps the sign
    return bits.view(torch.float16).float()


def indexer_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Lightning indexer scores sum_h w[..., h] * relu(q[..., h, :] . keys[b]).

    q: [G, Q, Hi, di]; w: [G, Q, Hi]; keys: [G, NB, di] -> [G, Q, NB]. Differentiable.
    """
    G, Q, Hi, _ = q.shape
    NB = keys.shape[1]
    step = max(1, _SCORE_CHUNK // max(1, G * Hi * NB))
    out = []
    for i in range(0, Q, step):
        dots = torch.einsum("gqhd,gbd->gqhb", q[:, i : i + step], keys).relu()
        out.append(torch.einsum("gqhb,gqh->gqb", dots, w[:, i : i + step]))
    return torch.cat(out, dim=1) if len(out) > 1 else out[0]


def topk_blocks(scores: torch.Tensor, n_eligible: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-`topk` columns of scores [..., NB] among columns < n_eligible [...]; -1 pads rows
    with fewer eligible blocks. Returns [..., topk] int64 in descending score order.

    NOTE: relu makes exact ties common: a block whose every head dot is <= 0 scores exactly 0.
    Zero scores are replaced by a tiny positive (block + 1) * 1e-30 so that among them the most
    recent blocks win, deterministically, whichever path (dense, extend, decode, Triton) and
    whatever row length computed the scores. Other exact ties have probability ~0."""
    NB = scores.shape[-1]
    col = torch.arange(NB, device=scores.device)
    eligible = col < n_eligible.unsqueeze(-1)
    k = min(topk, NB)
    if k == 0:
        return torch.full((*scores.shape[:-1], topk), -1, dtype=torch.long, device=scores.device)
    scores = scores.float()
    scores = torch.where(scores == 0, (col + 1).float() * 1e-30, scores)
    masked = scores.masked_fill(~eligible, float("-inf"))
    idx = masked.topk(k, dim=-1).indices
    idx = torch.where(idx < n_eligible.unsqueeze(-1), idx, -1)
    if k < topk:
        pad = torch.full((*idx.shape[:-1], topk - k), -1, dtype=idx.dtype, device=idx.device)
        idx = torch.cat((idx, pad), dim=-1)
    return idx


def indexer_topk(
    q: torch.Tensor,
    w: torch.Tensor,
    idx_k: torch.Tensor,
    idx_scale: torch.Tensor | None,
    cand: torch.Tensor,
    n_eligible: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """Select compressed blocks for each query with the lightning indexer.

    q: [G, Q, Hi, di] index queries; w: [G, Q, Hi] head weights; cand: [G, NB] entry ids of
    blocks 0..NB-1 of each group's sequence (-1 pad); n_eligible: [G, Q] complete blocks visible
    to each query (a prefix of cand). Returns [G, Q, topk] block numbers (columns of cand), -1
    where fewer than topk blocks are eligible. Does not mutate anything.
    """
    ids = cand.clamp(min=0)
    keys = take_rows(idx_k, ids)
    if keys.dtype == torch.float8_e4m3fn:
        # NOTE: scores of keys / 2^8 are the scores / 2^8 exactly (a power of two commutes
        # with every rounding here); the factor goes back in with the scale fp8 keys come with.
        keys, unit = fp8_keys_over_256(keys), 256.0
    else:
        keys, unit = keys.float(), 1.0
    scores = indexer_scores(q.float(), w.float(), keys)
    if idx_scale is not None:
        # NOTE: relu(s * x) = s * relu(x) for the positive per-entry scale s, so dequantising
        # the [G, Q, NB] scores is exact and cheaper than dequantising [G, NB, di] keys.
        scores = scores * (take_rows(idx_scale, ids) * unit).unsqueeze(1)
    return topk_blocks(scores, n_eligible, topk)


def softmax_with_sink(logits: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis of logits [..., H, K] with one extra logit sink [H] per head
    in the denominator (attention sinks); returns probabilities of the K real keys (they sum
    to < 1: the sink's share goes nowhere). Rows of all -inf give all zeros."""
    sink_col = sink.to(logits.dtype).view(*([1] * (logits.dim() - 2)), -1, 1)
    full = torch.cat((logits, sink_col.expand(*logits.shape[:-1], 1)), dim=-1)
    return torch.softmax(full, dim=-1)[..., :-1]


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
    """One query per sequence over its window plus its selected compressed entries.

    q: [S, H, hd] (RoPE applied); win_slots/win_pos: [S, W] raw KV slots and their positions;
    c_ids/c_pos: [S, Kc] compressed entry ids and the positions their keys rotate by; sink [H].
    Keys = RoPE(stored vector, position), values = the stored vector (K = V, one KV head).
    Returns [S, H, hd]. Does not mutate anything.
    """
    W = win_slots.shape[1]
    # NOTE: key-major [W + Kc, S, hd]: each gather fills one contiguous slab, and bmm reads
    # every sequence's keys and values in place through strides.
    values = q.new_empty(W + c_ids.shape[1], q.shape[0], q.shape[2])
    _gather_into(values[:W], kv_flat, win_slots.t())
    _gather_into(values[W:], ckv_flat, c_ids.t())
    pos = torch.cat((win_pos, c_pos), dim=1).t().clamp(min=0)
    keys = apply_rope_(values.clone(), take_rows(cos, pos).to(q.dtype), take_rows(sin, pos).to(q.dtype))
    valid = torch.cat((win_slots >= 0, c_ids >= 0), dim=1)  # [S, K]
    logits = torch.bmm(q, keys.permute(1, 2, 0)) * scale
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    return torch.bmm(softmax_with_sink(logits, sink), values.transpose(0, 1))


def _gather_into(out: torch.Tensor, table: torch.Tensor, ids: torch.Tensor) -> None:
    """out[...] = table[ids] (rows; -1 pads read row 0) for a contiguous out [*ids.shape, d]."""
    flat = ids.clamp(min=0).reshape(-1)
    if table.dtype == out.dtype:
        torch.index_select(table, 0, flat, out=out.view(flat.shape[0], out.shape[-1]))
    else:
        out.copy_(take_rows(table, flat).view(out.shape))
