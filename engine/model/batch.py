"""What one forward step computes: for each sequence, its new tokens and its page table.

Built by the model runner from scheduled requests. Plain data, no torch: index tensors are
derived from it by `plan.build_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SeqSlice:
    """New tokens of one sequence at positions start_pos .. start_pos + len(token_ids) - 1.

    `page_table[i]` is the page holding positions i * page_size .. i * page_size + page_size - 1;
    it covers positions 0 .. start_pos + len(token_ids) - 1. Everything before start_pos (raw KV,
    compressed entries and index keys of complete blocks) is already in the pools.
    """

    token_ids: list[int]
    start_pos: int
    page_table: list[int]

    @property
    def end_pos(self) -> int:
        """One past the last new position."""
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class ForwardBatch:
    """The sequences of one step, in the order logits come back."""

    seqs: list[SeqSlice] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    def offsets(self) -> list[int]:
        """Row of each sequence's first new token in the flat token axis (plus the total)."""
        out = [0]
        for s in self.seqs:
            out.append(out[-1] + len(s.token_ids))
        return out

    def validate(self, page_size: int, num_pages: int, max_context: int) -> None:
        """Raise AssertionError when a slice cannot be computed as described."""
        assert self.seqs, "empty batch"
        for s in self.seqs:
            assert len(s.token_ids) >= 1, "a sequence slice needs at least one new token"
            assert s.start_pos >= 0
            assert s.end_pos <= max_context, f"position {s.end_pos - 1} >= max_context"
            needed = (s.end_pos + page_size - 1) // page_size
            assert len(s.page_table) >= needed, (
                f"page table covers {len(s.page_table) * page_size} positions, needs {s.end_pos}"
            )
            assert all(0 <= p < num_pages for p in s.page_table[:needed]), "page id out of range"
