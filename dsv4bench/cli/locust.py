"""`dsv4bench locust`: the agent sessions as Locust users, in Locust's web UI, headless, or over
Locust's master and workers. Our flags make the run's plan; every other flag is Locust's own and
passes through (`--users`, `--spawn-rate`, `--run-time`, `--headless`, `--master`, `--worker`,
`--master-host`, `--expect-workers`, `--web-port`, `--autostart`, ...).

This process never runs gevent: it starts the bundled engine when no --host is given (not for
a worker, which plays its master's plan), writes the plan, and runs Locust as a child process
with dsv4bench/locust/locustfile.py; Locust's exit code is its own. Every test Locust runs
writes a run folder under --out, and its verdict line is printed at the end.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from dsv4bench.harness.config import ConfigError, RunConfig, check_out_dir, parse_fail_on
from dsv4bench.history.run_folder import SUMMARY_FILE
from dsv4bench.locust.plan import API_KEY_ENV, PLAN_ARG, Plan
from dsv4bench.servers.preflight import HostLimitError, ensure_open_files
from dsv4bench.history.redact import redact_argv, shell_line
from dsv4bench.cli.common import REQUEST_MIX_HELP, app, err, fail, print_verdict
from dsv4bench.cli.target import BUNDLED_PLACEHOLDER_URL, engine_args, open_target

LOCUSTFILE = Path(__file__).resolve().parent.parent / "locust" / "locustfile.py"
LOCUST_MISSING = "Locust mode needs Locust: pip install 'dsv4bench[locust]'"
LOOPBACK = "127.0.0.1"
# Where Locust would listen on every interface unless told: ours bind to loopback by default.
_BIND_FLAGS = {"--web-host": LOOPBACK, "--master-bind-host": LOOPBACK}


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def locust(
    ctx: typer.Context,
    host: Optional[str] = typer.Option(None, "--host", "-H", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1. Default: the bundled engine, started on loopback (not for --worker)."),
    scenario: str = typer.Option(RunConfig.scenario, help="Scenario family: coding, data, ops, or mixed (round robin); the web UI may change it per test."),
    seed: int = typer.Option(RunConfig.seed, help="Run seed; the same seed replays the same tasks."),
    max_turns: int = typer.Option(RunConfig.max_turns, help="Turns per session before it is cut off."),
    thinking: bool = typer.Option(RunConfig.thinking, "--thinking/--no-thinking", help="Ask for thinking mode (chat_template_kwargs)."),
    request_mix: Optional[str] = typer.Option(RunConfig.request_mix, "--request-mix", metavar="MIX", help=REQUEST_MIX_HELP),
    max_tokens: int = typer.Option(RunConfig.max_tokens, help="max_tokens of each turn."),
    temperature: float = typer.Option(RunConfig.temperature, help="Sampling temperature."),
    ttft_timeout: float = typer.Option(RunConfig.ttft_timeout, help="Seconds to the first token before a turn is timeout_ttft."),
    total_timeout: float = typer.Option(RunConfig.total_timeout, help="Seconds to the end of a turn before it is timeout_total."),
    model: Optional[str] = typer.Option(RunConfig.model, help="Model name; default: the first id of /v1/models."),
    api_key: Optional[str] = typer.Option(RunConfig.api_key, envvar=API_KEY_ENV, help="Bearer token for the server."),
    out_dir: Path = typer.Option(RunConfig.out, "--out", help="Folder under which each test's run folder is created."),
    fail_on: Optional[str] = typer.Option(None, help="Exit 1 when the last test's verdict is one of: corruption,errors,wedge (and on INCOMPLETE with any)."),
    metrics: list[str] = typer.Option(list(RunConfig.metrics), "--metrics", help="Prometheus /metrics URL to scrape during each test (repeatable). Default: the servers found from the target."),
    metrics_interval: float = typer.Option(RunConfig.metrics_interval, help="Seconds between scrapes of each --metrics URL."),
    drain_timeout: float = typer.Option(RunConfig.drain_timeout, help="Seconds to keep scraping after a test stops, waiting for the queues to drain."),
    canary_timeout: float = typer.Option(RunConfig.canary_timeout, help="Deadline of the one short completion sent after the drain window."),
    shape: Optional[str] = typer.Option(None, "--shape", metavar="SPEC", help="A load shape instead of --users/--spawn-rate: ramp:users=80,rate=10,duration=60s; step:users=80,step=10,every=10s,duration=120s; spike:users=10,peak=80,at=30s,hold=10s,duration=90s; kill-storm:users=80 (every user stopped at 20 s without --kill). Grammar: dsv4bench/locust/shapes.py."),
    kill: list[str] = typer.Option([], "--kill", metavar="SPEC", help="Kill schedule of the kill-storm shape, as `agents --kill` reads it: all@T stops every user abruptly and ends the test; frac=F/every=S (S at least 3s; /from= and /until= if wanted) drops that share of the users and brings new ones back. who= and abort are refused: Locust stops users by count."),
    engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra flag for the bundled engine (no --host), repeatable."),
    engine_fault: list[str] = typer.Option([], "--engine-fault", metavar="NAME", help="Switch on a planted fault in the bundled engine (no --host), repeatable."),
    engine_pd: bool = typer.Option(False, "--engine-pd", help="Run the bundled engine (no --host) prefill/decode disaggregated."),
    engine_router: str = typer.Option("bundled", "--engine-router", metavar="bundled|sglang", help="What fronts the bundled engine (no --host): its own server, or SGLang's router."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Say nothing of the engine's start or the deployment found."),
) -> None:
    """Agent sessions as Locust users: each user loop plays one whole multi-turn session, every
    turn checked and recorded; Locust's flags pass through (`dsv4bench locust --help-locust`
    lists them). The web UI binds to 127.0.0.1 unless --web-host says otherwise, and answers
    only its own page: other sites' requests are refused, the run's plan comes only from this
    command line, and the API key goes only to --host (a host changed in the UI runs without it)."""
    from dsv4bench.locust.shapes import KILL_ENV, SHAPE_ENV, check_shape  # Locust's own modules load only here

    if importlib.util.find_spec("locust") is None:
        raise fail(LOCUST_MISSING)
    locust_args = list(ctx.args)
    if "--help-locust" in locust_args:
        raise typer.Exit(subprocess.call([sys.executable, "-m", "locust", "--help"]))
    worker = "--worker" in locust_args
    try:
        config = RunConfig(
            url=host or BUNDLED_PLACEHOLDER_URL, scenario=scenario, seed=seed, max_turns=max_turns, thinking=thinking, request_mix=request_mix,
            max_tokens=max_tokens, temperature=temperature, ttft_timeout=ttft_timeout, total_timeout=total_timeout,
            model=model, api_key=api_key, out=out_dir, fail_on=parse_fail_on(fail_on), metrics=tuple(metrics),
            metrics_interval=metrics_interval, kill=tuple(kill), drain_timeout=drain_timeout,
            canary_timeout=canary_timeout, quiet=quiet,
            # the key goes to the servers named here, not to workers discovery finds behind them
            key_hosts=(host, *metrics) if host is not None else (),
        )
        check_shape(shape, tuple(kill))
        if not worker:
            check_out_dir(out_dir)
        ensure_open_files(64)
        engine = engine_args(host is not None, engine_arg, engine_fault, engine_pd, engine_router, "--host")
        if worker and (engine or engine_router != "bundled" or host or shape or kill):
            raise ConfigError("a --worker plays its master's plan: --host, --shape, --kill and --engine-* go to the master")
    except (ConfigError, HostLimitError) as e:
        raise fail(str(e))
    env = dict(os.environ)
    if api_key:
        env[API_KEY_ENV] = api_key
    env.pop(SHAPE_ENV, None)  # one left in the shell must not shape this run
    env.pop(KILL_ENV, None)
    if shape and not worker:  # the master plays the shape; its workers follow its counts
        env[SHAPE_ENV] = shape
        env[KILL_ENV] = "\n".join(kill)
    if worker:  # it plays what its master says: no engine, no plan of its own
        raise typer.Exit(_run_locust(locust_args, env))
    target = open_target(config, host is not None, engine, engine_router, quiet)
    try:
        model_name = config.model or (target.facts.get("models") or ["default"])[0]
        plan = Plan(dataclasses.replace(target.config, model=model_name), model_name, target.facts,
                    shell_line(["dsv4bench", "locust", *redact_argv(sys.argv[2:])]))
        before = _run_folders(out_dir)
        code = _run_locust(["--host", plan.config.url, PLAN_ARG, plan.to_arg(), "--scenario", scenario,
                            "--max-turns", str(max_turns), "--thinking", "true" if thinking else "false",
                            "--seed", str(seed), *_loopback_defaults(locust_args), *locust_args], env)
    finally:
        target.stop()
    for run_dir in sorted(_run_folders(out_dir) - before):
        try:
            summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            err.print(f"{run_dir}: no report (the test did not finish); `dsv4bench report {run_dir}` builds one",
                      highlight=False, soft_wrap=True)
            continue
        print_verdict(summary, run_dir)
    raise typer.Exit(code)


def _loopback_defaults(args: list[str]) -> list[str]:
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    return [x for flag, value in _BIND_FLAGS.items() if flag not in given for x in (flag, value)]


def _run_folders(out_dir: Path) -> set[Path]:
    try:
        return {p for p in out_dir.iterdir() if p.is_dir() and "-locust-" in p.name}
    except OSError:
        return set()


def _run_locust(args: list[str], env: dict[str, str]) -> int:
    """Locust in the foreground; Ctrl-C and SIGTERM reach it, and it ends its test first. It dies
    with this process (SIGTERM, even when this one is SIGKILLed), so no Locust outlives us."""
    from dsv4bench.engine.launcher import spawn_child

    proc = spawn_child([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args], env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                continue  # Locust got the same Ctrl-C (one process group) and is finishing
    finally:
        signal.signal(signal.SIGTERM, previous)
