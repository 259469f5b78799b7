"""`dsv4bench locust` with flags that cannot work: one line on stderr, exit 2, before anything
starts (no engine, no Locust, no run folder). In-process: the CLI itself never imports Locust."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from dsv4bench.cli import app
from tests.cli_output import assert_one_line_exit_2
from dsv4bench.cli import locust as locust_cli

DEAD = "http://127.0.0.1:1/v1"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--host", "http://[::1"], "is not a valid URL"),
        (["--host", "ftp://x/v1"], "must be an http(s) URL"),
        (["--host", DEAD, "--max-turns", "0"], "--max-turns must be at least 1"),
        (["--host", DEAD, "--shape", "zigzag:users=3"], "zigzag"),
        (["--host", DEAD, "--kill", "all@5s"], "--kill"),
        (["--host", DEAD, "--shape", "kill-storm:users=8", "--kill", "all@5s,who=ttft"], "who=ttft"),
        (["--host", DEAD, "--engine-fault", "abort-leak"], "not with --host"),
        (["--engine-router", "nginx"], "--engine-router must be one of bundled, sglang"),
        (["--engine-fault", "no-such-fault"], "no-such-fault"),
        (["--worker", "--engine-pd"], "go to the master"),
        (["--worker", "--host", DEAD], "go to the master"),
        (["--host", DEAD, "--request-mix", "tool_choice=sometimes"], "--request-mix 'tool_choice=sometimes'"),
    ],
)
def test_bad_flags_are_one_line_before_anything_starts(tmp_path, args, needle):
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["locust", *args, "--out", str(out), "--headless"])
    assert_one_line_exit_2(result, needle)
    assert not out.exists() or not any(out.iterdir())


def test_the_request_mix_reaches_the_users_through_the_plan():
    """Each Locust user's sessions draw from the mix `dsv4bench locust --request-mix` was given."""
    import json

    from dsv4bench.harness.config import RunConfig
    from dsv4bench.locust.plan import Plan

    plan = Plan(config=RunConfig(url=DEAD, request_mix="frameworks;stop=none"), model="m", facts={}, command="")
    mix = Plan.from_json(json.loads(plan.to_arg())).session_config.request_mix
    assert mix is not None and dict(mix.weights)["stop"] == (("none", 1.0),) and "tool_choice" in mix.varies


def test_without_locust_installed_it_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "locust" else real(name, *a))
    assert_one_line_exit_2(CliRunner().invoke(app, ["locust", "--host", DEAD]), "pip install 'dsv4bench[locust]'")
    assert locust_cli.LOCUST_MISSING in CliRunner().invoke(app, ["locust", "--host", DEAD]).stderr
