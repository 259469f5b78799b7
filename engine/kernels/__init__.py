"""Kernel selection, in one place: Triton on CUDA when triton imports, the PyTorch reference
otherwise (and always when DSV4_KERNELS=reference). Both expose the same two ops:
`indexer_topk` and `sparse_decode_attention` (semantics: kernels/reference.py)."""

from __future__ import annotations

import os
from types import ModuleType

import torch

from . import reference

_triton: ModuleType | None = None
_triton_tried = False


def load_triton() -> ModuleType | None:
    """kernels.triton_ops when CUDA and triton are both usable, else None (imported once)."""
    global _triton, _triton_tried
    if not _triton_tried:
        _triton_tried = True
        if torch.cuda.is_available():
            try:
                from . import triton_ops as mod
            except ImportError:
                mod = None
            _triton = mod if mod is not None and mod.AVAILABLE else None
    return _triton


def ops_for(device: torch.device) -> ModuleType:
    """The module whose `indexer_topk` and `sparse_decode_attention` run on `device`."""
    if device.type == "cuda" and os.environ.get("DSV4_KERNELS", "") != "reference":
        mod = load_triton()
        if mod is not None:
            return mod
    return reference
