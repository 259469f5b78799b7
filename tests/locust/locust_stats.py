"""Locust's own statistics (its --csv files) read back and held against a run's history."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

from dsv4bench.history.run_folder import History
from dsv4bench.history.records import TurnStatus
from dsv4bench.report.counting import turn_codes


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_stats_match_history(prefix: Path, history: History) -> Counter[str]:
    """Every turn a TURN or KILLED request, every time to first token a TTFT entry, every turn
    with a code (or an error) a TURN failure; returns the codes Locust's failures name, counted."""
    requests: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    for row in read_csv(Path(f"{prefix}_stats.csv")):
        if row["Name"] != "Aggregated":
            requests[row["Type"]] += int(row["Request Count"])
            failures[row["Type"]] += int(row["Failure Count"])
    turns = history.turns
    assert requests["TURN"] + requests["KILLED"] == len(turns), (requests, len(turns))
    assert requests["KILLED"] == sum(t.status is TurnStatus.KILLED for t in turns)
    assert requests["TTFT"] == sum(t.timings.ttft_s is not None and t.status is not TurnStatus.KILLED for t in turns)
    judged_bad = sum(bool(turn_codes(t)) or t.status in (TurnStatus.ERROR, TurnStatus.TIMEOUT) for t in turns)
    assert failures["TURN"] == judged_bad and failures["KILLED"] == failures["TTFT"] == 0, (failures, judged_bad)
    named: Counter[str] = Counter()
    for row in read_csv(Path(f"{prefix}_failures.csv")):
        head = row["Error"].split(": session ", 1)[0]  # "code, code: session s00012 turn 3"
        for code in head.split(", "):
            named[code] += int(row["Occurrences"])
    assert named == Counter(code for t in turns for code in turn_codes(t))
    return named
