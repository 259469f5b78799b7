"""--slo: the spec's parser, each turn's judgement against the targets, and the figures over a
window, on literal turns (report/slo.py; docs/slo.md)."""

from __future__ import annotations

import pytest

from dsv4bench.history.records import TurnRecord
from dsv4bench.report.slo import (
    Outcome,
    SloError,
    SloTally,
    SloTargets,
    mean_itl_s,
    missed_targets,
    outcome,
    run_slo,
    slo_figures,
)

from .conftest import _make_turn


def turn(*, tokens: int | None = 10, **kw) -> TurnRecord:
    t = _make_turn(**kw)
    if t.response is not None and tokens is not None:
        t.response.usage = {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens}
    return t


# ---- the parser -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("ttft=2s,itl=100ms,e2e=60s", SloTargets(2.0, 0.1, 60.0)),
        ("itl=100ms", SloTargets(itl_s=0.1)),
        ("e2e=1.5", SloTargets(e2e_s=1.5)),  # a plain number is seconds
        (" TTFT = 250ms , ", SloTargets(ttft_s=0.25)),  # spaces, case, an empty part
        ("ttft=.5s,e2e=2e3ms", SloTargets(ttft_s=0.5, e2e_s=2.0)),
    ],
)
def test_good_specs_read_in_seconds(spec: str, want: SloTargets) -> None:
    assert SloTargets.parse(spec) == want


def test_a_spec_is_written_back_in_the_unit_that_reads_best_and_reads_back_the_same() -> None:
    targets = SloTargets.parse("e2e=60,ttft=2000ms,itl=0.1s")
    assert targets.spec == "ttft=2s,itl=100ms,e2e=60s"
    assert SloTargets.parse(targets.spec) == targets
    precise = SloTargets.parse("ttft=1.2345678s,itl=12.345678ms")
    assert SloTargets.parse(precise.spec) == precise  # no digit a user gave is rounded away


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("tpot=100ms", "unknown target 'tpot'"),
        ("ttft=2min", "unknown unit 'min'"),
        ("ttft=-2s", "must be positive"),
        ("ttft=0ms", "must be positive"),
        ("ttft=2s,ttft=3s", "ttft is given twice"),
        ("ttft", "write TARGET=VALUE"),
        ("ttft=", "write TARGET=VALUE"),
        ("ttft=fast", "is not a number with a unit"),
        ("ttft=1e999s", "positive and finite"),
        (",", "names no target"),
    ],
)
def test_bad_specs_are_one_line_naming_the_bad_part(spec: str, names: str) -> None:
    with pytest.raises(SloError) as e:
        SloTargets.parse(spec)
    assert names in str(e.value) and "\n" not in str(e.value)


# ---- one turn ---------------------------------------------------------------------------------

TARGETS = SloTargets(ttft_s=0.5, itl_s=0.05, e2e_s=2.0)


def test_exactly_at_a_target_meets_it_and_just_over_misses() -> None:
    at = turn(ttft_s=0.5, e2e_s=2.0, gaps_ms=[40.0, 60.0])  # mean gap 50 ms
    assert missed_targets(at, TARGETS) == [] and outcome(at, TARGETS) is Outcome.MET
    over = turn(ttft_s=0.501, e2e_s=2.001, gaps_ms=[40.0, 60.2])
    assert missed_targets(over, TARGETS) == ["ttft", "itl", "e2e"] and outcome(over, TARGETS) is Outcome.MISSED


def test_itl_is_judged_on_the_turns_mean_gap_not_its_slowest() -> None:
    one_slow_gap = turn(gaps_ms=[10.0, 10.0, 10.0, 150.0])  # mean 45 ms, one gap of 150 ms
    assert mean_itl_s(one_slow_gap) == pytest.approx(0.045)
    assert outcome(one_slow_gap, TARGETS) is Outcome.MET
    assert outcome(turn(gaps_ms=[60.0, 60.0]), TARGETS) is Outcome.MISSED


def test_a_turn_with_no_gap_meets_itl_but_is_still_held_to_ttft_and_e2e() -> None:
    one_token = turn(gaps_ms=[])
    assert mean_itl_s(one_token) is None and outcome(one_token, TARGETS) is Outcome.MET
    assert missed_targets(turn(gaps_ms=[], e2e_s=3.0), TARGETS) == ["e2e"]


def test_a_completed_turn_with_no_first_token_misses_ttft() -> None:
    assert missed_targets(turn(ttft_s=None), TARGETS) == ["ttft"]
    assert missed_targets(turn(ttft_s=None), SloTargets(e2e_s=2.0)) == []


