"""Tools refuse bad arguments with ToolError, leave the world alone when they do, and never touch the host."""

from __future__ import annotations

import builtins
import io
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dsv4bench.agents import FAMILIES, play_expert
from dsv4bench.agents.base import ToolError

BAD: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "coding": [
        ("no_such_tool", {}),
        ("read_file", {}),  # missing required
        ("read_file", {"path": "nope.py"}),
        ("read_file", {"path": "README.md", "start_line": 0}),
        ("read_file", {"path": "README.md", "start_line": 9999}),
        ("read_file", {"path": "README.md", "start_line": 5, "end_line": 2}),
        ("read_file", {"path": "README.md", "bogus": 1}),  # additionalProperties
        ("list_dir", {"path": "nowhere"}),
        ("list_dir", {"path": "README.md"}),
        ("search_code", {"pattern": ""}),
        ("search_code", {"pattern": "def", "max_results": 1000}),
        ("search_code", {"pattern": "def", "case_sensitive": "yes"}),
        ("edit_file", {"path": "README.md", "edits": []}),
        ("edit_file", {"path": "README.md", "edits": [{"old": "no such text anywhere", "new": "x"}]}),
        ("edit_file", {"path": "README.md", "edits": [{"old": "`", "new": "x"}]}),  # ambiguous
        ("edit_file", {"path": "README.md", "edits": [{"old": "#", "new": "x", "extra": 1}]}),
        ("run_tests", {"names": ["test_does_not_exist"]}),
        ("run_tests", {"verbosity": "loud"}),
    ],
    "data": [
        ("describe_table", {"table": "nope"}),
        ("run_query", {"table": "orders", "columns": ["nope"]}),
        ("run_query", {"table": "orders", "limit": 0}),
        ("run_query", {"table": "orders", "limit": 201}),
        ("run_query", {"table": "orders", "where": [{"column": "region", "op": "~", "value": "North"}]}),
        ("run_query", {"table": "orders", "where": [{"column": "region", "op": "=", "value": 3}]}),
        ("run_query", {"table": "orders", "where": [{"column": "amount", "op": ">", "value": "lots"}]}),
        ("run_query", {"table": "orders", "order_by": {"column": "nope"}}),
        ("compute_aggregate", {"table": "orders", "column": "region", "function": "sum"}),
        ("compute_aggregate", {"table": "orders", "column": "amount", "function": "median"}),
        ("compute_aggregate", {"table": "orders", "column": "amount", "function": "sum", "group_by": "amount"}),
        ("write_report", {"title": "ok title", "findings": [{"metric": "m", "value": "1"}], "confidence": 0.5}),
        ("write_report", {"title": "ok title", "findings": [{"metric": "m", "value": 1}], "confidence": 1.5}),
    ],
    "ops": [
        ("get_logs", {"service": "nope", "level": "warn"}),
        ("get_logs", {"service": "nope", "level": "fatal"}),
        ("get_metrics", {"service": "x", "metric": "error_rate", "window_minutes": 1}),
        ("restart_service", {"service": "nope", "reason": "because"}),
        ("scale_service", {"service": "nope", "replicas": 3}),
        ("scale_service", {"service": "nope", "replicas": 21}),
        ("rollback_service", {"service": "nope", "version": "latest"}),
        ("open_incident", {"title": "title!", "severity": "sev0", "affected_services": ["a"], "summary": "s" * 20}),
        ("open_incident", {"title": "title!", "severity": "sev1", "affected_services": [], "summary": "s" * 20}),
        ("open_incident", {"title": "title!", "severity": "sev1", "affected_services": ["nope"], "summary": "s" * 20}),
    ],
}
CASES = [(n, tool, args) for n, cases in BAD.items() for tool, args in cases]


@pytest.mark.parametrize("name,tool,args", CASES, ids=[f"{n}.{t}.{i}" for i, (n, t, _) in enumerate(CASES)])
def test_bad_arguments_raise_tool_error_and_change_nothing(name: str, tool: str, args: dict[str, Any]) -> None:
    world = FAMILIES[name].build_world(0)
    before = world.digest()
    with pytest.raises(ToolError):
        world.execute(tool, args)
    assert world.digest() == before


def test_ops_semantic_errors() -> None:
    world = FAMILIES["ops"].build_world(0)
    svc = next(iter(world.fleet.services.values()))  # type: ignore[attr-defined]  # World names only what every family's has
    for version in (svc["version"], "v0.0.1"):
        with pytest.raises(ToolError):
            world.execute("rollback_service", {"service": svc["name"], "version": version})


def test_non_object_arguments_are_refused() -> None:
    with pytest.raises(ToolError):
        FAMILIES["data"].build_world(0).execute("list_tables", ["not", "a", "dict"])  # type: ignore[arg-type]  # the wrong type is the test


