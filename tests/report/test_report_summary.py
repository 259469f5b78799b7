"""summarize() on literal histories: exact counts, rates, breakdowns and the verdict order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bench.history.codes import AVAILABILITY_CODES, CORRUPTION_CODES, EVIDENCE_CODES
from dsv4bench.history.run_folder import read_history
from dsv4bench.report.counting import distribution, percentile
from dsv4bench.report.summary import summarize

STABLE_FIELDS = {"verdict", "turns", "tool_calls", "counts", "wedge"}


def test_clean_run(run_folder, make_turn) -> None:
    turns = [make_turn(f"s{i}", d, tool_calls=2, start_s=i + d) for i in range(3) for d in range(2)]
    s = summarize(read_history(run_folder(turns)))
    assert s["verdict"] == "CLEAN"
    assert s["turns"] == {"total": 6, "ok": 6, "good": 6, "killed": 0, "corrupt": 0, "error": 0}
    assert s["tool_calls"] == 12 and s["bad_tool_calls"] == 0
    assert all(n == 0 for n in s["counts"].values())
    assert s["corrupt_rate"] == 0.0
    assert s["partial"] is False and s["skipped_lines"] == 0
    assert s["duration_s"] == pytest.approx(60.0)
    assert s["wedge"] == {}
    assert STABLE_FIELDS <= s.keys()


def test_corruption_counts_rates_and_breakdowns(corruption_run: Path) -> None:
    s = summarize(read_history(corruption_run))
    assert s["verdict"] == "CORRUPTION"  # an error turn is present too, but corruption is worse
    assert s["run"] == "run-test"
    assert s["turns"] == {"total": 8, "ok": 6, "good": 3, "killed": 1, "corrupt": 3, "error": 1}
    assert s["tool_calls"] == 7  # ok turns only: 2 + 0 + 2 + 1 + 1 + 1
    assert s["bad_tool_calls"] == 3  # tool_calls[0] and [1] of s1/2, tool_calls[0] of s2/1
    fired = {c: n for c, n in s["counts"].items() if n}
    assert fired == {"dsml_leak_content": 1, "args_not_json": 1, "schema_violation": 2, "http_error": 1}
    # Every known turn-level code is present, so readers never miss a key.
    assert set(s["counts"]) == {*CORRUPTION_CODES, *AVAILABILITY_CODES, *EVIDENCE_CODES}
    assert s["rates"]["schema_violation"] == {"per_turn": pytest.approx(2 / 6), "per_tool_call": pytest.approx(2 / 7)}
    assert s["rates"]["http_error"] == {"per_turn": pytest.approx(1 / 7), "per_tool_call": None}
    assert s["corrupt_rate"] == pytest.approx(0.5)
    assert s["by_depth"] == {
        "0": {"total": 3, "ok": 2, "good": 2, "killed": 0, "corrupt": 0, "error": 1},
        "1": {"total": 3, "ok": 3, "good": 1, "killed": 0, "corrupt": 2, "error": 0},
        "2": {"total": 2, "ok": 1, "good": 0, "killed": 1, "corrupt": 1, "error": 0},
    }
    assert s["by_scenario"] == {
        "coding": {"total": 3, "ok": 3, "good": 1, "killed": 0, "corrupt": 2, "error": 0},
        "sql": {"total": 5, "ok": 3, "good": 2, "killed": 1, "corrupt": 1, "error": 1},
    }
    assert s["sessions"] == {"count": 3, "finished": 1, "ended_by": {"final": 1, "killed": 1}}
    assert s["events"] == {"kill": 1, "run_end": 1, "run_start": 1, "session_end": 2}
    assert s["latency"]["ttft_s"]["p50"] == pytest.approx(0.35)
    assert s["latency"]["e2e_s"]["p90"] == pytest.approx(5.5)
    assert s["latency"]["itl_s"] == {
        "p50": pytest.approx(0.02),
        "p90": pytest.approx(0.02),
        "p99": pytest.approx(0.02),
        "max": pytest.approx(0.02),
        "n": 6,
    }
    assert s["latency"]["e2e_s"]["n"] == 6  # killed and error turns have no latency sample


def test_summary_is_plain_json(corruption_run: Path) -> None:
    s = summarize(read_history(corruption_run))
    assert json.loads(json.dumps(s)) == s


def test_killed_turns_are_never_corrupt(run_folder, make_turn) -> None:
    turns = [
        make_turn("s1", 0),
        make_turn("s1", 1, status="killed", verdicts=[("truncated", ""), ("dsml_leak_content", "content")]),
    ]
    s = summarize(read_history(run_folder(turns)))
    assert s["verdict"] == "CLEAN"
    assert s["turns"]["killed"] == 1 and s["turns"]["corrupt"] == 0
    assert s["counts"]["truncated"] == 0 and s["counts"]["dsml_leak_content"] == 0
    assert s["by_depth"]["1"]["corrupt"] == 0


def test_errors_only(run_folder, make_turn) -> None:
    turns = [
        make_turn("s1", 0),
        make_turn("s1", 1, status="error", verdicts=[("http_error", "")], error="503"),
        make_turn("s2", 0, status="timeout", verdicts=[("timeout_ttft", "")], ttft_s=None, e2e_s=None),
    ]
    s = summarize(read_history(run_folder(turns)))
    assert s["verdict"] == "ERRORS"
    assert s["turns"] == {"total": 3, "ok": 1, "good": 1, "killed": 0, "corrupt": 0, "error": 2}
    assert s["counts"]["http_error"] == 1 and s["counts"]["timeout_ttft"] == 1


def test_wedge_wins_over_corruption(run_folder, make_turn) -> None:
    run = {
        "run": "w",
        "wedge": {
            "decode": {"codes": ["queue_stuck"], "gauges": {"transfer_q": 60}},
            "prefill": {"codes": [], "gauges": {"bootstrap_q": 0}},
        },
    }
    turns = [make_turn("s1", 0, verdicts=[("args_not_json", "tool_calls[0].arguments")])]
    s = summarize(read_history(run_folder(turns, run=run)))
    assert s["verdict"] == "WEDGE"
    assert s["wedge"]["decode"] == {"codes": ["queue_stuck"], "gauges": {"transfer_q": 60}}
    assert s["turns"]["corrupt"] == 1


def test_wedge_without_codes_is_not_a_wedge(run_folder, make_turn) -> None:
    run = {"run": "w", "wedge": {"decode": {"codes": [], "gauges": {"transfer_q": 0}}}}
    s = summarize(read_history(run_folder([make_turn()], run=run)))
    assert s["verdict"] == "CLEAN"


def test_partial_history_with_torn_line(run_folder, make_turn) -> None:
    turns = [make_turn("s1", 0, start_s=1, e2e_s=2.0), make_turn("s1", 1, start_s=4, e2e_s=3.5)]
    s = summarize(read_history(run_folder(turns, duration_s=None, torn_line=True)))
    assert s["partial"] is True
    assert s["skipped_lines"] == 1
    assert s["turns"]["total"] == 2
    assert s["duration_s"] == pytest.approx(7.5)  # run_start to the end of the last recorded turn


def test_empty_history(run_folder) -> None:
    s = summarize(read_history(run_folder([], duration_s=None)))
    assert s["verdict"] == "CLEAN"
    assert s["turns"] == {"total": 0, "ok": 0, "good": 0, "killed": 0, "corrupt": 0, "error": 0}
    assert s["corrupt_rate"] is None and s["by_depth"] == {}
    assert s["latency"]["ttft_s"] == {"p50": None, "p90": None, "p99": None, "max": None, "n": 0}
    assert all(r == {"per_turn": None, "per_tool_call": None} for r in s["rates"].values())


def test_check_errors_counted_per_turn(run_folder, make_turn) -> None:
    turns = [make_turn("s1", 0, check_errors=["schema: boom", "dsml: boom"]), make_turn("s1", 1)]
    assert summarize(read_history(run_folder(turns)))["check_errors"] == 1


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([float(x) for x in range(1, 11)], 50, 5.5),
        ([float(x) for x in range(1, 11)], 90, 9.1),
        ([float(x) for x in range(1, 11)], 99, 9.91),
        ([15.0, 20.0, 35.0, 40.0, 50.0], 40, 29.0),  # numpy.percentile's default gives the same
        ([3.0, 1.0, 2.0], 0, 1.0),
        ([3.0, 1.0, 2.0], 100, 3.0),
        ([4.0], 99, 4.0),
    ],
)
def test_percentile_linear(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_empty() -> None:
    assert percentile([], 50) is None
    assert distribution([])["n"] == 0
