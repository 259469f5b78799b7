"""CUDA graphs of the model step: a step runs as one graph replay.

Eager, a step of the default config is some 400 kernel launches, each behind Python, and a
prefill chunk adds a few hundred more of its own; replayed, a step is one launch and the GPU
runs the kernels back to back. Every new token is one row of DSV4Mini.forward_static_decode
(plan, layers, logits and greedy tokens computed on the device): a decode entry is one row, a
prefill chunk of n tokens n rows. A row reads only what its position sees (window, complete
blocks, index keys), written by earlier steps or, in each layer, by this step's writes, which
come before the layer's reads; so a chunk's rows compute what the chunk's extend path does.

A graph fixes every shape, so a step is captured per (padded row count, page-table width)
bucket, lazily, the first time a step falls in it:
1. the step's inputs (token, position and page table of each row) are packed into one
   pinned host buffer and copied to the graph's device buffer in one transfer;
2. the graph is replayed; rows past the step's are padding whose writes land in the pools'
   scratch page;
3. one read back of the greedy tokens (the logits, for sampled rows, stay on the device).
Steps of more rows than the largest bucket and pools with a gate (the host tier's loads must
be waited for in the step) run eagerly; DSV4_CUDA_GRAPHS=decode keeps graphs to decode-only
steps, DSV4_CUDA_GRAPHS=0 turns them off. DSV4_COMPILE=1 captures the step compiled by
torch.compile (model/compiled_step.py) instead: fewer, fused kernels, at the price of a compile
of each bucket when it is first captured (off by default for that reason).

Graphs share one memory pool: they are replayed one at a time and only their outputs,
held here, outlive a replay.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from .kernels.triton_support import CompileLog
from .model.fused_projections import fuse_projections
from .model.kv_pools import KVPools
from .model.model import DSV4Mini

T = TypeVar("T")

BATCH_BUCKETS = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    80,
    96,
    112,
    128,
    160,
    192,
    224,
    256,
    320,
    384,
    448,
    512,
    640,
    768,
    896,
    1024,
    1280,
    1536,
    1792,
    2048,
    2560,
    3072,
    4096,
)
MIN_PAGES = 8

log = logging.getLogger("dsv4bench.engine")


def capture_graph(fn: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """fn() run once on a side stream (Triton compiles, library handles), then captured in a
    graph; returns the graph and fn's output tensors, which each replay rewrites. For benchmarks
    and tests that time or check one step; the engine's own buckets capture in `_capture`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def mode() -> str:
    """DSV4_CUDA_GRAPHS: "all" steps (the default), "decode"-only steps, or "0" (none)."""
    m = os.environ.get("DSV4_CUDA_GRAPHS", "all")
    return m if m in ("all", "decode", "0") else "all"


def compile_enabled() -> bool:
    """DSV4_COMPILE=1: capture torch.compile'd steps."""
    return os.environ.get("DSV4_COMPILE", "0") not in ("", "0")


def batch_bucket(n: int) -> int | None:
    """The captured batch size a batch of n rows is padded to (None: too large)."""
    for b in BATCH_BUCKETS:
        if b >= n:
            return b
    return None


def pages_bucket(n: int, max_pages: int) -> int:
    """Page-table width for a step whose longest row needs n pages: a power of two, at most
    the pages of the model's whole context."""
    w = MIN_PAGES
    while w < n:
        w *= 2
    return min(w, max_pages)