def test_the_wrong_remediation_does_not_fix_the_fault() -> None:
    for seed in range(12):
        fam = FAMILIES["ops"]
        world = fam.build_world(seed)
        task = fam.make_task(world, seed)
        if task.goal["kind"] != "bad_deploy":
            continue
        world.execute("restart_service", {"service": task.goal["root"], "reason": "try a restart"})
        assert world.fleet.services[task.goal["root"]]["fault"] is not None  # type: ignore[attr-defined]  # World names only what every family's has
        return
    pytest.fail("no bad_deploy world in the first seeds")


def test_coding_bug_is_planted_once_and_fails_one_test() -> None:
    fam = FAMILIES["coding"]
    for seed in range(60):
        world = fam.build_world(seed)
        goal = fam.make_task(world, seed).goal
        assert world.files[goal["module"]].count(goal["bug_line"]) == 1  # type: ignore[attr-defined]  # World names only what every family's has
        out = world.execute("run_tests", {"verbosity": "quiet"})
        assert "1 failed" in out and goal["test"] in out


def _forbidden(*_: Any, **__: Any) -> Any:
    raise AssertionError("a tool touched the host")


def test_tools_touch_nothing_on_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FAMILIES:  # warm up imports and caches before the host is walled off
        play_expert(name, 0)
    monkeypatch.chdir(tmp_path)
    for target, attr in (
        (builtins, "open"),
        (io, "open"),
        (os, "open"),
        (os, "system"),
        (os, "remove"),
        (os, "mkdir"),
        (subprocess, "Popen"),
        (socket, "socket"),
        (socket, "create_connection"),
    ):
        monkeypatch.setattr(target, attr, _forbidden)
    for name in FAMILIES:
        for seed in range(3):
            s = play_expert(name, seed)
            assert s.final
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def _ops_world(kind: str) -> tuple[Any, dict[str, Any]]:
    fam = FAMILIES["ops"]
    for seed in range(40):
        world = fam.build_world(seed)
        goal = fam.make_task(world, seed).goal
        if goal["kind"] == kind:
            return world, goal
    raise AssertionError(f"no {kind} world in the first seeds")


def test_a_deadlock_needs_a_forced_restart() -> None:
    world, goal = _ops_world("dependency")
    root = world.fleet.services[goal["root"]]
    world.execute("restart_service", {"service": goal["symptom"], "reason": "restart the victim"})
    out = world.execute("restart_service", {"service": goal["root"], "reason": "unstick it"})
    assert "force=true" in out and root["fault"] is not None
    world.execute("restart_service", {"service": goal["root"], "reason": "unstick it", "force": True})
    assert root["fault"] is None and world.fleet.services[goal["symptom"]]["status"] == "healthy"


def test_a_spike_needs_enough_replicas() -> None:
    world, goal = _ops_world("traffic_spike")
    svc = world.fleet.services[goal["root"]]
    world.execute("scale_service", {"service": goal["root"], "replicas": svc["replicas"] + 1})
    assert svc["fault"] is not None
    world.execute("scale_service", {"service": goal["root"], "replicas": 20})
    assert svc["fault"] is None


def test_remediation_moves_the_clock_and_shows_recovery() -> None:
    world, goal = _ops_world("memory_leak")
    before = world.execute("get_metrics", {"service": goal["root"], "metric": "error_rate", "window_minutes": 5})
    world.execute("restart_service", {"service": goal["root"], "reason": "oom"})
    after = world.execute("get_metrics", {"service": goal["root"], "metric": "error_rate", "window_minutes": 5})
    assert world.fleet.elapsed == 2 and _last(after) < 2 < _last(before)


def _last(metrics: str) -> float:
    """The `last` value of a get_metrics summary."""
    return float(metrics.rsplit("last ", 1)[1])


FUZZ: list[Any] = [
    None,
    -1,
    0,
    1,
    10**12,
    2.5,
    float("nan"),
    True,
    "",
    " ",
    "x" * 5000,
    "../../etc/passwd",
    "*",
    "[",
    "\x00",
    [],
    [None],
    ["x"],
    {},
    {"old": "a", "new": "b"},
    [{"column": "month", "op": ">", "value": 1}],
    [{"old": "", "new": ""}],
]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fuzzed_arguments_give_a_result_or_a_tool_error(name: str) -> None:
    """Mutating one argument of each expert call at a time never crashes a tool with anything but ToolError."""
    fam = FAMILIES[name]
    for seed in range(2):
        world = fam.build_world(seed)  # NOTE: shared on purpose: calls also meet states earlier calls left
        for obs in play_expert(fam, seed).observations:
            variants = [{k: v for k, v in obs.action.arguments.items() if k != drop} for drop in obs.action.arguments]
            for key in [*obs.action.arguments, "extra"]:
                variants += [{**obs.action.arguments, key: value} for value in FUZZ]
            for args in variants:
                try:
                    assert isinstance(world.execute(obs.action.name, args), str)
                except ToolError:
                    pass
