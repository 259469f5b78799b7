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


@pytest.mark.parametrize(
    "damage,why",
    [
        (lambda run: (run / "turns.jsonl").mkdir(), "turns.jsonl could not be read (Is a directory)"),
        (lambda run: (run / "turns.jsonl").symlink_to(run / "turns.jsonl"), "turns.jsonl could not be read (missing)"),
        (lambda run: None, "turns.jsonl could not be read (missing)"),
        (
            lambda run: (
                (run / "turns.jsonl").write_text("")
                or (run / "events.jsonl").unlink()
                or (run / "events.jsonl").mkdir()
            ),
            "events.jsonl could not be read (Is a directory)",
        ),
    ],
)
def test_a_history_file_that_cannot_be_opened_makes_the_rebuilt_verdict_incomplete(tmp_path, damage, why):
    run = _run_folder(tmp_path / "run")
    damage(run)
    r = invoke("report", str(run))
    assert r.exit_code == 0 and r.stdout.startswith("INCOMPLETE"), r.stdout + r.stderr
    assert json.loads((run / "summary.json").read_text())["history"]["gaps"] == [why]


def test_a_report_that_cannot_be_written_is_one_line_and_the_history_stands(tmp_path, monkeypatch, capsys):
    # Through the console entry point, where every command's end-of-run report lands (agents,
    # replay, sweep, proxy, report): a full disk or a read-only folder is one line, exit 2.
    import dsv4bench.report as report
    from dsv4bench.cli import main

    def refuse(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(report, "write_atomic", refuse)
    run = _run_folder(tmp_path / "run")
    (run / "turns.jsonl").write_text("")
    history = {name: (run / name).read_bytes() for name in ("run.json", "turns.jsonl", "events.jsonl")}
    monkeypatch.setattr("sys.argv", ["dsv4bench", "report", str(run)])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert (
        len(lines) == 1
        and lines[0].startswith("error: cannot write the report in")
        and "(No space left on device); the history is kept" in lines[0]
    ), lines
    assert "Traceback" not in lines[0]
    assert {name: (run / name).read_bytes() for name in history} == history


def _turn_record(**response):
    return {
        "run": "r",
        "session": "s0",
        "turn": 0,
        "scenario": "coding",
        "seed": 0,
        "status": "ok",
        "request": {"body": {"messages": [], "tools": [{"type": "function", "function": {"name": ["x"]}}]}},
        "response": {"content": "fine", "finish_reason": "stop", "stream": False, **response},
    }


@pytest.mark.parametrize(
    "bad", [{"tool_calls": [{"name": "f", "arguments": "{}"}]}, {"tool_calls": [{}]}, {"content": 5}]
)
def test_audit_of_a_turn_record_of_the_wrong_shape_says_which_line(tmp_path, bad):
    f = tmp_path / "turns.jsonl"
    f.write_text(json.dumps(_turn_record()) + "\n" + json.dumps(_turn_record(**bad)) + "\n")
    r = invoke("audit", str(f))
    assert "2 exchanges" in r.stdout  # the good line, whose tool's name is a list, was audited
    assert_one_line_exit_2(r, "1 of 2 lines could not be audited (first: line 2")


def test_audit_family_flag_decides_what_is_checked_and_refuses_an_unknown_one(tmp_path) -> None:
    """A capture from a gateway that renamed its model: --family names the family the answers are in."""
    import json as _json

    from typer.testing import CliRunner

    from dsv4bench.cli import app

    rec = {
        "request": {"model": "gateway-model", "messages": [{"role": "user", "content": "hi"}]},
        "response": {
            "id": "r1",
            "model": "gateway-model",
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Done.[INST]"}}
            ],
        },
    }
    capture = tmp_path / "cap.jsonl"
    capture.write_text(_json.dumps(rec) + "\n")
    runner = CliRunner()
    on_deepseek = runner.invoke(app, ["audit", str(capture), "--family", "deepseek-v4", "--fail-on", "corruption"])
    on_mistral = runner.invoke(app, ["audit", str(capture), "--family", "mistral", "--fail-on", "corruption"])
    assert on_deepseek.exit_code == 0, on_deepseek.output
    assert on_mistral.exit_code == 1 and "special_token_leak" in on_mistral.output
    bad = runner.invoke(app, ["audit", str(capture), "--family", "gpt-4o"])
    assert bad.exit_code == 2 and "--family must be" in bad.output and "Traceback" not in bad.output
