"""After the load, alone: the determinism probe, then triage (triage.py), then recheck (recheck.py).

One pass, one request at a time, bounded by AFTER_LOAD_CAP_S, over what the driver kept during the
load. Its result is run.json's `triage` block (summary.json carries it; the report's "Triage"
section reads it); the requests are `alone_request` events, never turns. Our own failure here is
said in the block (`error`), never a finding about the server.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from dsv4bench.harness.config import RunConfig
from dsv4bench.harness.driver import make_client
from dsv4bench.harness.recheck import Changed, RecheckKeep, recheck_one
from dsv4bench.harness.triage import (
    AFTER_LOAD_CAP_S,
    AloneSender,
    Determinism,
    FindingKeep,
    Triaged,
    probe_determinism,
    triage_findings,
)
from dsv4bench.history.run_folder import HistoryWriter


def wanted(findings: FindingKeep, recheck: RecheckKeep) -> bool:
    """Whether anything is to be sent alone: a finding to triage or a turn to recheck."""
    return bool(findings.chosen()) or bool(recheck.kept)


async def _alone(
    config: RunConfig,
    run_id: str,
    family: str | None,
    findings: FindingKeep,
    recheck: RecheckKeep,
    history: HistoryWriter,
    block: dict[str, Any],
) -> None:
    chosen = findings.chosen()
    async with make_client(config) as client:
        sender = AloneSender(client, config.base_url, config.deadlines, run_id, family, history)
        triaged: list[Triaged] = []
        changed: list[Changed] = []
        rechecked = 0
        with anyio.move_on_after(AFTER_LOAD_CAP_S) as cap:
            probe_on = chosen[0] if chosen else recheck.kept[0]
            det: Determinism = await probe_determinism(sender, probe_on)
            block["determinism"] = det.as_dict()
            triaged = await triage_findings(sender, chosen, det.deterministic, config.raw)
            if det.deterministic:
                for kept in recheck.kept:
                    found = await recheck_one(sender, kept)
                    rechecked += 1
                    if found is not None:
                        changed.append(found)
        block["findings"] = [t.as_dict() for t in triaged] + [c.as_dict() for c in changed]
        block["triaged"] = len(triaged)
        block["requests"] = sender.requests
        block["cut"] = cap.cancelled_caught  # the time cap stopped it: fewer were sent than kept
        if recheck.share > 0:
            block["recheck"] = {
                "share": recheck.share,
                "seen": recheck.seen,
                "kept": len(recheck.kept),
                "strata": len(recheck.strata),
                "rechecked": rechecked,
                "changed": len(changed),
            }


def check_alone(
    config: RunConfig,
    run_id: str,
    family: str | None,
    findings: FindingKeep,
    recheck: RecheckKeep,
    history: HistoryWriter,
) -> dict[str, Any] | None:
    """run.json's `triage` block, or None when nothing was kept to send alone."""
    if not wanted(findings, recheck):
        return None
    block: dict[str, Any] = {
        "limit": findings.limit,
        "findings_kept": len(findings.chosen()),
        "recheck": None,
        "cap_s": AFTER_LOAD_CAP_S,
    }
    history.event("alone_start", findings=block["findings_kept"], recheck=len(recheck.kept))
    t0 = time.monotonic()
    try:
        anyio.run(_alone, config, run_id, family, findings, recheck, history, block)
    except Exception as e:  # noqa: BLE001 - our own failure must not lose the run's report
        block["error"] = f"{type(e).__name__}: {e}"[:300]
    block["elapsed_s"] = round(time.monotonic() - t0, 3)
    history.event("alone_end", requests=block.get("requests"), elapsed_s=block["elapsed_s"], error=block.get("error"))
    return block
