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
from dsv4bench.cli import options as opt
from dsv4bench.cli.common import app, err, fail, print_verdict
from dsv4bench.cli.target import BUNDLED_PLACEHOLDER_URL, engine_args, open_target

LOCUSTFILE = Path(__file__).resolve().parent.parent / "locust" / "locustfile.py"
LOCUST_MISSING = "Locust mode needs Locust: pip install 'dsv4bench[locust]'"
LOOPBACK = "127.0.0.1"
# Where Locust would listen on every interface unless told: ours bind to loopback by default.
_BIND_FLAGS = {"--web-host": LOOPBACK, "--master-bind-host": LOOPBACK}


# The bundled engine's flags name --host, locust's server flag, as the one they do not go with.
_ENGINE_ARG, _ENGINE_FAULT, _ENGINE_PD, _ENGINE_ROUTER = opt.engine_options("--host")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def locust(
    ctx: typer.Context,
    # Locust's own --host (and its -H), passed on to Locust; a --worker takes its master's, so it is
    # not agents' --url under another name
    host: Optional[str] = opt.option(
        None,
        "--host",
        "-H",
        panel=opt.TARGET,
        help=(
            "OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1. Default: the bundled engine, started on "
            "loopback (not for --worker)."
        ),
    ),
    model: Optional[str] = opt.MODEL,
    api_key: Optional[str] = opt.API_KEY,
    scenario: str = opt.option(
        RunConfig.scenario, "--scenario", panel=opt.LOAD, help=f"{opt.SCENARIO_HELP} The web UI may change it per test."
    ),
    seed: int = opt.SEED,
    max_turns: Optional[int] = opt.MAX_TURNS,
    context: str = opt.CONTEXT,
    thinking: bool = opt.THINKING,
    request_mix: Optional[str] = opt.REQUEST_MIX,
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    shape: Optional[str] = opt.option(
        None,
        "--shape",
        panel=opt.LOAD,
        metavar="SPEC",
        help=(
            "A load shape instead of --users/--spawn-rate: ramp:users=80,rate=10,duration=60s; "
            "step:users=80,step=10,every=10s,duration=120s; spike:users=10,peak=80,at=30s,hold=10s,duration=90s; "
            "kill-storm:users=80 (every user stopped at 20 s without --kill). Grammar: dsv4bench/locust/shapes.py."
        ),
    ),
    ttft_timeout: float = opt.TTFT_TIMEOUT,
    total_timeout: float = opt.TOTAL_TIMEOUT,
    slo: Optional[str] = opt.SLO,
    # Locust stops users by count: its --kill is the kill-storm shape's schedule, not agents' session picker
    kill: list[str] = opt.option(
        list(RunConfig.kill),
        "--kill",
        panel=opt.NEMESIS,
        metavar="SPEC",
        help=(
            "Kill schedule of the kill-storm shape, as `agents --kill` reads it: all@T stops every user abruptly and "
            "ends the test; frac=F/every=S (S at least 3s; /from= and /until= if wanted) drops that share of the "
            "users and brings new ones back. who= and abort are refused: Locust stops users by count."
        ),
    ),
    metrics: list[str] = opt.metrics("each test"),
    metrics_interval: float = opt.METRICS_INTERVAL,
    drain_timeout: float = opt.drain_timeout("a test stops"),
    canary_timeout: float = opt.CANARY_TIMEOUT,
    engine_arg: list[str] = _ENGINE_ARG,
    engine_fault: list[str] = _ENGINE_FAULT,
    engine_pd: bool = _ENGINE_PD,
    engine_router: str = _ENGINE_ROUTER,
    out_dir: Path = opt.out_dir("each test's run folder"),
    fail_on: Optional[str] = opt.fail_on("when the last test's verdict is one of"),
    quiet: bool = opt.quiet("Say nothing of the engine's start or the deployment found."),
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
            url=host or BUNDLED_PLACEHOLDER_URL,
            scenario=scenario,
            seed=seed,
            max_turns=max_turns,
            context=context,
            thinking=thinking,
            request_mix=request_mix,
            max_tokens=max_tokens,
            temperature=temperature,
            ttft_timeout=ttft_timeout,
            total_timeout=total_timeout,
            slo=slo,
            model=model,
            api_key=api_key,
            out=out_dir,
            fail_on=parse_fail_on(fail_on),
            metrics=tuple(metrics),
            metrics_interval=metrics_interval,
            kill=tuple(kill),
            drain_timeout=drain_timeout,
            canary_timeout=canary_timeout,
            quiet=quiet,
            # the key goes to the servers named here, not to workers discovery finds behind them
            key_hosts=(host, *metrics) if host is not None else (),
        )
        check_shape(shape, tuple(kill))
        if not worker:
            check_out_dir(out_dir)
        ensure_open_files(64)
        engine = engine_args(host is not None, engine_arg, engine_fault, engine_pd, engine_router, "--host")
        if worker and (engine or engine_router != "bundled" or host or shape or kill):
            raise ConfigError(
                "a --worker plays its master's plan: --host, --shape, --kill and --engine-* go to the master"
            )
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
        plan = Plan(
            dataclasses.replace(target.config, model=model_name),
            model_name,
            target.facts,
            shell_line(["dsv4bench", "locust", *redact_argv(sys.argv[2:])]),
        )
        before = _run_folders(out_dir)
        code = _run_locust(
            [
                "--host",
                plan.config.url,
                PLAN_ARG,
                plan.to_arg(),
                "--scenario",
                scenario,
                "--max-turns",
                str(plan.config.turns_per_session),
                "--thinking",
                "true" if thinking else "false",
                "--seed",
                str(seed),
                *_loopback_defaults(locust_args),
                *locust_args,
            ],
            env,
        )
    finally:
        target.stop()
    for run_dir in sorted(_run_folders(out_dir) - before):
        try:
            summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            err.print(
                f"{run_dir}: no report (the test did not finish); `dsv4bench report {run_dir}` builds one",
                highlight=False,
                soft_wrap=True,
            )
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
