"""The composition root of `dsv4bench agents`: run folder, history, progress, driver, report."""

from __future__ import annotations

import datetime as dt
import secrets
import time
from pathlib import Path
from typing import Any

from dsv4bench.loop import fair_loop
from dsv4bench.servers.canary import OK, TIMEOUT
from dsv4bench.checks.parser_view import oracle_versions
from dsv4bench.harness.config import RunConfig
from dsv4bench.servers.discovery import Deployment
from dsv4bench.harness.alone import recheck_alone, triage_alone
from dsv4bench.harness.driver import AgentRun
from dsv4bench.harness.exporter import ExporterError, HarnessExporter
from dsv4bench.families import chosen_family, family_of_server
from dsv4bench.history.events import RunEndReason
from dsv4bench.history.run_folder import HistoryWriter, read_history
from dsv4bench.harness.server_watch import ServerWatch
from dsv4bench.harness.progress import LiveStats, ProgressView
from dsv4bench.harness.persistence import check_persistence, time_to_clean
from dsv4bench.harness.recover import run_recovery
from dsv4bench.history.redact import redact_command
from dsv4bench.harness.reference_run import ReferenceAnswers
from dsv4bench.report import build_report
from dsv4bench.report.slo import tally_for
from dsv4bench.servers.kinds import BUNDLED, SGLANG
from dsv4bench.servers.wedge import WedgeConfig, WedgeFinding, detect_wedge

# The server kinds asked where each turn's cached tokens came from (SGLang's field).
CACHE_TIER_KINDS = frozenset({SGLANG, BUNDLED})


