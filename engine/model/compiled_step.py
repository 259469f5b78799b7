"""torch.compile of the static decode step (DSV4Mini.forward_static_decode), for CUDA graphs.

Eager, a step of the 1B config is over a thousand kernels, most of them elementwise chains a few
microseconds long (float32 RMSNorms, RoPE, the index-K quantisation, the compressor's softmax,
the routing's top-k and gates, the MoE's counting sort); inductor fuses each chain into one
generated Triton kernel. The step's shapes are fixed by its inputs (one compile per bucket:
dynamic=False), the hand-written Triton kernels go through opaque custom ops
(kernels/triton_ops.py), the pool writes run eagerly between compiled pieces (pool_writes.py
says why), and the compiled step is captured in a CUDA graph as the eager one is:
it has no host sync and allocates from the graph's pool like any other capture.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from .kv_pools import KVPools
from .model import DSV4Mini


def compile_static_decode(model: DSV4Mini, fullgraph: bool = False) -> Callable[..., torch.Tensor]:
    """A compiled `model.forward_static_decode` (same arguments, same result up to the order of
    floating-point sums), with the model's projections fused (fused_projections.py). Compiles
    lazily, once per input shape, on the first call. Its inputs and the pools must be ordinary
    tensors (not made under inference mode)."""
    import torch._dynamo

    from . import pool_writes
    from .fused_projections import fuse_projections

    pool_writes.keep_out_of_compiled_graphs()
    fuse_projections(model)

    # NOTE: the pool writes (pool_writes.py) break the step into pieces, and a piece inside a
    # layer is compiled once per layer (its guards hold the layer index) and per bucket: the
    # engine captures up to a few dozen buckets of the model's layers
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 1 << 16))
    compiled = torch.compile(model.static_decode_step, dynamic=False, fullgraph=fullgraph)

    def step(
        token_ids: torch.Tensor, positions: torch.Tensor, page_table: torch.Tensor, pools: KVPools
    ) -> torch.Tensor:
        # NOTE: traced outside inference mode (even when the caller is in it): functionalising
        # the in-place pool writes sets version counters, which inference tensors lack
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            # inductor's advice while it compiles (TF32 for float32 matmuls, how it split a
            # reduction) is no fault of the step; where warnings are errors it would fail it
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._inductor")
            return compiled(token_ids, positions, page_table, pools)

    return step
