"""build_report() end to end on a run folder, and the plots it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bench.history.run_folder import read_history
from dsv4bench.report import build_report, plots
from dsv4bench.report.plots import render_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_build_report_writes_everything(corruption_run: Path) -> None:
    summary = build_report(corruption_run)
    assert summary["verdict"] == "CORRUPTION"
    assert json.loads((corruption_run / "summary.json").read_text()) == summary
    md = (corruption_run / "report.md").read_text()
    for rel in ("plots/timeline.png", "plots/corruption_by_depth.png"):
        assert (corruption_run / rel).read_bytes().startswith(PNG_SIGNATURE)
        assert f"]({rel})" in md
    assert not list(corruption_run.glob("*.tmp"))


def test_build_report_on_partial_torn_history(run_folder, make_turn) -> None:
    run_dir = run_folder([make_turn("s1", 0), make_turn("s1", 1, start_s=2)], duration_s=None, torn_line=True)
    summary = build_report(run_dir)
    assert summary["partial"] is True and summary["skipped_lines"] == 1
    assert "Partial history" in (run_dir / "report.md").read_text()


def test_build_report_on_empty_history(run_folder) -> None:
    run_dir = run_folder([], run={}, duration_s=None)
    summary = build_report(run_dir)
    assert summary["turns"]["total"] == 0
    assert not (run_dir / "plots").exists()
    assert "## Plots" not in (run_dir / "report.md").read_text()


def test_plots_fail_soft(corruption_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(history: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setitem(plots.PLOTS, "timeline.png", broken)
    written = render_plots(read_history(corruption_run), corruption_run)
    assert written == ["plots/corruption_by_depth.png"]


def test_plots_without_ok_turns(run_folder, make_turn) -> None:
    # Only killed and failed turns: still a timeline and a (flat) depth chart, no exception.
    run_dir = run_folder([make_turn("s1", 0, status="killed"), make_turn("s1", 1, status="error", error="x")])
    assert render_plots(read_history(run_dir), run_dir) == ["plots/timeline.png", "plots/corruption_by_depth.png"]


def test_long_run_uses_wider_bins(run_folder, make_turn) -> None:
    turns = [make_turn(f"s{i}", 0, start_s=i * 30.0) for i in range(40)]  # 20 minutes
    run_dir = run_folder(turns, duration_s=1200.0)
    fig = plots.timeline_figure(read_history(run_dir))
    assert fig is not None
    assert "s bins" in fig.axes[0].get_ylabel()
