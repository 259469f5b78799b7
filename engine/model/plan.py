"""Index tensors of one forward step, built once from a ForwardBatch and shared by all layers.

Sequences with one new token form the decode group: their gathers (window slots, candidate
compressed entries) are padded [num_decode, width] tensors so each layer runs one vectorised
gather per pool. Sequences with several new tokens (prefill chunks) are extends, attended one
sequence at a time with a blocked band over their key span.

Flat ids follow kv_pools: slot = page * P + pos % P; entry = page * (P // r) + (pos % P) // r.
Padding ids are -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig
from .batch import ForwardBatch


@dataclass
class CompressWrites:
    """Blocks of one rate completed by this step's tokens: where their raw KV is, where the
    compressed entry (and for CSA the index key) goes."""

    kv_slots: torch.Tensor  # [n_blocks, rate]
    entries: torch.Tensor  # [n_blocks]


@dataclass
class DecodeGroup:
    rows: torch.Tensor  # [S] rows of these tokens in the flat token axis
    positions: torch.Tensor  # [S]
    win_slots: torch.Tensor  # [S, window] raw KV slots of positions t-window+1 .. t, -1 if < 0
    win_pos: torch.Tensor  # [S, window]
    cand: dict[int, torch.Tensor]  # rate -> [S, max blocks] entries of complete blocks, -1 pad
    n_blocks: dict[int, torch.Tensor]  # rate -> [S] complete blocks = (t + 1) // rate
    # rows is every row of the step in order (no prefill chunk among them): attention takes
    # the step's tensors whole, with no gather of the rows and no scatter of their outputs
    every_row: bool = False


@dataclass
class ExtendSeq:
    row0: int  # row of the first new token
    start: int  # position of the first new token
    length: int
    span_slots: torch.Tensor  # raw KV slots of positions max(0, start-window+1) .. end-1
    cand: dict[int, torch.Tensor]  # rate -> [end // rate] entries of blocks 0 .. end//rate - 1


@dataclass
class BatchPlan:
    token_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    new_slots: torch.Tensor  # [N] raw KV slots the new tokens write
    last_rows: torch.Tensor  # [num_seqs] row of each sequence's last new token
    compress: dict[int, CompressWrites]  # rate -> blocks completed this step
    decode: DecodeGroup | None
    extends: list[ExtendSeq]
    # True for a plan of build_static_decode_plan: every shape is fixed by the padded batch
    # and the page-table width, so the step can be captured in a CUDA graph.
    static: bool = False


def _long(x: list[int] | list[list[int]], device: torch.device) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.long).to(device)


def build_plan(batch: ForwardBatch, cfg: ModelConfig, page_size: int, device: torch.device) -> BatchPlan:
    """All index tensors of `batch` (see the module docstring)."""
    P, W = page_size, cfg.window
    rates = sorted({cfg.csa_rate, cfg.hca_rate})
    tokens: list[int] = []
    positions: list[int] = []
    new_slots: list[int] = []
    last_rows: list[int] = []
    comp_slots: dict[int, list[list[int]]] = {r: [] for r in rates}
    comp_entries: dict[int, list[int]] = {r: [] for r in rates}
    dec_idx: list[int] = []
    extends: list[ExtendSeq] = []
    row = 0
    for i, s in enumerate(batch.seqs):
        pt, n = s.page_table, len(s.token_ids)
        tokens += s.token_ids
        positions += range(s.start_pos, s.end_pos)
        new_slots += [pt[p // P] * P + p % P for p in range(s.start_pos, s.end_pos)]
        for r in rates:
            # blocks b whose last position (b+1)*r-1 is new in this step
            for b in range((s.start_pos + r) // r - 1, s.end_pos // r):
                page, off = pt[b * r // P], (b * r) % P
                comp_slots[r].append(list(range(page * P + off, page * P + off + r)))
                comp_entries[r].append(page * (P // r) + off // r)
        if n == 1:
            dec_idx.append(i)
        else:
            pt_t = _long(pt, device)
            span = torch.arange(max(0, s.start_pos - W + 1), s.end_pos, device=device)
            cand = {}
            for r in rates:
                b = torch.arange(s.end_pos // r, device=device)
                cand[r] = pt_t[b * r // P] * (P // r) + (b * r % P) // r
            extends.append(ExtendSeq(row, s.start_pos, n, pt_t[span // P] * P + span % P, cand))
        row += n
        last_rows.append(row - 1)
    compress = {
        r: CompressWrites(_long(comp_slots[r], device).view(-1, r), _long(comp_entries[r], device)) for r in rates
    }
    offsets = batch.offsets()
    decode = _decode_group(batch, [offsets[i] for i in dec_idx], dec_idx, rates, P, W, device) if dec_idx else None
    if decode is not None and not extends:
        decode.every_row = True
    return BatchPlan(
        _long(tokens, device),
        _long(positions, device),
        _long(new_slots, device),
        _long(last_rows, device),
        compress,
        decode,
        extends,
    )


def _decode_group(
    batch: ForwardBatch, rows: list[int], idx: list[int], rates: list[int], P: int, W: int, device: torch.device
) -> DecodeGroup:
    seqs = [batch.seqs[i] for i in idx]
    t_list = [s.start_pos for s in seqs]
    n_pages = [t // P + 1 for t in t_list]
    width = max(n_pages)
    # NOTE: pad with the last needed page (a real page), never read unmasked
    pt = _long([s.page_table[:n] + [s.page_table[n - 1]] * (width - n) for s, n in zip(seqs, n_pages)], device)
    t = _long(t_list, device)
    win_pos = t[:, None] - (W - 1) + torch.arange(W, device=device)
    valid = win_pos >= 0
    p = win_pos.clamp(min=0)
    win_slots = torch.where(valid, pt.gather(1, p // P) * P + p % P, -1)
    cand: dict[int, torch.Tensor] = {}
    n_blocks: dict[int, torch.Tensor] = {}
    for r in rates:
        nb = (t + 1) // r
        b = torch.arange(int(max(t_list) + 1) // r, device=device).expand(len(seqs), -1)
        page = pt.gather(1, (b * r // P).clamp(max=width - 1))
        cand[r] = torch.where(b < nb[:, None], page * (P // r) + (b * r % P) // r, -1)
        n_blocks[r] = nb
    return DecodeGroup(_long(rows, device), t, win_slots, win_pos, cand, n_blocks)


def build_static_decode_plan(
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    page_table: torch.Tensor,
    cfg: ModelConfig,
    page_size: int,
    scratch_page: int,
) -> BatchPlan:
    """The plan of a step of B rows computed on the device from three tensors, with no host
    sync and shapes fixed by their sizes (what a captured CUDA graph needs). Each row is one
    new token planned as a decode: a prefill chunk is a row per token: its window and blocks
    are written, in each layer, before that layer reads them.

    token_ids, positions: [B] (one new token per row); page_table: [B, NP] (NP * page_size
    must exceed every position). Rows padding the batch carry position 0 and a page table
    of `scratch_page` only; every write that build_plan would not make (padding rows, blocks
    not completed this step) goes to `scratch_page`, a page no sequence owns, so it is
    harmless. Complete blocks, window slots and candidates are build_plan's.
    """
    P, W = page_size, cfg.window
    dev = positions.device
    B, NP = page_table.shape
    pos = positions.long()
    pt = page_table.long()
    rows = torch.arange(B, device=dev)
    new_slots = pt.gather(1, (pos // P).unsqueeze(1)).squeeze(1) * P + pos % P
    win_pos = pos[:, None] - (W - 1) + torch.arange(W, device=dev)
    valid = win_pos >= 0
    p = win_pos.clamp(min=0)
    win_slots = torch.where(valid, pt.gather(1, p // P) * P + p % P, -1)
    compress: dict[int, CompressWrites] = {}
    cand: dict[int, torch.Tensor] = {}
    n_blocks: dict[int, torch.Tensor] = {}
    for r in sorted({cfg.csa_rate, cfg.hca_rate}):
        nb = (pos + 1) // r
        b = torch.arange(NP * P // r, device=dev).expand(B, -1)
        page = pt.gather(1, b * r // P)
        cand[r] = torch.where(b < nb[:, None], page * (P // r) + (b * r % P) // r, -1)
        n_blocks[r] = nb
        # the block holding each row's new token, written only when that token completes it
        done = (pos + 1) % r == 0
        start = pos - pos % r
        page0 = pt.gather(1, (start // P).unsqueeze(1)).squeeze(1)
        page0 = torch.where(done, page0, scratch_page)
        off = torch.where(done, start % P, 0)
        compress[r] = CompressWrites(
            (page0 * P + off).unsqueeze(1) + torch.arange(r, device=dev), page0 * (P // r) + off // r
        )
    decode = DecodeGroup(rows, pos, win_slots, win_pos, cand, n_blocks, every_row=True)
    return BatchPlan(token_ids.long(), pos, new_slots, rows, compress, decode, [], static=True)
