"""`dsv4bench report` and `dsv4bench audit`: work on what was recorded, no server needed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..config import parse_fail_on
from .common import app, fail, out, print_verdict


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run folder (possibly partial, e.g. from a killed run).")) -> None:
    """Rebuild summary.json, report.md and the plots from a run's history."""
    from ..history import HistoryError
    from ..report import build_report

    try:
        summary = build_report(run_dir)
    except HistoryError as e:
        raise fail(str(e))
    print_verdict(summary, run_dir)


@app.command()
def audit(
    file: Path = typer.Argument(..., help="JSONL of recorded request/response pairs or SSE transcripts."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write per-record verdicts as JSONL here."),
    fail_on: Optional[str] = typer.Option(None, help="Exit 1 on these verdicts: corruption,errors."),
) -> None:
    """Run the checkers offline over traffic captured in production."""
    from ..audit import AuditError, audit_file, render_audit, unreadable_summary, write_results

    codes = parse_fail_on(fail_on)
    bad = [c for c in codes if c not in ("corruption", "errors")]
    if bad:
        raise fail(f"audit --fail-on takes corruption,errors; got {', '.join(bad)}")
    try:
        results = audit_file(file)
    except AuditError as e:
        raise fail(str(e))
    render_audit(results, out)
    if out_file:
        try:
            write_results(results, out_file)
        except OSError as e:
            raise fail(f"--out {out_file}: cannot write ({e.strerror or e})")
    torn = unreadable_summary(results)
    if torn is not None:  # the verdicts above cover the readable lines only
        raise fail(torn)
    if ("corruption" in codes and any(r.corrupt for r in results)) or ("errors" in codes and any(r.errors for r in results)):
        raise typer.Exit(1)
