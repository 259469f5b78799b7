"""`dsv4bench report` on run folders whose files cannot be opened or written: one line on
stderr, or a rebuilt verdict that says INCOMPLETE; never a traceback, never CLEAN."""

from __future__ import annotations

import json

import pytest

from tests.cli_output import assert_one_line_exit_2, invoke


def _run_folder(path):
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"run": "r", "command": "dsv4bench agents"}))
    (path / "events.jsonl").write_text(json.dumps({"t_wall_ns": 1, "t_ns": 1, "kind": "run_end"}) + "\n")
    return path


@pytest.mark.parametrize("damage,why", [
    (lambda run: (run / "turns.jsonl").mkdir(), "turns.jsonl could not be read (Is a directory)"),
    (lambda run: (run / "turns.jsonl").symlink_to(run / "turns.jsonl"), "turns.jsonl could not be read (missing)"),
    (lambda run: None, "turns.jsonl could not be read (missing)"),
    (lambda run: (run / "turns.jsonl").write_text("") or (run / "events.jsonl").unlink()
     or (run / "events.jsonl").mkdir(), "events.jsonl could not be read (Is a directory)"),
])
def test_a_history_file_that_cannot_be_opened_makes_the_rebuilt_verdict_incomplete(tmp_path, damage, why):
    run = _run_folder(tmp_path / "run")
    damage(run)
    r = invoke("report", str(run))
    assert r.exit_code == 0 and r.stdout.startswith("INCOMPLETE"), r.stdout + r.stderr
    assert json.loads((run / "summary.json").read_text())["history"]["gaps"] == [why]


def test_report_into_a_folder_it_cannot_write_is_one_line(tmp_path, monkeypatch):
    import dsv4bench.report as report

    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(report, "write_atomic", refuse)
    run = _run_folder(tmp_path / "run")
    (run / "turns.jsonl").write_text("")
    assert_one_line_exit_2(invoke("report", str(run)), "cannot write the rebuilt report (Permission denied)")


def _turn_record(**response):
    return {"run": "r", "session": "s0", "turn": 0, "scenario": "coding", "seed": 0, "status": "ok",
            "request": {"body": {"messages": [], "tools": [{"type": "function", "function": {"name": ["x"]}}]}},
            "response": {"content": "fine", "finish_reason": "stop", "stream": False, **response}}


@pytest.mark.parametrize("bad", [{"tool_calls": [{"name": "f", "arguments": "{}"}]}, {"tool_calls": [{}]},
                                 {"content": 5}])
def test_audit_of_a_turn_record_of_the_wrong_shape_says_which_line(tmp_path, bad):
    f = tmp_path / "turns.jsonl"
    f.write_text(json.dumps(_turn_record()) + "\n" + json.dumps(_turn_record(**bad)) + "\n")
    r = invoke("audit", str(f))
    assert "2 exchanges" in r.stdout  # the good line, whose tool's name is a list, was audited
    assert_one_line_exit_2(r, "1 of 2 lines could not be audited (first: line 2")
