"""The pooled path's pool writes (Attention.forward), kept out of torch.compile'd graphs.

A compiled graph that writes into the pools (its inputs) in place is functionalised: inductor
then materialised a new copy of a whole pool per write and copied it back (two ~380 us kernels a
layer at the 1B config, more than the rest of the step). Run eagerly, between the compiled
pieces, each write is the one index_copy_ it is uncompiled; what the compiled pieces read from
the pools afterwards are plain reads of graph inputs. These functions are exactly the KVPools
methods; `keep_out_of_compiled_graphs()` (called by compiled_step.py before anything is traced)
marks them with torch.compiler.disable, which is not done at import: it loads torch._dynamo, some
1.4 s of every engine start on a CPU.
"""

from __future__ import annotations

import torch

from .kv_pools import KVPools, quantize_index_k


def write_kv(pools: KVPools, layer: int, slots: torch.Tensor, values: torch.Tensor) -> None:
    pools.write_kv(layer, slots, values)


def write_ckv(pools: KVPools, layer: int, entries: torch.Tensor, values: torch.Tensor) -> None:
    pools.write_ckv(layer, entries, values)


def _write_index_k_stored(
    pools: KVPools, layer: int, entries: torch.Tensor, stored: torch.Tensor, scale: torch.Tensor | None
) -> None:
    pools.write_index_k_stored(layer, entries, stored, scale)


def write_index_k(pools: KVPools, layer: int, entries: torch.Tensor, keys: torch.Tensor) -> None:
    """KVPools.write_index_k: the quantisation (traced, fused when compiled) then the write."""
    stored, scale = quantize_index_k(keys, pools.index_k_dtype)
    _write_index_k_stored(pools, layer, entries, stored, scale)


def keep_out_of_compiled_graphs() -> None:
    """Make the writes graph breaks of any torch.compile'd caller (once; idempotent)."""
    if not getattr(write_kv, "_kept_out", False):
        for name in ("write_kv", "write_ckv", "_write_index_k_stored"):
            fn = torch.compiler.disable(globals()[name])
            fn._kept_out = True
            globals()[name] = fn
