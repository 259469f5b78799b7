"""`dsv4bench report` and `dsv4bench audit`: work on what was recorded, no server needed."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dsv4bench.harness.config import ConfigError, parse_fail_on
from dsv4bench.cli.common import app, fail, out, print_verdict


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="A run folder (possibly partial, e.g. from a killed run)."),
    slo: Optional[str] = typer.Option(
        None,
        "--slo",
        metavar="TARGETS",
        help=(
            "Judge the recorded turns against these latency targets (ttft=2s,itl=100ms,e2e=60s, any subset) "
            "in place of the run's own --slo: the goodput of a run at other targets, no server needed. "
            "docs/slo.md."
        ),
    ),
) -> None:
    """Rebuild summary.json, report.md and the plots from a run's history."""
    from dsv4bench.history.run_folder import HistoryError
    from dsv4bench.report import build_report
    from dsv4bench.report.slo import SloError, SloTargets

    try:
        spec = SloTargets.parse(slo).spec if slo is not None else None
    except SloError as e:
        raise fail(str(e))
    try:
        summary = build_report(run_dir, slo=spec)
    except HistoryError as e:
        raise fail(str(e))
    print_verdict(summary, run_dir)


@app.command()
def audit(
    file: Path = typer.Argument(
        ...,
        metavar="RUN_DIR_OR_FILE",
        help=(
            "JSONL of recorded request/response pairs or SSE transcripts, a turns.jsonl, or a run folder "
            "(an agents run, or what dsv4bench proxy captured)."
        ),
    ),
    reference: Optional[Path] = typer.Option(
        None,
        "--reference",
        metavar="RUN",
        help=(
            "Judge the recorded run against another, offline, as agents --reference does live: every completed "
            "greedy turn whose request RUN also answered must have RUN's answer (reference_mismatch); a session's "
            "turns after its first mismatch are not compared."
        ),
    ),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write per-record verdicts as JSONL here."),
    fail_on: Optional[str] = typer.Option(None, help="Exit 1 on these verdicts: corruption,errors."),
    family: str = typer.Option(
        "auto",
        help=(
            "Model family whose markup is checked: auto (each exchange's own: a `family` or `tool_call_parser` "
            "field, else its model names; every family where none says), all, or a family name "
            "(agents --help lists them)."
        ),
    ),
) -> None:
    """Run the checkers offline over traffic captured in production, a proxy capture or a recorded run.

    Markup that is not structural is judged by the text the request gave the model: exchanges
    recorded without their requests' messages keep it as markup_unproven, evidence only."""
    from dsv4bench.modes.audit import AuditError, audit_file, render_audit, unreadable_summary, write_results
    from dsv4bench.harness.reference_run import ReferenceAnswers, ReferenceRunError

    from dsv4bench.families import family_flag

    try:
        codes = parse_fail_on(fail_on)
        family = family_flag(family)
    except (ConfigError, ValueError) as e:
        raise fail(str(e))
    bad = [c for c in codes if c not in ("corruption", "errors")]
    if bad:
        raise fail(f"audit --fail-on takes corruption,errors; got {', '.join(bad)}")
    try:
        answers = ReferenceAnswers.load(reference) if reference is not None else None
        results = audit_file(file, answers, family)
    except (AuditError, ReferenceRunError) as e:
        raise fail(str(e))
    render_audit(results, out, answers)
    if out_file:
        try:
            write_results(results, out_file)
        except OSError as e:
            raise fail(f"--out {out_file}: cannot write ({e.strerror or e})")
    torn = unreadable_summary(results)
    if torn is not None:  # the verdicts above cover the readable lines only
        raise fail(torn)
    if ("corruption" in codes and any(r.corrupt for r in results)) or (
        "errors" in codes and any(r.errors for r in results)
    ):
        raise typer.Exit(1)
