"""`dsv4bench agents`, the main job: flags become one RunConfig, the bundled engine starts when
no --url is given, and run.py drives the run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from dsv4bench.harness.config import ConfigError, RunConfig, check_out_dir, parse_fail_on
from dsv4bench.servers.preflight import HostLimitError, ensure_open_files
from dsv4bench.history.redact import redact_argv, shell_line
from dsv4bench.history.verdict import exit_code
from dsv4bench.cli import options as opt
from dsv4bench.cli.common import app, err, fail, print_verdict
from dsv4bench.cli.target import BUNDLED_PLACEHOLDER_URL, engine_args, open_target

# Flags that shape the generated workload or watch the server around it: a replay sends the
# capture's own requests and only judges their answers, so none of them applies.
NOT_WITH_REPLAY = (
    "rate",
    "sessions",
    "duration",
    "max_turns",
    "context",
    "cache_pressure",
    "kv_pool_tokens",
    "scenario",
    "seed",
    "thinking",
    "request_mix",
    "stream",
    "max_tokens",
    "context_length",
    "temperature",
    "on_corrupt",
    "raw",
    "metrics",
    "metrics_interval",
    "kill",
    "drain_timeout",
    "serve_metrics",
    "canary_timeout",
    "recover_cmd",
    "persist_sessions",
)


@app.command()
def agents(
    ctx: typer.Context,
    url: Optional[str] = opt.URL,
    model: Optional[str] = opt.option(
        RunConfig.model,
        "--model",
        panel=opt.TARGET,
        help=(f"{opt.MODEL_HELP} (with --replay: the one each recorded request names)."),
    ),
    api_key: Optional[str] = opt.API_KEY,
    key_to_workers: bool = opt.option(
        RunConfig.key_to_workers,
        "--key-to-workers",
        panel=opt.TARGET,
        help=(
            "Send --api-key to the servers found behind a router (its /workers) too; by default it goes only to "
            "--url's and --metrics' hosts, since a router may list any host."
        ),
    ),
    concurrency: int = opt.option(
        RunConfig.concurrency,
        "--concurrency",
        panel=opt.LOAD,
        help="Sessions in flight at once (closed pool; with --rate, the cap).",
    ),
    rate: Optional[float] = opt.option(
        RunConfig.rate, "--rate", panel=opt.LOAD, help="Open model: new sessions per second, Poisson arrivals."
    ),
    # sessions and duration: sweep's count per batch, so each command words its own
    sessions: Optional[int] = opt.option(
        RunConfig.sessions,
        "--sessions",
        panel=opt.LOAD,
        help=(
            "Total sessions to run. With neither --sessions nor --duration: one whole session per --concurrency slot."
        ),
    ),
    duration: Optional[float] = opt.option(
        RunConfig.duration, "--duration", panel=opt.LOAD, help="Seconds to keep starting turns; in-flight turns finish."
    ),
    max_turns: Optional[int] = opt.MAX_TURNS,
    context: str = opt.CONTEXT,
    cache_pressure: Optional[float] = opt.CACHE_PRESSURE,
    kv_pool_tokens: Optional[int] = opt.KV_POOL_TOKENS,
    scenario: str = opt.SCENARIO,
    seed: int = opt.SEED,
    thinking: bool = opt.THINKING,
    request_mix: Optional[str] = opt.REQUEST_MIX,
    stream: bool = opt.STREAM,
    max_tokens: int = opt.MAX_TOKENS,
    context_length: Optional[int] = opt.CONTEXT_LENGTH,
    temperature: float = opt.TEMPERATURE,
    replay: Optional[Path] = opt.option(
        None,
        "--replay",
        panel=opt.REPLAY,
        metavar="CAPTURE",
        help=(
            "Send a capture's conversations again instead of generated sessions: the run folder of `dsv4bench proxy "
            "--capture`. Each session's recorded requests go out as recorded, one after the other, sessions side by "
            "side up to --concurrency, at the recorded pace (see --speed); every answer is checked, and with "
            "--reference CAPTURE compared with the recorded one. Not with the flags that make or watch sessions."
        ),
    ),
    # None, not "1": a --speed given without --replay is refused, so its absence must show
    speed: Optional[str] = opt.option(
        None,
        "--speed",
        panel=opt.REPLAY,
        metavar="X|max",
        help=(
            "With --replay: the recorded pace times X (2: twice as fast); 0 or max: each request as soon as its "
            "turn may go. Default 1."
        ),
    ),
    ttft_timeout: float = opt.TTFT_TIMEOUT,
    total_timeout: float = opt.TOTAL_TIMEOUT,
    slo: Optional[str] = opt.SLO,
    on_corrupt: str = opt.ON_CORRUPT,
    raw: bool = opt.option(
        RunConfig.raw,
        "--raw",
        panel=opt.CHECKS,
        help=(
            "Also ask /v1/completions for each turn's raw completion (DeepSeek-V4: deepseek-recipe's prompt; other "
            "families: the server's own /tokenize rendering, else not offered) and read it with the family's "
            "reference parsers (deepseek-recipe, SGLang's detectors), beside the server's answer."
        ),
    ),
    family: str = opt.option(
        RunConfig.family,
        "--family",
        panel=opt.CHECKS,
        help=(
            "Model family whose tool-call markup and special tokens are checked: auto (what the server reports: its "
            "tool_call_parser, else the model name; every family where neither says), all (every family), or a "
            "family: deepseek-v4, deepseek-v3.2, deepseek-v3.1, deepseek-v3, qwen, qwen3-coder, kimi-k2, glm, "
            "gpt-oss, llama3, mistral, gemma (a tool-call parser name such as qwen25 works too). For a gateway that "
            "renames models."
        ),
    ),
    reference: Optional[Path] = opt.option(
        RunConfig.reference,
        "--reference",
        panel=opt.CHECKS,
        metavar="RUN",
        help=(
            "A run folder (or an --out folder holding one run) whose answers this run must repeat: run the same "
            "--seed and flags against a server without the suspect change (e.g. HiCache off), then again with it "
            "and --reference. A greedy turn whose request RUN also sent and that gets a different answer is "
            "reference_mismatch: wrong state the other checks cannot see (a cache or KV race). Needs --temperature 0 "
            "and a deterministic server (the bundled engine is; SGLang: --enable-deterministic-inference)."
        ),
    ),
    # agents' --kill picks sessions (who=, abort); locust's stops Locust users by count: two meanings
    kill: list[str] = opt.option(
        list(RunConfig.kill),
        "--kill",
        panel=opt.NEMESIS,
        metavar="SPEC",
        help=(
            "Nemesis kill schedule, repeatable: all@30s (kill every session at t=30 s; the load stops), "
            "frac=0.25/every=10s, optionally /from=20s and /until=90s (a share of the sessions periodically); "
            "items who=all|ttft|toolcall (only sessions waiting for their first token / streaming a tool call), "
            "restart (relaunch killed sessions at once as <id>.r<N>), abort (also POST /abort_request). "
            "E.g. all@30s,restart or frac=0.5/every=10s,who=ttft. Grammar: dsv4bench/harness/nemesis.py."
        ),
    ),
    metrics: list[str] = opt.metrics("the run"),
    metrics_interval: float = opt.METRICS_INTERVAL,
    drain_timeout: float = opt.drain_timeout("the load stops"),
    canary_timeout: float = opt.CANARY_TIMEOUT,
    recover_cmd: Optional[str] = opt.option(
        RunConfig.recover_cmd,
        "--recover-cmd",
        panel=opt.WEDGE_WATCH,
        help=(
            "Shell command to run when a wedge is found or the state is poisoned (e.g. restart the services); the "
            "time back to healthy, and after poisoning until fresh sessions are clean, is measured."
        ),
    ),
    persist_sessions: int = opt.PERSIST_SESSIONS,
    triage: str = opt.TRIAGE,
    recheck: float = opt.RECHECK,
    recheck_keep_cache: bool = opt.RECHECK_KEEP_CACHE,
    recheck_group: int = opt.RECHECK_GROUP,
    engine_arg: list[str] = opt.ENGINE_ARG,
    engine_fault: list[str] = opt.ENGINE_FAULT,
    engine_pd: bool = opt.ENGINE_PD,
    engine_router: str = opt.ENGINE_ROUTER,
    out_dir: Path = opt.out_dir("the run folder"),
    fail_on: Optional[str] = opt.fail_on("on these verdicts"),
    quiet: bool = opt.quiet("No live progress; print the verdict line only."),
    serve_metrics: Optional[int] = opt.option(
        RunConfig.serve_metrics,
        "--serve-metrics",
        panel=opt.OUTPUT,
        metavar="PORT",
        help=(
            "Serve the harness's own Prometheus metrics on 127.0.0.1:PORT during the run (sessions, turns, verdicts "
            "by code, kills)."
        ),
    ),
) -> None:
    """The main job: N multi-turn tool-calling agent sessions, every turn checked, a report written.

    With no --url, the bundled DSV4-mini engine is started on a free loopback port for the run."""
    if replay is not None or speed is not None:
        _replay(
            ctx,
            replay,
            speed,
            url,
            concurrency,
            model,
            api_key,
            out_dir,
            fail_on,
            quiet,
            ttft_timeout,
            total_timeout,
            slo,
            reference,
            engine_flags=(engine_arg, engine_fault, engine_pd, engine_router),
        )
        return
    try:
        config = RunConfig(
            url=url or BUNDLED_PLACEHOLDER_URL,
            concurrency=concurrency,
            rate=rate,
            sessions=sessions,
            duration=duration,
            max_turns=max_turns,
            context=context,
            cache_pressure=cache_pressure,
            kv_pool_tokens=kv_pool_tokens,
            scenario=scenario,
            seed=seed,
            thinking=thinking,
            request_mix=request_mix,
            stream=stream,
            max_tokens=max_tokens,
            context_length=context_length,
            temperature=temperature,
            ttft_timeout=ttft_timeout,
            total_timeout=total_timeout,
            slo=slo,
            on_corrupt=on_corrupt,
            raw=raw,
            family=family,
            model=model,
            api_key=api_key,
            out=out_dir,
            fail_on=parse_fail_on(fail_on),
            quiet=quiet,
            metrics=tuple(metrics),
            metrics_interval=metrics_interval,
            kill=tuple(kill),
            drain_timeout=drain_timeout,
            canary_timeout=canary_timeout,
            recover_cmd=recover_cmd,
            persist_sessions=persist_sessions,
            triage=triage,
            recheck=recheck,
            recheck_keep_cache=recheck_keep_cache,
            recheck_group=recheck_group,
            serve_metrics=serve_metrics,
            reference=reference,
            # The hosts named here, before the bundled engine or discovery add theirs (the engine's are ours).
            key_hosts=(url, *metrics) if url is not None else (),
            key_to_workers=key_to_workers,
        )
        check_out_dir(out_dir)
        ensure_open_files(concurrency)
        engine = engine_args(url is not None, engine_arg, engine_fault, engine_pd, engine_router)
    except (ConfigError, HostLimitError) as e:
        raise fail(str(e))
    if sessions is None and duration is None and not quiet:
        err.print(
            f"no --sessions or --duration: one whole session per slot (--sessions {config.sessions})", highlight=False
        )
    from dsv4bench.harness.exporter import ExporterError
    from dsv4bench.harness.reference_run import ReferenceAnswers, ReferenceRunError
    from dsv4bench.harness.run import run_agents

    answers = None
    if reference is not None:  # read before anything starts: a bad folder fails at once
        try:
            answers = ReferenceAnswers.load(reference)
        except ReferenceRunError as e:
            raise fail(str(e))

    target = open_target(config, url is not None, engine, engine_router, quiet)
    try:
        run_config = _sized_for_cache(target.config, target.facts, quiet)
        try:
            summary, run_dir = run_agents(
                run_config, target.facts, command=_command_line(run_config), reference=answers
            )
        except ExporterError as e:
            raise fail(str(e))
    finally:
        target.stop()
    print_verdict(summary, run_dir)
    raise _exit(summary, config.fail_on)


def _sized_for_cache(config: RunConfig, facts: dict, quiet: bool) -> RunConfig:
    """`config` sized for --cache-pressure (its plan printed, and kept in run.json), or as given."""
    from dsv4bench.harness.cache_plan import CachePlanError, plan_run

    try:
        planned = plan_run(config, facts)
    except CachePlanError as e:
        raise fail(str(e))
    if planned is None:
        return config
    sized, plan = planned
    facts["cache_plan"] = plan.to_json()
    if not quiet:
        for line in plan.lines():
            err.print(line, highlight=False, markup=False)
    return sized


def _replay(
    ctx: typer.Context,
    capture_dir: Path | None,
    speed_text: str | None,
    url: str | None,
    concurrency: int,
    model: str | None,
    api_key: str | None,
    out_dir: Path,
    fail_on: str | None,
    quiet: bool,
    ttft_timeout: float,
    total_timeout: float,
    slo: str | None,
    reference: Path | None,
    engine_flags: tuple[list[str], list[str], bool, str],
) -> None:
    """`agents --replay CAPTURE`: the capture's requests sent again (replay.py), judged and reported."""
    from dsv4bench.modes.replay import CaptureError, load_capture, parse_speed, run_replay

    if capture_dir is None:
        raise fail("--speed paces a --replay; it needs --replay CAPTURE")
    given = [
        p.opts[0]
        for p in ctx.command.params
        if p.name in NOT_WITH_REPLAY and getattr(ctx.get_parameter_source(p.name), "name", None) == "COMMANDLINE"
    ]
    if given:
        raise fail(f"--replay sends the capture's own requests: not with {', '.join(given)}")
    try:
        speed = parse_speed(speed_text if speed_text is not None else "1")
        config = RunConfig(
            url=url or BUNDLED_PLACEHOLDER_URL,
            concurrency=concurrency,
            model=model,
            api_key=api_key,
            out=out_dir,
            fail_on=parse_fail_on(fail_on),
            quiet=quiet,
            ttft_timeout=ttft_timeout,
            total_timeout=total_timeout,
            slo=slo,
        )
        check_out_dir(out_dir)
        ensure_open_files(concurrency)
        engine = engine_args(url is not None, *engine_flags)
        capture = load_capture(capture_dir)  # read before anything starts: a bad folder fails at once
    except (ConfigError, HostLimitError, CaptureError) as e:
        raise fail(str(e))
    from dsv4bench.harness.reference_run import ReferenceAnswers, ReferenceRunError

    answers = None
    if reference is not None:
        try:
            answers = ReferenceAnswers.load(reference)
        except ReferenceRunError as e:
            raise fail(str(e))
    if capture.unplayable:
        err.print(
            f"{capture.unplayable} of {capture.turns} captured turns keep no request body and are not replayed "
            "(only `dsv4bench proxy --capture` keeps every turn's)",
            highlight=False,
            soft_wrap=True,
        )
    target = open_target(config, url is not None, engine, engine_flags[3], quiet)
    try:
        summary, run_dir = run_replay(
            target.config, target.facts, _command_line(target.config), capture, speed, answers
        )
    finally:
        target.stop()
    print_verdict(summary, run_dir)
    raise _exit(summary, config.fail_on)


def _exit(summary: dict, fail_on: tuple[str, ...]) -> typer.Exit:
    """The verdict's exit code (verdict.exit_code); a run stopped with Ctrl-C exits 130 once its
    report is written, as a shell reports an interrupted command: it did not run to its end,
    whatever the part that ran found."""
    if summary.get("end_reason") == "interrupted":
        err.print("interrupted: the report covers the run up to Ctrl-C", highlight=False)
        return typer.Exit(130)
    return typer.Exit(exit_code(summary, fail_on))


def _command_line(config: RunConfig) -> str:
    """The reproduce line: this command with its secrets replaced by environment variables."""
    return shell_line(["dsv4bench", *redact_argv(sys.argv[1:])])
