"""Argument checks on literal turns: not JSON, unknown tool, schema violations."""

from __future__ import annotations

import json

import pytest

from dsv4bench.checks.arguments import check_args_not_json, check_schema_violation, check_unknown_tool, validator_for

from .turns import TOOLS, turn

GOOD_CALLS = [
    [("read_file", {"path": "src/main.py"})],
    [("read_file", {"path": "a.py", "max_lines": 50}), ("list_services", {})],
    [("edit_file", {"path": "a.py", "edits": [{"old": "x = 1", "new": "x = 2"}]})],
    [("run_shell", {"command": "pytest -q", "timeout_s": 30.5, "background": False})],
    [("set_log_level", {"service": "api", "level": "debug"})],
    [("list_services", "{}")],
    [("read_file", '{\n  "path": "日本語/ファイル.md"\n}')],
]


@pytest.mark.parametrize("calls", GOOD_CALLS)
def test_good_calls_pass_every_argument_check(calls: list) -> None:
    ctx = turn(calls=calls)
    assert check_args_not_json(ctx) == []
    assert check_unknown_tool(ctx) == []
    assert check_schema_violation(ctx) == []


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ("", "empty string"),
        ('{"path": "a.py"', "invalid JSON"),
        ('{"path": "a.py"}}', "invalid JSON"),
        ("{'path': 'a.py'}", "invalid JSON"),
        ('["a.py"]', "JSON list, not an object"),
        ('"a.py"', "JSON str, not an object"),
        ("42", "JSON int, not an object"),
        ("null", "JSON NoneType, not an object"),
        ('{"max_lines": NaN, "path": "a"}', "invalid JSON"),
        ('{"path": "a.py"} trailing', "invalid JSON"),
        ('{"path": ' + "[" * 50_000, "nested too deep"),
    ],
)
def test_args_not_json(arguments: str, reason: str) -> None:
    ctx = turn(calls=[("list_services", {}), ("read_file", arguments)])
    [v] = check_args_not_json(ctx)
    assert v.code == "args_not_json" and v.where == "tool_calls[1].arguments"
    assert reason in v.detail


def test_args_not_json_reports_each_bad_call() -> None:
    ctx = turn(calls=[("read_file", ""), ("read_file", {"path": "a"}), ("run_shell", "[1]")])
    assert [v.where for v in check_args_not_json(ctx)] == ["tool_calls[0].arguments", "tool_calls[2].arguments"]


@pytest.mark.parametrize(
    ("name", "tools"),
    [
        ("write_file", TOOLS),
        ("Read_File", TOOLS),
        ("read_file ", TOOLS),
        ("read_file", {}),
        ("<｜DSML｜invoke", TOOLS),
    ],
)
def test_unknown_tool(name: str, tools: dict) -> None:
    [v] = check_unknown_tool(turn(calls=[(name, {"path": "a"})], tools=tools))
    assert v.code == "unknown_tool" and v.where == "tool_calls[0].name"
    assert "was not offered" in v.detail


@pytest.mark.parametrize("name", [None, ""])
def test_missing_tool_name_is_unknown(name: str | None) -> None:
    [v] = check_unknown_tool(turn(calls=[(name, {"path": "a"})]))
    assert "no name" in v.detail


@pytest.mark.parametrize(
    ("name", "args", "paths"),
    [
        ("read_file", {}, ["$"]),  # required "path" missing
        ("read_file", {"path": 3}, ["$.path"]),
        ("read_file", {"path": "a", "max_lines": 0}, ["$.max_lines"]),
        ("read_file", {"path": "a", "max_lines": "10"}, ["$.max_lines"]),
        ("read_file", {"path": "a", "extra": True}, ["$"]),  # additionalProperties: false
        ("edit_file", {"path": "a", "edits": [{"old": "x", "new": 5}]}, ["$.edits[0].new"]),
        ("edit_file", {"path": "a", "edits": []}, ["$.edits"]),
        ("edit_file", {"path": "a", "edits": [{"old": "x", "new": "y"}, {"old": "z"}]}, ["$.edits[1]"]),
        ("run_shell", {"command": "ls", "background": "yes"}, ["$.background"]),
        ("run_shell", {"command": "ls", "timeout_s": 0}, ["$.timeout_s"]),
        ("set_log_level", {"service": "api", "level": "verbose"}, ["$.level"]),
    ],
)
def test_schema_violation_names_the_failing_path(name: str, args: dict, paths: list[str]) -> None:
    verdicts = check_schema_violation(turn(calls=[(name, args)]))
    assert [v.detail.split(": ")[1] for v in verdicts] == paths
    assert all(v.code == "schema_violation" and v.where == "tool_calls[0].arguments" for v in verdicts)
    assert all(v.detail.startswith(f"{name}: ") for v in verdicts)


def test_schema_violation_message_comes_from_the_validator() -> None:
    [v] = check_schema_violation(turn(calls=[("edit_file", {"path": "a", "edits": [{"old": "x", "new": 5}]})]))
    assert v.detail == "edit_file: $.edits[0].new: 5 is not of type 'string'"


def test_schema_violation_reports_every_error_bounded() -> None:
    edits = [{"old": i, "new": i} for i in range(5)]  # 10 errors
    verdicts = check_schema_violation(turn(calls=[("edit_file", {"path": 1, "edits": edits})]))
    assert len(verdicts) == 5
    assert "(+6 more errors)" in verdicts[-1].detail


def test_schema_violation_skips_what_other_checkers_own() -> None:
    ctx = turn(
        calls=[("write_file", {"x": 1}), ("read_file", "not json"), ("read_file", "[1]"), ("read_file", {"path": 1})]
    )
    [v] = check_schema_violation(ctx)
    assert v.where == "tool_calls[3].arguments"


def test_tool_offered_without_schema_accepts_any_object() -> None:
    assert check_schema_violation(turn(calls=[("free", {"a": 1})], tools={"free": {}})) == []


def test_validators_are_cached_by_canonical_schema() -> None:
    schema = TOOLS["read_file"]
    reordered = json.loads(json.dumps(schema, sort_keys=True))
    reordered = dict(reversed(list(reordered.items())))
    assert validator_for(schema) is validator_for(reordered)
