"""Planted faults of the bundled engine: real bug mechanisms behind `--fault NAME`, off by default.

Each fault switches a mechanism from its correct form to a form that has broken real SGLang
deployments. None of them writes garbage on purpose: corruption and wedges must come out of the
mechanism (a race, a leak, a stalled worker, a missed abort, a parser edge), as they did in
production. `dsv4bench agents --engine-fault NAME` passes one to the bundled engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str
    mirrors: str  # the bug class in a real deployment
    needs: str  # what must be on for the mechanism to exist: "" (any mode), "pd" or "hicache"


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("hicache-index-race",
          "HiCache's layer-wise KV load races the sparse-attention indexer: the index-K read path skips "
          "the per-layer load gate (wait_layer_transfer), so the indexer scores stale keys; a bf16 index-K "
          "buffer (--index-k-dtype bf16) is twice the size and widens the window", "hicache"),
    Fault("abort-leak",
          "requests aborted while their KV is in flight never leave the decode transfer queue and the "
          "prefill inflight queue: the queues stick and their pages leak", "pd"),
    Fault("bootstrap-stall",
          "the prefill bootstrap worker meets an ABORT it does not expect and stops: every later request "
          "waits in the bootstrap queue for ever", "pd"),
    Fault("ghost-decode",
          "a client disconnect does not abort the request: the server's read of the engine is shielded from "
          "the handler's cancellation and its cleanup skips the run whose client left, while the server (not "
          "the engine) ends turns at EOS; the orphan keeps its running slot and decodes to max_tokens for nobody", ""),
    Fault("health-lies",
          "/health answers 200 from the engine's liveness flag instead of a one-token generation, so an "
          "engine that is alive but cannot generate (a stuck loop, no free slot) looks healthy", ""),
    Fault("parser-split",
          "the streaming tool-call parse passes each chunk of text on as content until the DSML block opener "
          "is complete, with no hold-back of a partial tag: an opener split across chunks leaks its leading "
          "pieces (`<｜DSML｜tool_calls`) into content beside the correctly parsed calls", ""),
)}


class FaultError(ValueError):
    """An unknown fault name; one line for the user."""


def parse_faults(names: Iterable[str]) -> frozenset[str]:
    """Validate fault names (repeatable flag values) into a frozenset."""
    names = [n.strip() for n in names]
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise FaultError(f"unknown fault {', '.join(map(repr, unknown))}; faults: {', '.join(FAULTS)}")
    return frozenset(names)