def pages_needed(entries, page_size: int) -> np.ndarray:
    """Pages each entry's rows read: those up to its last new position."""
    return np.fromiter(
        ((e.start_pos + len(e.token_ids) - 1) // page_size + 1 for e in entries), dtype=np.int64, count=len(entries)
    )


def pack_rows(entries, need: np.ndarray, buf: np.ndarray, scratch_page: int) -> None:
    """Fill a graph's input buffer [B, 2 + NP] (token, position, page table of each row; one
    row per new token, entry after entry; the rest padding on the scratch page)."""
    R = sum(len(e.token_ids) for e in entries)
    buf[:, 2:] = scratch_page
    buf[R:, :2] = 0
    # NOTE: the page tables are read now, as the eager path copies them: an abort
    # between schedule() and postprocess() replaces req.pages.
    if R == len(entries):  # decode only: one row each
        buf[:R, 0] = [e.token_ids[0] for e in entries]
        buf[:R, 1] = [e.start_pos for e in entries]
        mask = np.arange(buf.shape[1] - 2) < need[:, None]
        buf[:R, 2:][mask] = [p for e, k in zip(entries, need.tolist()) for p in e.req.pages[:k]]
        return
    # a prefill chunk is one row per token: each reads the window, entries and index keys its
    # own position sees, all written earlier or by this layer's writes
    buf[:R, 0] = [t for e in entries for t in e.token_ids]
    row = 0
    for e, k in zip(entries, need.tolist()):
        c = len(e.token_ids)
        buf[row : row + c, 1] = np.arange(e.start_pos, e.start_pos + c)
        buf[row : row + c, 2 : 2 + k] = np.asarray(e.req.pages[:k], dtype=buf.dtype)
        row += c


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    host: torch.Tensor  # pinned int32 [B, 2 + NP]: token, position, page table
    host_np: np.ndarray
    dev: torch.Tensor  # the graph's input buffer (same shape, on the device)
    logits: torch.Tensor  # [B, vocab], written by each replay
    greedy: torch.Tensor  # [B] argmax of logits


class DecodeGraphs:
    """Captured steps of one model over one set of pools."""

    def __init__(self, model: DSV4Mini, pools: KVPools, max_rows: int, decode_only: bool = False) -> None:
        assert pools.scratch_page is not None, "graphs need pools with a scratch page"
        self.model, self.pools = model, pools
        self.page_size = pools.page_size
        self.max_pages = -(-model.cfg.max_context // pools.page_size)
        self.max_rows = min(max_rows, BATCH_BUCKETS[-1])
        self.capture_s = 0.0  # time spent capturing
        self.compiled: dict[tuple[int, int], list[str]] = {}  # Triton kernels each capture compiled
        self.decode_only = decode_only
        self.device = pools.kv[0].device
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self._default_gate = pools.gate
        self.replays = 0
        fuse_projections(model)  # the captured steps' projections (fused_projections.py)
        self._step = model.forward_static_decode
        if compile_enabled():
            from .model.compiled_step import compile_static_decode

            self._step = compile_static_decode(model)

    def supports(self, batch) -> bool:  # batch: scheduler.ScheduledBatch
        """Whether the step can replay a graph: its rows (one per new token) fit a bucket,
        and the pools' reads need no gate."""
        return (
            0 < batch.num_tokens <= self.max_rows
            and not (self.decode_only and batch.num_prefill_tokens)
            and self.pools.gate is self._default_gate
        )

    def captured(self) -> list[tuple[int, int]]:
        return sorted(self._graphs)

    def run(self, entries) -> tuple[torch.Tensor, list[int]]:
        """Replay the bucket's graph for the step's entries (scheduler.BatchEntry); returns
        (logits [len(entries), vocab] of each entry's last token, on the device; the greedy
        token of each)."""
        counts = [len(e.token_ids) for e in entries]
        R = sum(counts)
        need = pages_needed(entries, self.page_size)
        B = batch_bucket(R)
        assert B is not None
        g = self.graph(B, pages_bucket(int(need.max()), self.max_pages))
        pack_rows(entries, need, g.host_np, self.pools.scratch_page)
        g.dev.copy_(g.host, non_blocking=True)
        g.graph.replay()
        self.replays += 1
        greedy = g.greedy[:R].tolist()
        if R == len(entries):
            return g.logits[:R], greedy
        last = np.cumsum(counts) - 1
        return (g.logits[torch.as_tensor(last, device=self.device)], [greedy[i] for i in last.tolist()])

    def graph(self, B: int, NP: int) -> _Graph:
        """The graph of bucket (B rows, page-table width NP), captured first if it is new."""
        g = self._graphs.get((B, NP))
        if g is None:
            g = self._graphs[(B, NP)] = self._capture(B, NP)
        return g

    def _capture(self, B: int, NP: int) -> _Graph:
        host = torch.empty(B, 2 + NP, dtype=torch.int32, pin_memory=True)
        dev = torch.zeros(B, 2 + NP, dtype=torch.int32, device=self.device)
        dev[:, 2:] = self.pools.scratch_page  # warm-up writes land in the scratch page

        def step() -> tuple[torch.Tensor, torch.Tensor]:
            logits = self._step(dev[:, 0], dev[:, 1], dev[:, 2:], self.pools)
            return logits, logits.argmax(-1)

        t0 = time.perf_counter()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with CompileLog() as compiles, torch.cuda.stream(side), torch.inference_mode():
            step()  # compiles the Triton kernels and sets up library handles
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        t1 = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits, greedy = step()
        t2 = time.perf_counter()
        self.capture_s += t2 - t0
        self.compiled[(B, NP)] = [name for name, _ in compiles.compiled]
        # NOTE: the engine loop runs no step while it captures: a capture in the middle of a
        # run is a stall of every stream, and this line says what it cost
        log.info(
            "step graph (%d rows, page-table width %d) captured in %.2f s: warm-up %.2f s%s, capture %.2f s",
            B,
            NP,
            t2 - t0,
            t1 - t0,
            f" (Triton compiles: {compiles.summary()})" if compiles.compiled else "",
            t2 - t1,
        )
        return _Graph(graph, host, host.numpy(), dev, logits, greedy)
