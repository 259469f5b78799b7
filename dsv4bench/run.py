"""The composition root of `dsv4bench agents`: run folder, history, progress, driver, report."""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path
from typing import Any

import anyio

from .config import RunConfig
from .driver import AgentRun
from .history import HistoryWriter
from .progress import LiveStats, ProgressView
from .report import build_report


def new_run_dir(config: RunConfig) -> tuple[str, Path]:
    """A fresh, sortable, unique run folder under config.out."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}-{config.scenario}-c{config.concurrency}-{secrets.token_hex(2)}"
    return run_id, config.out / run_id


def run_agents(config: RunConfig, facts: dict[str, Any], command: str) -> tuple[dict[str, Any], Path]:
    """Run all sessions, then write summary.json, report.md and plots. Returns (summary, run dir)."""
    run_id, run_dir = new_run_dir(config)
    model = config.model or (facts.get("models") or ["default"])[0]
    history = HistoryWriter(run_dir, {
        "run": run_id,
        "command": command,
        "config": config.to_json(),
        "model": model,
        "server": facts,
        "started": dt.datetime.now(dt.timezone.utc).isoformat(),
    })
    stats = LiveStats()
    driver = AgentRun(config, model, history, stats, run_id)
    reason = "complete"
    try:
        with ProgressView(stats, config.quiet):
            anyio.run(driver.run)
    except KeyboardInterrupt:
        reason = "interrupted"  # the history so far is kept and reported
    finally:
        history.event("run_end", run=run_id, reason=reason)
        history.close()
    return build_report(run_dir), run_dir