def test_killed_unjudged_corrupt_and_failed_turns_are_never_good_whatever_their_timings() -> None:
    fast = {"ttft_s": 0.01, "e2e_s": 0.1, "gaps_ms": [1.0]}
    assert outcome(turn(status="killed", **fast), TARGETS) is Outcome.KILLED
    assert outcome(turn(check_errors=["args_not_json: boom"], **fast), TARGETS) is Outcome.UNJUDGED
    corrupt = turn(verdicts=[("args_not_json", "tool_calls[0].arguments")], **fast)
    assert outcome(corrupt, TARGETS) is Outcome.CORRUPT
    assert outcome(turn(status="error", error="HTTP 503", **fast), TARGETS) is Outcome.FAILED
    assert outcome(turn(status="timeout", error="no first token", **fast), TARGETS) is Outcome.FAILED
    # Evidence is no corruption: a turn that carries only evidence is judged on its timings.
    assert outcome(turn(verdicts=[("markup_unproven", "content")], **fast), TARGETS) is Outcome.MET


# ---- the figures ------------------------------------------------------------------------------


def test_figures_count_each_turn_once_and_leave_killed_and_unjudged_out() -> None:
    turns = [
        turn(ttft_s=0.1, tokens=30),  # met
        turn(ttft_s=0.2, tokens=None),  # met, its tokens unknown
        turn(ttft_s=0.9, tokens=500),  # missed ttft
        turn(ttft_s=0.9, e2e_s=5.0, tokens=500),  # missed ttft and e2e
        turn(verdicts=[("args_not_json", "tool_calls[0].arguments")], tokens=40),  # corrupt
        turn(status="error", error="HTTP 503"),  # failed
        turn(status="killed"),
        turn(check_errors=["x: y"]),
    ]
    f = slo_figures(turns, TARGETS, window_s=10.0)
    assert f["turns"] == 6 and f["good"] == 2 and f["share"] == pytest.approx(2 / 6)
    assert f["outcomes"] == {"met": 2, "missed": 2, "corrupt": 1, "failed": 1, "killed": 1, "unjudged": 1}
    assert f["missed"] == {"ttft": 2, "itl": 0, "e2e": 1}
    assert f["good_output_tokens"] == 30 and f["tokens_unknown"] == 1
    assert f["goodput_turns_per_s"] == pytest.approx(0.2) and f["goodput_tokens_per_s"] == pytest.approx(3.0)
    assert f["spec"] == "ttft=500ms,itl=50ms,e2e=2s" and f["window_s"] == 10.0


def test_no_window_no_rates_and_no_turns_no_share() -> None:
    f = slo_figures([], TARGETS, window_s=None)
    assert f["share"] is None and f["goodput_turns_per_s"] is None and f["goodput_tokens_per_s"] is None


def test_a_tally_fed_turn_by_turn_gives_the_figures_of_the_whole() -> None:
    turns = [turn(ttft_s=0.1 * i, tokens=i) for i in range(1, 9)]
    tally = SloTally(TARGETS)
    for t in turns:
        tally.add(t)
    assert tally.figures(4.0) == slo_figures(turns, TARGETS, 4.0)
    assert tally.good == 5 and tally.good_tokens == 15


def test_a_run_given_no_targets_has_no_block_and_a_hand_edited_one_says_why() -> None:
    assert run_slo({"config": {"slo": None}}, [turn()], 1.0) is None
    assert run_slo({}, [turn()], 1.0) is None
    assert run_slo({"config": {"slo": "ttft=1s"}}, [turn()], 1.0)["good"] == 1
    bad = run_slo({"config": {"slo": "ttft=soon"}}, [turn()], 1.0)
    assert bad is not None and bad["spec"] == "ttft=soon" and "not a number" in bad["error"]


# ---- summary.json and the report ----------------------------------------------------------------


def test_the_summary_and_report_give_the_figures_of_a_run_given_targets(run_folder) -> None:
    from dsv4bench.report import build_report

    turns = [
        turn(session="s1", turn=0, ttft_s=0.2, e2e_s=1.0, tokens=40),
        turn(session="s1", turn=1, ttft_s=0.8, e2e_s=1.0, tokens=60),  # ttft missed
        turn(session="s2", turn=0, status="killed"),
        turn(session="s2", turn=1, verdicts=[("args_not_json", "tool_calls[0].arguments")]),
    ]
    run = {"run": "run-test", "command": "dsv4bench agents", "config": {"slo": "ttft=500ms,e2e=2s"}}
    run_dir = run_folder(turns, run=run, duration_s=20.0)
    summary = build_report(run_dir)
    slo = summary["slo"]
    assert (slo["turns"], slo["good"], slo["good_output_tokens"]) == (3, 1, 40)
    assert slo["window_s"] == summary["duration_s"] == 20.0
    assert slo["goodput_turns_per_s"] == pytest.approx(0.05) and slo["goodput_tokens_per_s"] == pytest.approx(2.0)
    report = (run_dir / "report.md").read_text()
    assert "## Latency targets (--slo)" in report
    assert "| turns meeting every target | 1 of 3 (33.33%) | 0.05/s |" in report
    assert "| their output tokens | 40 | 2.00/s |" in report
    assert "1 turn missed a target (TTFT 1, E2E 0), 1 corrupt, 0 failed" in report


def test_a_run_given_no_targets_has_no_section(run_folder) -> None:
    from dsv4bench.report import build_report

    run_dir = run_folder([turn()])
    assert build_report(run_dir)["slo"] is None
    assert "Latency targets" not in (run_dir / "report.md").read_text()
