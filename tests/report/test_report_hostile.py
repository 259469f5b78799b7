"""`dsv4bench report` on histories damaged by hand or by another tool: a record of the wrong
shape is counted unreadable (so a finished run is INCOMPLETE, never CLEAN) instead of failing
wherever its value is first used, and a run.json that cannot be read is a gap too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bench.history.run_folder import read_history
from dsv4bench.report import build_report
from dsv4bench.report.summary import summarize


def _damage(run_dir: Path, path: tuple, value) -> None:
    """Set one field (a path of keys and indexes) of the first turn record to `value`."""
    lines = (run_dir / "turns.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    lines[0] = json.dumps(record)
    (run_dir / "turns.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "path,value",
    [
        (("turn",), "1"),  # sorted beside the other turns' ints
        (("turn",), 10**30),  # past any plot's axis
        (("scenario",), 5),
        (("session",), ["s1"]),
        (("request",), "body"),
        (("timings", "start_ns"), "x"),
        (("timings", "end_ns"), 2**64),  # no clock's stamp
        (("timings", "token_gaps_ms"), [float("nan")]),
        (("timings", "harness_stall_ms"), "slow"),
        (("verdicts", 0, "code"), 5),
        (("verdicts", 0, "where"), 0),
        (("raw_sse",), [5]),
        (("response", "content"), None),
        (("response", "tool_calls", 0, "name"), 7),
    ],
)
def test_a_wrongly_typed_turn_record_is_unreadable_and_the_run_incomplete(run_folder, make_turn, path, value):
    turns = [make_turn("s1", 0, verdicts=[("http_error", "")], raw_sse=["data: x"]), make_turn("s1", 1)]
    run_dir = run_folder(turns)
    _damage(run_dir, path, value)
    summary = build_report(run_dir)
    assert summary["verdict"] == "INCOMPLETE"
    assert summary["history"]["gaps"] == ["1 unreadable line(s) in turns.jsonl"]
    assert summary["turns"]["total"] == 1


def test_a_stage_stamped_just_before_the_turns_start_is_read_as_it_is(run_folder, make_turn):
    # An arrival stamp is the kernel's wall-clock stamp moved onto the monotonic clock: a wall
    # clock stepped meanwhile can put a loopback answer's first byte before the request's start.
    run_dir = run_folder([make_turn("s1", 0), make_turn("s1", 1)])
    lines = (run_dir / "turns.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["timings"]["first_byte_ns"] = record["timings"]["start_ns"] - 5_000
    lines[0] = json.dumps(record)
    (run_dir / "turns.jsonl").write_text("\n".join(lines) + "\n")
    summary = build_report(run_dir)
    assert summary["verdict"] == "CLEAN" and summary["turns"]["total"] == 2 and summary["history"]["gaps"] == []


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "null", ""])
def test_a_run_json_that_cannot_be_read_is_a_gap(run_folder, make_turn, text):
    run_dir = run_folder([make_turn()])
    (run_dir / "run.json").write_text(text)
    summary = build_report(run_dir)
    assert summary["verdict"] == "INCOMPLETE"  # its wedge findings may have said WEDGE
    assert summary["history"]["gaps"] == [
        "run.json could not be read: the run's settings and wedge findings are unknown"
    ]


@pytest.mark.parametrize(
    "finding",
    [
        {"codes": 5, "gauges": {}},
        {"codes": [{"a": 1}], "gauges": {}},
        {"codes": [], "gauges": [1]},
        {"codes": [], "gauges": {}, "details": 5},
        "queue_stuck",
    ],
)
def test_wedge_findings_of_the_wrong_shape_are_a_gap_never_a_crash(run_folder, make_turn, finding):
    run = {"run": "r", "wedge": {"http://d:1": finding, "http://p:1": {"codes": [], "gauges": {"q": 0}}}}
    summary = build_report(run_folder([make_turn()], run=run))
    assert summary["verdict"] == "INCOMPLETE"
    assert summary["history"]["gaps"] == ["run.json's wedge findings for http://d:1 cannot be read"]
    assert list(summary["wedge"]) == ["http://p:1"]


def test_events_with_odd_stamps_and_figures_do_not_stop_the_report(run_folder, make_turn, event):
    clock = event("harness_clock", 5.0, stalls="many", stalled_s=[1], longest_stall_s=0.5)
    run_dir = run_folder([make_turn()], events=[clock])
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    start = json.loads(lines[0])
    start["t_wall_ns"] = "yesterday"
    (run_dir / "events.jsonl").write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    summary = build_report(run_dir)
    assert summary["verdict"] == "CLEAN" and summary["duration_s"] is not None
    assert summary["harness"]["longest_stall_s"] == 0.5 and "stalls" not in summary["harness"]


def test_server_deployment_lists_of_the_wrong_type_are_read_as_empty(run_folder, make_turn):
    deployment = {"given": 5, "found_via": True, "endpoints": [{"root": "http://d:1", "role": "decode"}]}
    run_dir = run_folder([make_turn()], run={"run": "r", "server": {"deployment": deployment}})
    assert summarize(read_history(run_dir))["deployment"]["given"] == []
