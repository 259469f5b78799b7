"""The incident report: markdown, plots, summary.

`build_report` is the one entry point: `dsv4bench report RUN_DIR` and the end of every run
call it. It only reads the history and writes the derived files, so it can be rerun at will,
including on a history cut short by SIGKILL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsv4bench.history.run_folder import (
    REPORT_FILE,
    SUMMARY_FILE,
    ReportError,
    read_history,
    write_atomic,
)
from dsv4bench.report.summary import summary_of
from dsv4bench.report.markdown import render_report

__all__ = ["build_report", "render_report"]


def build_report(run_dir: Path, slo: str | None = None) -> dict[str, Any]:
    """Read the run folder, write summary.json, plots/*.png and report.md; return the summary (as
    summarize() does). ReportError when they cannot be written (the history is not touched).
    `slo`: latency targets to judge the recorded turns by, in place of the run's own --slo (a
    spec SloTargets.parse reads; run.json keeps what the run was given)."""
    run_dir = Path(run_dir)
    history = read_history(run_dir)
    if slo is not None:
        config = history.run.get("config")
        history.run = {**history.run, "config": {**(config if isinstance(config, dict) else {}), "slo": slo}}
    typed = summary_of(history)
    summary = typed.to_dict()
    try:
        # matplotlib loads in ~0.3 s: imported where a report is drawn, not on every CLI start
        from dsv4bench.report.plots import render_plots

        plots = render_plots(history, run_dir)
        write_atomic(run_dir / SUMMARY_FILE, typed.to_json())
        report = render_report(history, summary, plots)
        # escape_text already made the report safe; backslashreplace only guards the encoding.
        write_atomic(run_dir / REPORT_FILE, report.encode("utf-8", errors="backslashreplace"))
    except OSError as e:
        raise ReportError(
            f"cannot write the report in {run_dir} ({e.strerror or e}); the history is kept, and "
            f"`dsv4bench report {run_dir}` rebuilds the report once it can be written"
        ) from e
    return summary
