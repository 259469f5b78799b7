"""Compression of a complete block of `rate` consecutive raw KV vectors into one entry.

entry = W_out( sum_i softmax_i(W_g kv_i + bias_i) * kv_i ), the softmax taken over the block's
slots i = 0..rate-1 separately for every dim (a gated pooling), with a learned per-slot bias.
It reads only the block's own stored KV, so an entry is computed once, when the token that
completes its block is written, and never changes afterwards (incremental == full recompute).
"""

from __future__ import annotations

import torch
from torch import nn


class Compressor(nn.Module):
    def __init__(self, head_dim: int, rate: int) -> None:
        super().__init__()
        self.rate = rate
        self.gate = nn.Linear(head_dim, head_dim, bias=False)
        self.slot_bias = nn.Parameter(torch.zeros(rate, head_dim))
        self.out = nn.Linear(head_dim, head_dim, bias=False)

    def forward(self, blocks: torch.Tensor) -> torch.Tensor:
        """blocks: [..., rate, head_dim] raw (un-roped) KV -> entries [..., head_dim]."""
        assert blocks.shape[-2] == self.rate, (blocks.shape, self.rate)
        weights = torch.softmax(self.gate(blocks) + self.slot_bias, dim=-2)
        return self.out((weights * blocks).sum(dim=-2))
