"""What to run next (dsv4bench/report/next_steps.py): each finding gives its command, every command
parses with the real command line's parser, a clean run suggests nothing, secrets never appear."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import typer.main

from dsv4bench.cli import app
from dsv4bench.report.next_steps import AGENTS_SWITCHES, SWEEP_TAKES, next_steps

CLI = typer.main.get_command(app)
COMMAND = (
    "dsv4bench agents --url http://127.0.0.1:30000/v1 --concurrency 60 --seed 7 --scenario coding "
    '--api-key "$DSV4BENCH_API_KEY" --kill frac=0.25/every=10s --out runs --fail-on corruption --no-stream'
)
CORRUPT = {"counts": {"dsml_leak_content": 3}, "wedge": {}}
CLEAN = {"counts": {"dsml_leak_content": 0, "http_error": 0}, "wedge": {}}


def run_json(command: str = COMMAND, **extra) -> dict:
    return {
        "command": command,
        "config": {"url": "http://127.0.0.1:30000/v1", "concurrency": 60, "raw": False, "recover_cmd": None},
        **extra,
    }


def parse(line: str) -> Any:
    """Parse one suggested command with the CLI's own parser (types, choices, required
    arguments), without running it."""
    words = shlex.split(line)
    assert words[0] == "dsv4bench"
    command = CLI.commands[words[1]]
    return command.make_context(words[1], words[2:])


def commands(steps) -> list[str]:
    return [line for s in steps for line in s.command.splitlines()]


def test_corruption_suggests_a_sweep_and_raw_with_the_runs_own_flags() -> None:
    steps = next_steps(run_json(), CORRUPT)
    lines = commands(steps)
    sweep = next(line for line in lines if line.startswith("dsv4bench sweep"))
    ctx = parse(sweep)
    assert ctx.params["concurrency"] == "1,15,30,60" and ctx.params["seed"] == 7 and ctx.params["scenario"] == "coding"
    assert ctx.params["stream"] is False and ctx.params["url"] == "http://127.0.0.1:30000/v1"
    raw = parse(next(line for line in lines if "--raw" in line))
    assert raw.params["raw"] is True and raw.params["seed"] == 7 and raw.params["concurrency"] == 60
    assert raw.params["kill"] == [] and raw.params["fail_on"] is None  # a look again, not the load again
    for line in lines:
        parse(line)


def test_a_run_already_raw_is_not_told_to_use_raw() -> None:
    run = run_json(COMMAND + " --raw")
    run["config"]["raw"] = True
    assert not any("--raw" in line for line in commands(next_steps(run, CORRUPT)) if "agents" in line)


def test_hicache_on_or_a_mismatch_suggests_a_reference_run() -> None:
    run = run_json(server={"server_info": {"enable_hierarchical_cache": True}})
    lines = [line for line in commands(next_steps(run, CORRUPT)) if "--temperature" in line]
    assert len(lines) == 2
    off, on = (parse(line) for line in lines)
    assert off.params["temperature"] == 0 and str(off.params["out_dir"]) == "runs/hicache-off"
    assert str(on.params["reference"]) == "runs/hicache-off" and on.params["seed"] == 7
    mismatch = {"counts": {"reference_mismatch": 2}, "wedge": {}}
    assert any("--reference" in line for line in commands(next_steps(run_json(), mismatch)))
    # HiCache off and no mismatch: no reference run.
    assert not any("--reference" in line for line in commands(next_steps(run_json(), CORRUPT)))


def test_a_wedge_suggests_probe_and_watch_on_the_deployment() -> None:
    run = run_json(
        server={
            "deployment": {
                "endpoints": [{"root": "http://10.0.0.1:8000"}, {"root": "http://10.0.0.2:30000"}],
            }
        }
    )
    wedged = {"counts": {}, "wedge": {"http://10.0.0.2:30000/metrics": {"codes": ["queue_stuck"]}}}
    lines = commands(next_steps(run, wedged))
    probe = parse(next(line for line in lines if line.startswith("dsv4bench probe")))
    assert probe.params["urls"] == ["http://10.0.0.1:8000", "http://10.0.0.2:30000"]
    assert probe.params["api_key"] == "$DSV4BENCH_API_KEY"
    watch = parse(next(line for line in lines if line.startswith("dsv4bench watch")))
    assert watch.params["metrics_url"] == ["http://10.0.0.1:8000/metrics", "http://10.0.0.2:30000/metrics"]


def test_a_poisoned_state_suggests_a_recover_cmd_once() -> None:
    run = run_json(persistence={"poisoned": True})
    line = next(line for line in commands(next_steps(run, CORRUPT)) if "--recover-cmd" in line)
    assert parse(line).params["recover_cmd"] == "<command that restarts the server>"
    run["config"]["recover_cmd"] = "systemctl restart sglang"
    assert not any("--recover-cmd" in line for line in commands(next_steps(run, CORRUPT)))


def test_a_clean_run_suggests_nothing() -> None:
    assert next_steps(run_json(), CLEAN) == []
    # Availability errors alone call for no corruption hunt either.
    assert next_steps(run_json(), {"counts": {"http_error": 4}, "wedge": {}}) == []


def test_a_run_without_an_agents_command_gets_only_what_needs_none() -> None:
    assert next_steps(run_json("dsv4bench locust --host http://x"), CORRUPT) == []
    assert next_steps({"command": None}, CORRUPT) == []
    assert next_steps(run_json("dsv4bench agents --replay cap --url http://x/v1"), CORRUPT) == []


@pytest.mark.parametrize(
    "secret_args",
    [
        ["--api-key", "sk-live-0123456789abcdef"],
        ["--api-key=sk-live-0123456789abcdef"],
        ["--engine-arg=--api-key=sk-live-0123456789abcdef"],
    ],
)
def test_secrets_never_appear_even_where_the_recorded_line_kept_one(secret_args) -> None:
    command = shlex.join(["dsv4bench", "agents", "--url", "http://user:hunter2pass@10.0.0.1:8000/v1", *secret_args])
    run = run_json(command, persistence={"poisoned": True}, server={"server_info": {"enable_hierarchical_cache": 1}})
    text = "\n".join(s.command for s in next_steps(run, {"counts": {"reference_mismatch": 1, "args_not_json": 1}}))
    assert text and "sk-live-0123456789abcdef" not in text and "hunter2pass" not in text


def test_the_flag_tables_match_the_command_line() -> None:
    agents = {o: p for p in CLI.commands["agents"].params for o in (*p.opts, *p.secondary_opts)}
    switches = {o for o, p in agents.items() if getattr(p, "is_flag", False)}
    assert AGENTS_SWITCHES == switches
    sweep = {o for p in CLI.commands["sweep"].params for o in (*p.opts, *p.secondary_opts)}
    assert SWEEP_TAKES <= sweep and SWEEP_TAKES <= set(agents)
