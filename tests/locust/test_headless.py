"""`dsv4bench locust --headless` against the known-bad replay server: Locust's statistics and the
run folder tell the same story (every turn a TURN or KILLED request, every time to first token a
TTFT entry, every judged turn with a code a failure naming it), and the failures carry the codes
the server planted."""

from __future__ import annotations

import importlib.util
import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from dsv4bench.history import read_history
from dsv4bench.records import TurnStatus
from dsv4bench.summary import turn_codes

from .conftest import only_run_dir, run_cli, start_replay

# NOTE: not importorskip: importing Locust would patch this whole pytest process for gevent.
if importlib.util.find_spec("locust") is None:
    pytest.skip("Locust is not installed (pip install 'dsv4bench[locust]')", allow_module_level=True)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_locusts_stats_and_failures_match_the_history_and_carry_the_planted_codes(tmp_path):
    replay = start_replay(tmp_path, fault_rate=25)
    try:
        r = run_cli("locust", "--host", replay.url, "--headless", "-u", "6", "-r", "6", "-t", "10s", "--max-turns", "6",
                    "--out", str(tmp_path / "runs"), "--csv", str(tmp_path / "stats"), "--fail-on", "corruption",
                    timeout=120)
        planted = replay.planted()
    finally:
        replay.stop()
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]  # --fail-on corruption: the server corrupts
    run_dir = only_run_dir(tmp_path / "runs")
    history = read_history(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "CORRUPTION" and summary["history"]["complete"]
    assert "CORRUPTION" in r.stdout and str(run_dir) in r.stdout  # the verdict line, as agents prints it

    rows = [row for row in read_csv(tmp_path / "stats_stats.csv") if row["Name"] != "Aggregated"]
    requests = Counter()
    failures = Counter()
    for row in rows:
        requests[row["Type"]] += int(row["Request Count"])
        failures[row["Type"]] += int(row["Failure Count"])
    turns = history.turns
    assert requests["TURN"] + requests["KILLED"] == len(turns)
    assert requests["KILLED"] == sum(t.status is TurnStatus.KILLED for t in turns)
    assert requests["TTFT"] == sum(t.timings.ttft_s is not None and t.status is not TurnStatus.KILLED for t in turns)
    judged_bad = sum(bool(turn_codes(t)) or t.status in (TurnStatus.ERROR, TurnStatus.TIMEOUT) for t in turns)
    assert failures["TURN"] == judged_bad > 0 and failures["KILLED"] == failures["TTFT"] == 0

    # Each failure names its codes and its session and turn; the planted ones are among them.
    named: Counter[str] = Counter()
    for row in read_csv(tmp_path / "stats_failures.csv"):
        head = row["Error"].split(": session ", 1)[0]
        for code in head.split(", "):
            named[code] += int(row["Occurrences"])
    recorded: Counter[str] = Counter(code for t in turns for code in turn_codes(t))
    assert named == recorded
    judged = {(t.session, t.turn) for t in turns if t.status is TurnStatus.OK}
    expected = {code for key, codes in planted.items() if key in judged for code in codes}
    assert expected and expected <= set(named)