def new_run_dir(config: RunConfig) -> tuple[str, Path]:
    """A fresh, sortable, unique run folder under config.out."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{config.scenario}-c{config.concurrency}-{secrets.token_hex(2)}"
    return run_id, config.out / run_id


def run_agents(
    config: RunConfig, facts: dict[str, Any], command: str, reference: ReferenceAnswers | None = None
) -> tuple[dict[str, Any], Path]:
    """Run all sessions, then write summary.json, report.md and plots. Returns (summary, run dir).
    `reference`: config.reference already loaded (the CLI loads it before starting anything)."""
    if reference is None and config.reference is not None:
        reference = ReferenceAnswers.load(config.reference)
    run_id, run_dir = new_run_dir(config)
    model = config.model or (facts.get("models") or ["default"])[0]
    reported = family_of_server(facts)
    family = chosen_family(config.family, reported)
    run_info: dict[str, Any] = {
        "run": run_id,
        "command": command,
        "config": config.to_json(),
        "model": model,
        "server": facts,
        # whose markup the run checks, and why: the report says it (families.chosen_family)
        "model_family": {
            "family": family,
            "from": "--family"
            if config.family != "auto"
            else "tool_call_parser"
            if reported
            else "each answer's model",
        },
        "started": dt.datetime.now(dt.timezone.utc).isoformat(),
    }
    if reference is not None:
        run_info["reference"] = {
            "run_dir": str(reference.run_dir),
            "answers": len(reference.answers),
            "conflicts": reference.conflicts,
        }
    if config.raw:
        run_info["oracles"] = oracle_versions()
    history = HistoryWriter(run_dir, run_info, config.redactor)
    stats = LiveStats(slo=tally_for(config.slo_targets))
    exporter = None
    if config.serve_metrics is not None:
        exporter = HarnessExporter(stats, run_id)
        try:
            exporter.start(config.serve_metrics)  # before any load: a taken port fails the run at once
        except ExporterError:
            history.event("run_end", run=run_id, reason=RunEndReason.SERVE_METRICS_PORT_TAKEN)
            history.close()
            raise
    cache_tiers = facts.get("server_kind") in CACHE_TIER_KINDS
    driver = AgentRun(
        config, model, history, stats, run_id, facts.get("context_length"), reference, family, cache_tiers
    )
    deployment = Deployment.from_dict(facts.get("deployment"))
    if deployment is not None:
        driver.watch.know_roles(deployment.roles())
    reason = RunEndReason.COMPLETE
    try:
        with ProgressView(stats, config.quiet):
            fair_loop.run(driver.run)
        if driver.watch.load_stopped_ns is not None:
            wedge = judge_wedge(config, driver.watch, history)
            if wedge is not None:
                run_info["wedge"] = wedge
            # Wedge judgement, then what the load left behind (fresh sessions on a wedged server
            # would only hang), then the recovery that clears either.
            wedged = wedge is not None and any(w["codes"] for w in wedge.values())
            # Triage over the cache the load left, before fresh sessions change it; recheck last,
            # since it drops the prefix cache first (alone.py).
            alone = None if wedged else triage_alone(config, run_id, family, driver.findings, history)
            persisted = None if wedged else judge_persistence(config, model, family, run_id, run_dir, history)
            if persisted is not None:
                run_info["persistence"] = persisted
            if alone is not None:
                kind = facts.get("server_kind")  # the target's kind (servers/kinds.py): how it flushes
                recheck_alone(config, run_id, family, driver.recheck, history, alone, kind)
                if alone["findings_kept"] or alone["recheck"] is not None:
                    run_info["triage"] = alone
            poisoned = persisted is not None and persisted.get("poisoned") is True
            if config.recover_cmd and (wedged or poisoned):
                t0 = time.monotonic()
                history.event("recover_start", cmd=redact_command(config.recover_cmd))
                run_info["recovery"] = run_recovery(
                    config.recover_cmd, [config.base_url], model, api_key=config.api_key
                )
                history.event("recover_end", **run_info["recovery"])
                if persisted is not None and poisoned:
                    persisted["after_recovery"] = time_to_clean(config, model, family, run_id, persisted, t0)
            history.update_run_info(run_info)
    except KeyboardInterrupt:
        reason = RunEndReason.INTERRUPTED  # the history so far is kept and reported
    except BaseException:
        reason = RunEndReason.ERROR  # our own failure: the run_end says so, and the error goes on up
        raise
    finally:
        history.event("run_end", run=run_id, reason=reason)
        history.close()
        if exporter is not None:
            exporter.shutdown()  # kept up through the drain so dashboards see it
    return build_report(run_dir), run_dir


def judge_persistence(
    config: RunConfig, model: str, family: str | None, run_id: str, run_dir: Path, history: HistoryWriter
) -> dict[str, Any] | None:
    """run.json's `persistence` block (persistence.py); a check that failed is said as our own
    failure (`error`), never a finding about the server."""
    try:
        return check_persistence(config, model, family, run_id, read_history(run_dir), history)
    except Exception as e:  # noqa: BLE001 - our bug must not lose the run's report
        error = f"{type(e).__name__}: {e}"[:300]
        history.event("persistence_error", error=error)
        return {"poisoned": None, "error": error}


def judge_wedge(config: RunConfig, watch: ServerWatch, history: HistoryWriter) -> dict[str, Any] | None:
    """Per-endpoint wedge findings at the end of the drain window (queues from the metrics
    samples; canary and /health from the checks after it), as run.json keeps them, or None if
    the detector failed."""
    try:
        assert watch.load_stopped_ns is not None, "judged before the load stopped"
        wedge = detect_wedge(
            watch.samples,
            watch.load_stopped_ns,
            WedgeConfig(drain_timeout_s=config.drain_timeout),
            health=watch.health,
            canaries=watch.canaries,
        )
    except Exception as e:  # noqa: BLE001 - a detector bug must not lose the run's report
        history.event("wedge_error", error=f"{type(e).__name__}: {e}"[:300])
        return None
    # The report's canary column: of an endpoint's canaries (not streamed, streamed), the one that
    # shows the wedge: one that hung before one answered with an error, before one that answered;
    # the latest among equals.
    weight = {OK: 0, TIMEOUT: 2}
    for c in sorted(watch.canaries, key=lambda c: (weight.get(c.result, 1), c.t_ns)):
        wedge.setdefault(c.endpoint, WedgeFinding()).canary = c
    return {ep: found.as_dict() for ep, found in wedge.items()}
