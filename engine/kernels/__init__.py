"""Kernel selection, in one place: Triton on CUDA when triton imports, the PyTorch reference
otherwise (and always when DSV4_KERNELS=reference). Both expose the same two ops:
`indexer_topk` and `sparse_decode_attention` (semantics: kernels/reference.py)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch

from . import reference

_loaded: dict[str, ModuleType | None] = {}


def load_triton(name: str = "triton_ops") -> ModuleType | None:
    """The Triton kernel module kernels.<name> (triton_ops, grouped_moe, moe_route, scatter_rows) when CUDA and triton
    are both usable, else None (imported once, on first use: a CPU process never loads triton)."""
    if name not in _loaded:
        mod = None
        if torch.cuda.is_available():
            try:
                mod = importlib.import_module(f".{name}", __name__)
            except ImportError:
                mod = None
        _loaded[name] = mod if mod is not None and mod.AVAILABLE else None
    return _loaded[name]


def ops_for(device: torch.device) -> ModuleType:
    """The module whose `indexer_topk` and `sparse_decode_attention` run on `device`."""
    if device.type == "cuda" and os.environ.get("DSV4_KERNELS", "") != "reference":
        mod = load_triton()
        if mod is not None:
            return mod
    return reference
