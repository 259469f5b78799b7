"""`dsv4bench locust --headless` against the known-bad replay server: Locust's statistics and the
run folder tell the same story (every turn a TURN or KILLED request, every time to first token a
TTFT entry, every judged turn with a code a failure naming it), and the failures carry the codes
the server planted."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dsv4bench.history.run_folder import read_history
from dsv4bench.history.records import TurnStatus

from .conftest import only_run_dir, run_cli, start_replay
from .locust_stats import assert_stats_match_history

# NOTE: not importorskip: importing Locust would patch this whole pytest process for gevent.
if importlib.util.find_spec("locust") is None:
    pytest.skip("Locust is not installed (pip install 'dsv4bench[locust]')", allow_module_level=True)


def test_locusts_stats_and_failures_match_the_history_and_carry_the_planted_codes(tmp_path):
    replay = start_replay(tmp_path, fault_rate=25)
    try:
        r = run_cli(
            "locust",
            "--host",
            replay.url,
            "--headless",
            "-u",
            "6",
            "-r",
            "6",
            "-t",
            "10s",
            "--max-turns",
            "6",
            "--out",
            str(tmp_path / "runs"),
            "--csv",
            str(tmp_path / "stats"),
            "--fail-on",
            "corruption",
            timeout=120,
        )
        planted = replay.planted()
    finally:
        replay.stop()
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]  # --fail-on corruption: the server corrupts
    run_dir = only_run_dir(tmp_path / "runs")
    history = read_history(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "CORRUPTION" and summary["history"]["complete"]
    assert "CORRUPTION" in r.stdout and str(run_dir) in r.stdout  # the verdict line, as agents prints it

    named = assert_stats_match_history(tmp_path / "stats", history)
    turns = history.turns
    assert sum(named.values()) > 0
    judged = {(t.session, t.turn) for t in turns if t.status is TurnStatus.OK}
    expected = {code for key, codes in planted.items() if key in judged for code in codes}
    assert expected and expected <= set(named)
