"""After the load, alone: the determinism probe and triage (triage.py), then recheck (recheck.py).

Two stages over what the driver kept during the load, each request alone but recheck's screen
(recheck.py says why and what it may judge):
1. `triage_alone`, right after the drain: the findings are sent again over the cache the load
   left, since whether a finding shows from that cache is part of its class;
2. `recheck_alone`, after the persistence check (which plays fresh sessions on the state the load
   left): the server's prefix cache is dropped first where its kind offers a flush
   (servers/cache_flush.py), so each rechecked request is computed afresh and a race that wrote
   wrong KV into the cache cannot hand the load's wrong answer back; then the kept turns, a
   session at a time, --recheck-group sessions at once.

Both share one time budget, AFTER_LOAD_CAP_S. Their result is run.json's `triage` block
(summary.json carries it; the report's "Triage" section reads it); the requests are
`alone_request` events, never turns. Our own failure here is said in the block (`error`),
never a finding about the server.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from dsv4bench.harness.config import RunConfig
from dsv4bench.harness.driver import make_client
from dsv4bench.harness.recheck import Changed, RecheckGate, RecheckKeep, recheck_one
from dsv4bench.harness.triage import (
    AFTER_LOAD_CAP_S,
    AloneSender,
    FindingKeep,
    Kept,
    Triaged,
    probe_determinism,
    triage_findings,
)
from dsv4bench.history.run_folder import HistoryWriter
from dsv4bench.servers.cache_flush import flush_prefix_cache
from dsv4bench.servers.preflight import root_of

Stage = Callable[[AloneSender, dict[str, Any]], Awaitable[None]]


def _budget_left(block: dict[str, Any]) -> float:
    return max(0.0, AFTER_LOAD_CAP_S - block.get("elapsed_s", 0.0))


def _run_stage(
    config: RunConfig, run_id: str, family: str | None, history: HistoryWriter, block: dict[str, Any], stage: Stage
) -> None:
    """Run one stage within what is left of the budget; its time, requests and cut go in the block."""

    async def main() -> None:
        async with make_client(config) as client:
            sender = AloneSender(client, config.base_url, config.deadlines, run_id, family, history)
            try:
                with anyio.move_on_after(_budget_left(block)) as cap:
                    await stage(sender, block)
                block["cut"] = block.get("cut", False) or cap.cancelled_caught  # fewer sent than kept
            finally:
                block["requests"] = block.get("requests", 0) + sender.requests

    history.event("alone_start", stage=stage.__name__.strip("_"))
    t0 = time.monotonic()
    try:
        anyio.run(main)
    except Exception as e:  # noqa: BLE001 - our own failure must not lose the run's report
        block["error"] = f"{type(e).__name__}: {e}"[:300]
    block["elapsed_s"] = round(block.get("elapsed_s", 0.0) + time.monotonic() - t0, 3)
    history.event("alone_end", requests=block.get("requests"), elapsed_s=block["elapsed_s"], error=block.get("error"))


async def _probe(sender: AloneSender, block: dict[str, Any], on: Kept) -> bool:
    """The determinism probe, once per run: whether the server answers one request alone one way."""
    if "determinism" not in block:
        det = await probe_determinism(sender, on)
        block["determinism"] = det.as_dict()
    return block["determinism"]["deterministic"] is True


def triage_alone(
    config: RunConfig, run_id: str, family: str | None, findings: FindingKeep, history: HistoryWriter
) -> dict[str, Any]:
    """Stage 1: run.json's `triage` block with the probe and the triaged findings (none kept:
    an empty block that recheck_alone may fill)."""
    chosen = findings.chosen()
    block: dict[str, Any] = {"limit": findings.limit, "findings_kept": len(chosen), "recheck": None}
    block["cap_s"], block["findings"], block["triaged"] = AFTER_LOAD_CAP_S, [], 0
    if not chosen:
        return block

    async def _triage(sender: AloneSender, block: dict[str, Any]) -> None:
        triaged: list[Triaged] = []
        try:
            deterministic = await _probe(sender, block, chosen[0])
            await triage_findings(sender, chosen, deterministic, config.raw, triaged)
        finally:
            block["findings"] += [t.as_dict() for t in triaged]
            block["triaged"] = len(triaged)

    _run_stage(config, run_id, family, history, block, _triage)
    return block


def recheck_alone(
    config: RunConfig,
    run_id: str,
    family: str | None,
    recheck: RecheckKeep,
    history: HistoryWriter,
    block: dict[str, Any],
    server_kind: str | None,
) -> None:
    """Stage 2, into `block`: drop the prefix cache (unless --recheck-keep-cache), then each kept
    turn alone, newest first. Nothing kept: the block is left as it is."""
    if not recheck.kept:
        return
    kept = recheck.kept
    done: dict[str, int] = {"rechecked": 0}
    changed: list[Changed] = []
    gate = RecheckGate()
    # One session's kept turns in a row, by depth (RecheckKeep.kept's order): each worker takes
    # the next session and sends its turns one after another, so each reuses the prefix the
    # one before it computed.
    chains: deque[list[Kept]] = deque()
    for one in kept:
        if chains and chains[-1][0].session == one.session:
            chains[-1].append(one)
        else:
            chains.append([one])

    async def _worker(sender: AloneSender) -> None:
        while chains:
            for one in chains.popleft():
                found = await recheck_one(sender, one, gate)
                done["rechecked"] += 1
                if found is not None:
                    changed.append(found)

    async def _recheck(sender: AloneSender, block: dict[str, Any]) -> None:
        try:
            if not config.recheck_keep_cache:
                flushed = await flush_prefix_cache(sender.client, root_of(config.base_url), server_kind)
                block["cache_flush"] = flushed.as_dict()
                history.event("cache_flush", **flushed.as_dict())
            if not await _probe(sender, block, kept[0]):
                return
            async with anyio.create_task_group() as workers:
                for _ in range(config.recheck_group):
                    workers.start_soon(_worker, sender)
        finally:
            block["findings"] += [c.as_dict() for c in changed]

    try:
        _run_stage(config, run_id, family, history, block, _recheck)
    finally:
        block["recheck"] = {
            "share": recheck.share,
            "seen": recheck.seen,
            "kept": len(kept),
            "strata": len(recheck.strata),
            "rechecked": done["rechecked"],
            "changed": len(changed),
            "group": config.recheck_group,
            "screen_only": gate.screen_only,
        }
