"""One matrix product for the projections of a layer that read the same input, on static steps.

At a decode step's few hundred rows every projection is a GEMM bound by reading its weights, and
cuBLAS gives the narrow ones (wkv's 128 outputs, the indexer's 512 + 8, the router's 8) a handful
of thread blocks: some 4 us each whatever their size, over 300 us a step at the 1B config.
Concatenated along the output axis with the wide projection of the same input (wq; the shared
expert's w_in) they ride its tiles: Attention.fused_in = [wq; wkv; indexer wq; indexer ww],
MoE.fused_in = [shared w_in; router]. The static step (plan.static: CUDA graphs, compiled or not)
uses them once set; the serving path and the CPU keep the separate products.

`fuse_projections` copies the weights: call it after the weights are final (loaded, on their
device and dtype), and again if they change.
"""

from __future__ import annotations

import torch

from .model import DSV4Mini


@torch.no_grad()
def fuse_projections(model: DSV4Mini) -> None:
    """Set every layer's fused_in from its current weights (idempotent)."""
    for block in model.blocks:
        attn, moe = block.attn, block.moe
        parts = [attn.wq.weight, attn.wkv.weight]
        if attn.indexer is not None:
            parts += [attn.indexer.wq.weight, attn.indexer.ww.weight]
        attn.fused_in = torch.cat(parts).detach()
        moe.fused_in = torch.cat((moe.shared.w_in.weight, moe.router)).detach()
