"""Partial rotary position embedding: only the first `rope_dim` dims of a head rotate.

Half-split (GPT-NeoX) layout: dim i pairs with dim i + rope_dim/2 inside the rotated part.
Keys are stored without RoPE (STRUCTURE.md "Memory layout"), so every reader rotates keys at
read time with the same tables; queries are rotated once when projected.
"""

from __future__ import annotations

import torch
from torch import nn


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first 2 * cos.shape[-1] dims of x; the rest pass through unchanged.

    x: [..., head_dim]; cos, sin: [..., rope_dim / 2], broadcastable to x[..., :rope_dim / 2].
    Returns a new tensor (x is not modified).
    """
    half = cos.shape[-1]
    x1 = x[..., :half]
    x2 = x[..., half : 2 * half]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    if 2 * half == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., 2 * half :]), dim=-1)


class Rope(nn.Module):
    """cos/sin tables for positions 0 .. max_positions-1; `forward(x, positions)` rotates x."""

    def __init__(self, rope_dim: int, theta: float, max_positions: int) -> None:
        super().__init__()
        assert rope_dim % 2 == 0
        inv_freq = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        # NOTE: non-persistent: tables are derived from the config, never loaded from weights.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        self.max_positions = max_positions

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]  # torch's own is untyped
        # NOTE: module.to(bfloat16) would round the tables; keep them float32, move devices only
        cos, sin = self.cos, self.sin
        super()._apply(fn, recurse)
        self.cos = cos.to(self.cos.device)
        self.sin = sin.to(self.sin.device)
        return self

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows for `positions` (any shape). Out-of-range positions (padding rows
        that are masked or zero) are clamped into the table."""
        idx = positions.clamp(0, self.max_positions - 1)
        return self.cos[idx], self.sin[idx]

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [..., head_dim]; `positions` must be shaped so that its tables
        [*positions.shape, rope_dim / 2] broadcast against x[..., :rope_dim / 2] (e.g. [N, 1]
        for x [N, heads, head_dim])."""
        cos, sin = self.tables(positions)
        return apply_rope(x, cos.to(x.dtype), sin.to(x.dtype))
