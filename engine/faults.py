"""Planted faults of the bundled engine: real bug mechanisms behind `--fault NAME`, off by default.

Each fault switches a mechanism from its correct form to a form that has broken real SGLang
deployments. None of them writes garbage on purpose: corruption and wedges must come out of the
mechanism (a race, a leak, a stalled worker, a missed abort, a parser edge), as they did in
production. `dsv4bench agents --engine-fault NAME` passes one to the bundled engine.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Fault(str, enum.Enum):
    """A planted fault; its value is the name `--fault` takes. A `str`, so it compares equal to
    its name and JSON writes it as one; use sites test members (`Fault.GHOST_DECODE in
    cfg.faults`), so a misspelt fault is an AttributeError, not a fault silently off."""

    HICACHE_INDEX_RACE = "hicache-index-race"
    ABORT_LEAK = "abort-leak"
    BOOTSTRAP_STALL = "bootstrap-stall"
    GHOST_DECODE = "ghost-decode"
    HEALTH_LIES = "health-lies"
    PARSER_SPLIT = "parser-split"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class FaultInfo:
    """What a fault mirrors and what it needs."""

    fault: Fault
    mirrors: str  # the bug class in a real deployment
    needs: str  # what must be on for the mechanism to exist: "" (any mode), "pd" or "hicache"

    @property
    def name(self) -> str:
        return self.fault.value


FAULTS: dict[str, FaultInfo] = {
    f.name: f
    for f in (
        FaultInfo(
            Fault.HICACHE_INDEX_RACE,
            "HiCache's layer-wise KV load races the sparse-attention indexer: the index-K read path skips "
            "the per-layer load gate (wait_layer_transfer), so the indexer scores stale keys; a bf16 index-K "
            "buffer (--index-k-dtype bf16) is twice the size and widens the window",
            "hicache",
        ),
        FaultInfo(
            Fault.ABORT_LEAK,
            "requests aborted while their KV is in flight never leave the decode transfer queue and the "
            "prefill inflight queue: the queues stick and their pages leak",
            "pd",
        ),
        FaultInfo(
            Fault.BOOTSTRAP_STALL,
            "the prefill bootstrap worker meets an ABORT it does not expect and stops: every later request "
            "waits in the bootstrap queue for ever",
            "pd",
        ),
        FaultInfo(
            Fault.GHOST_DECODE,
            "a client disconnect does not abort the request: the server's read of the engine is shielded from "
            "the handler's cancellation and its cleanup skips the run whose client left, while the server (not "
            "the engine) ends turns at EOS; the orphan keeps its running slot and decodes to max_tokens for nobody",
            "",
        ),
        FaultInfo(
            Fault.HEALTH_LIES,
            "/health answers 200 from the engine's liveness flag instead of a one-token generation, so an "
            "engine that is alive but cannot generate (a stuck loop, no free slot) looks healthy",
            "",
        ),
        FaultInfo(
            Fault.PARSER_SPLIT,
            "the streaming tool-call parse passes each chunk of text on as content until the DSML block opener "
            "is complete, with no hold-back of a partial tag: an opener split across chunks leaks its leading "
            "pieces (`<｜DSML｜tool_calls`) into content beside the correctly parsed calls",
            "",
        ),
    )
}


class FaultError(ValueError):
    """An unknown fault name; one line for the user."""


def parse_faults(names: Iterable[str]) -> frozenset[Fault]:
    """Validate fault names (repeatable flag values, or Fault members) into a frozenset of Faults."""
    names = [n.value if isinstance(n, Fault) else n.strip() for n in names]
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise FaultError(f"unknown fault {', '.join(map(repr, unknown))}; faults: {', '.join(FAULTS)}")
    return frozenset(Fault(n) for n in names)
