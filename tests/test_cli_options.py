"""The load commands' flags declared once (dsv4bench/cli/options.py): one option object serves every
command that takes it, each default comes from the config it fills, no help text is written twice,
and each command's --help shows its panels."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from dsv4bench.cli import app
from dsv4bench.cli import agents as agents_cli
from dsv4bench.cli import locust as locust_cli
from dsv4bench.cli import options as opt
from dsv4bench.cli import sweep as sweep_cli
from dsv4bench.harness.config import RunConfig
from dsv4bench.modes.sweep import SweepPlan

CLI = Path(__file__).resolve().parents[1] / "dsv4bench" / "cli"
# The files of the load commands and the module that declares their shared flags.
LOAD_FILES = ("agents.py", "sweep.py", "locust.py", "options.py")
# every module of the command line: a help text written twice is one flag declared twice
ALL_CLI_FILES = tuple(sorted(p.name for p in CLI.glob("*.py")))
COMMANDS = {"agents": agents_cli.agents, "sweep": sweep_cli.sweep, "locust": locust_cli.locust}
REQUIRED_ARGS = {"sweep": ["--concurrency", "1"]}  # what a command cannot parse without

# A shared option, the commands that take it, a value to give it on the command line, and what the
# command must then receive.
SHARED = [
    ("max_turns", opt.MAX_TURNS, ("agents", "sweep", "locust"), ["--max-turns", "3"], 3),
    ("scenario", opt.SCENARIO, ("agents", "sweep"), ["--scenario", "ops"], "ops"),
    ("seed", opt.SEED, ("agents", "locust"), ["--seed", "7"], 7),
    ("thinking", opt.THINKING, ("agents", "sweep", "locust"), ["--thinking"], True),
    ("request_mix", opt.REQUEST_MIX, ("agents", "sweep", "locust"), ["--request-mix", "frameworks"], "frameworks"),
    ("stream", opt.STREAM, ("agents", "sweep"), ["--no-stream"], False),
    ("max_tokens", opt.MAX_TOKENS, ("agents", "sweep", "locust"), ["--max-tokens", "64"], 64),
    ("context_length", opt.CONTEXT_LENGTH, ("agents", "sweep"), ["--context-length", "4096"], 4096),
    ("temperature", opt.TEMPERATURE, ("agents", "sweep", "locust"), ["--temperature", "0.5"], 0.5),
    ("ttft_timeout", opt.TTFT_TIMEOUT, ("agents", "sweep", "locust"), ["--ttft-timeout", "5"], 5.0),
    ("total_timeout", opt.TOTAL_TIMEOUT, ("agents", "sweep", "locust"), ["--total-timeout", "9"], 9.0),
    ("on_corrupt", opt.ON_CORRUPT, ("agents", "sweep"), ["--on-corrupt", "stop"], "stop"),
    ("url", opt.URL, ("agents", "sweep"), ["--url", "http://127.0.0.1:9/v1"], "http://127.0.0.1:9/v1"),
    ("model", opt.MODEL, ("sweep", "locust"), ["--model", "m"], "m"),
    ("api_key", opt.API_KEY, ("agents", "sweep", "locust"), ["--api-key", "k"], "k"),
    ("metrics_interval", opt.METRICS_INTERVAL, ("agents", "locust"), ["--metrics-interval", "2"], 2.0),
    ("canary_timeout", opt.CANARY_TIMEOUT, ("agents", "locust"), ["--canary-timeout", "3"], 3.0),
    ("engine_arg", opt.ENGINE_ARG, ("agents", "sweep"), ["--engine-arg=--pd"], ["--pd"]),
    ("engine_fault", opt.ENGINE_FAULT, ("agents", "sweep"), ["--engine-fault", "x"], ["x"]),
    ("engine_pd", opt.ENGINE_PD, ("agents", "sweep"), ["--engine-pd"], True),
    ("engine_router", opt.ENGINE_ROUTER, ("agents", "sweep"), ["--engine-router", "sglang"], "sglang"),
]


def _parse(command: str, args: list[str]) -> dict:
    """The values a command receives for `args`, parsed as click does, without running it."""
    click_command = typer.main.get_command(app).commands[command]
    ctx = click_command.make_context(command, [*REQUIRED_ARGS.get(command, []), *args])
    return ctx.params


def _help(*command: str) -> str:
    """The command's --help, on a terminal wide enough that no help text wraps or is cut."""
    env = {**os.environ, "COLUMNS": "2000", "TERMINAL_WIDTH": "2000"}
    r = subprocess.run(
        [sys.executable, "-m", "dsv4bench", *command, "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("name,option,commands,args,value", SHARED, ids=[s[0] for s in SHARED])
def test_one_option_object_serves_every_command_and_each_parses_it(name, option, commands, args, value):
    for command in commands:
        # the very object of options.py is the parameter's default: the flag is declared once
        assert inspect.signature(COMMANDS[command]).parameters[name].default is option, command
        assert _parse(command, args)[name] == value, command
        # and typer left it as declared: the next command reads the same default and help
        assert _parse(command, [])[name] == (
            list(option.default) if isinstance(option.default, list) else option.default
        ), command


@pytest.mark.parametrize("command", ["agents", "sweep", "locust"])
def test_help_of_each_command_shows_the_shared_help(command):
    text = _help(command)
    shared = [option for _, option, commands, _, _ in SHARED if command in commands]
    assert shared
    for option in shared:
        shown = option.help.replace("\\[", "[")  # rich prints an escaped bracket as the bracket
        assert shown in text, shown


PANELS = {
    "agents": (opt.TARGET, opt.LOAD, opt.REPLAY, opt.CHECKS, opt.NEMESIS, opt.WEDGE_WATCH, opt.ENGINE, opt.OUTPUT),
    "sweep": (opt.SWEEP, opt.TARGET, opt.LOAD, opt.CHECKS, opt.WEDGE_WATCH, opt.ENGINE, opt.OUTPUT),
    "locust": (opt.TARGET, opt.LOAD, opt.CHECKS, opt.NEMESIS, opt.WEDGE_WATCH, opt.ENGINE, opt.OUTPUT),
}


@pytest.mark.parametrize("command", sorted(PANELS))
def test_help_is_grouped_into_panels_in_order(command):
    text = _help(command)
    titles = [line.split("─ ", 1)[1].split(" ─", 1)[0] for line in text.splitlines() if line.startswith("╭─ ")]
    # every flag but --help sits in a named panel; the generic one holds --help alone
    assert [t for t in titles if t != "Options"] == list(PANELS[command])
    click_command = typer.main.get_command(app).commands[command]
    assert all(getattr(p, "rich_help_panel", None) for p in click_command.params), [
        p.name for p in click_command.params if not getattr(p, "rich_help_panel", None)
    ]


def _help_strings(path: Path) -> list[tuple[str, int]]:
    return [
        (node.value.value, node.lineno)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.keyword) and node.arg == "help" and isinstance(node.value, ast.Constant)
    ]


def test_no_help_text_of_the_load_commands_is_written_twice():
    seen: dict[str, str] = {}
    for name in ALL_CLI_FILES:
        for text, line in _help_strings(CLI / name):
            assert text not in seen, f"{name}:{line} repeats the help of {seen[text]}: {text!r}"
            seen[text] = f"{name}:{line}"
    assert len(seen) > 20  # the walk found the flags it checks


def test_no_two_flags_of_a_load_command_render_the_same_help():
    # the f-string helps of options.py too: two flags saying the same thing would be one flag twice
    for command in COMMANDS:
        helps = [p.help for p in typer.main.get_command(app).commands[command].params if p.help]
        assert len(helps) == len(set(helps)), command


# Flags that fill a config field but whose default is not the field's: the flag is the text that
# becomes the field (--fail-on: parse_fail_on of None is ()), or the field has no default (--url).
NOT_FROM_CONFIG = {"url", "fail_on"}


def test_every_default_is_read_from_its_config():
    fields = {f.name: "RunConfig" for f in dataclasses.fields(RunConfig)}
    fields.update({f.name: "SweepPlan" for f in dataclasses.fields(SweepPlan) if f.name != "levels"})
    checked = 0
    for name in LOAD_FILES:
        source = (CLI / name).read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) in ("option", "opt.option", "typer.Option")):
                continue
            decls = [a.value for a in node.args[1:] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            field = decls[0].lstrip("-").split("/")[0].replace("-", "_") if decls else ""
            if field not in fields or field in NOT_FROM_CONFIG:
                continue
            default = ast.unparse(node.args[0])
            if default == "...":  # a required flag has no default (sweep's --concurrency: its levels)
                continue
            assert f"{fields[field]}.{field}" in default, f"{name}:{node.lineno}: --{field} defaults to {default}"
            checked += 1
    assert checked > 30
