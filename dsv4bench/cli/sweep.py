"""`dsv4bench sweep`: `agents` at rising concurrency on the same seeds, each level run in batches
until its corrupt-turn rate is known to the stated confidence, and the smallest concurrency at
which corruption appears reported (the rules: dsv4bench/modes/sweep.py). One sweep folder holds
sweep.json, sweep.md, sweep.png and, per level, its batches as ordinary run folders."""

from __future__ import annotations

import dataclasses
import datetime as dt
import secrets
import sys
from pathlib import Path
from typing import Optional

import typer
from dsv4bench.terminal import markup_safe

from dsv4bench.harness.config import ConfigError, RunConfig, check_out_dir, parse_fail_on
from dsv4bench.servers.preflight import HostLimitError, ensure_open_files
from dsv4bench.history.redact import redact_argv, shell_line
from dsv4bench.history.verdict import exit_code
from dsv4bench.cli import options as opt
from dsv4bench.cli.common import VERDICT_STYLE, app, err, fail, out
from dsv4bench.cli.target import BUNDLED_PLACEHOLDER_URL, engine_args, open_target

# The sweep's own flags, which an `agents` reproduce line must leave out (with their values).
_SWEEP_ONLY = ("--confidence", "--precision", "--baseline", "--level-turns")
_PER_BATCH = ("--concurrency", "--seed")  # set per batch in its reproduce line


@app.command()
def sweep(
    # sweep's --concurrency is a list of levels, agents' one number: two flags under one name
    concurrency: str = opt.option(
        ...,
        "--concurrency",
        panel=opt.SWEEP,
        help=(
            "Levels: 1,8,16,32,60,80, a range 1-80:8 (1, 8, 16, ..., 80), 1..80 step 8, or a mix; grammar in "
            "dsv4bench/modes/sweep.py."
        ),
    ),
    confidence: float = opt.CONFIDENCE,
    precision: float = opt.PRECISION,
    level_turns: int = opt.LEVEL_TURNS,
    baseline: float = opt.BASELINE,
    url: Optional[str] = opt.URL,
    model: Optional[str] = opt.MODEL,
    api_key: Optional[str] = opt.API_KEY,
    # sessions, duration and seed are per batch here (batch k plays seed + k), so sweep words its own
    sessions: Optional[int] = opt.option(
        RunConfig.sessions,
        "--sessions",
        panel=opt.LOAD,
        help=(
            "Sessions per batch, the same at every level (so every level plays the same tasks). With neither "
            "--sessions nor --duration: one whole session per slot."
        ),
    ),
    duration: Optional[float] = opt.option(
        RunConfig.duration, "--duration", panel=opt.LOAD, help="Seconds per batch to keep starting turns."
    ),
    max_turns: Optional[int] = opt.MAX_TURNS,
    context: str = opt.CONTEXT,
    scenario: str = opt.SCENARIO,
    seed: int = opt.option(
        RunConfig.seed, "--seed", panel=opt.LOAD, help="Seed of batch 0 at every level; batch k is seeded seed + k."
    ),
    thinking: bool = opt.THINKING,
    request_mix: Optional[str] = opt.REQUEST_MIX,
    stream: bool = opt.STREAM,
    max_tokens: int = opt.MAX_TOKENS,
    context_length: Optional[int] = opt.CONTEXT_LENGTH,
    temperature: float = opt.TEMPERATURE,
    ttft_timeout: float = opt.TTFT_TIMEOUT,
    total_timeout: float = opt.TOTAL_TIMEOUT,
    slo: Optional[str] = opt.SLO,
    on_corrupt: str = opt.ON_CORRUPT,
    metrics: list[str] = opt.metrics("each batch"),
    drain_timeout: float = opt.drain_timeout("each batch"),
    engine_arg: list[str] = opt.ENGINE_ARG,
    engine_fault: list[str] = opt.ENGINE_FAULT,
    engine_pd: bool = opt.ENGINE_PD,
    engine_router: str = opt.ENGINE_ROUTER,
    out_dir: Path = opt.out_dir("the sweep folder"),
    fail_on: Optional[str] = opt.fail_on("when any batch of any level meets one (as agents --fail-on judges one run)"),
    quiet: bool = opt.quiet("No progress per batch; print the result lines only."),
) -> None:
    """Where corruption starts: agents at rising concurrency on the same seeds, each level run
    until its corrupt-turn rate is known to --confidence, and the smallest level at which
    corruption appears reported, with a table and a plot (sweep.md, sweep.png)."""
    from dsv4bench.modes import sweep as plan_rules

    try:
        plan = plan_rules.SweepPlan(
            plan_rules.parse_levels(concurrency),
            confidence=confidence,
            precision=precision,
            baseline=baseline,
            level_turns=level_turns,
        )
        top = max(plan.levels)
        # One config checks every flag once; each batch's is this one at its level and seed.
        base = RunConfig(
            url=url or BUNDLED_PLACEHOLDER_URL,
            concurrency=top,
            sessions=sessions,
            duration=duration,
            max_turns=max_turns,
            context=context,
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
            model=model,
            api_key=api_key,
            out=out_dir,
            fail_on=parse_fail_on(fail_on),
            quiet=True,
            metrics=tuple(metrics),
            drain_timeout=drain_timeout,
            # the key goes to the servers named here, not to workers discovery finds behind them
            key_hosts=(url, *metrics) if url is not None else (),
        )
        check_out_dir(out_dir)
        ensure_open_files(top)
        engine = engine_args(url is not None, engine_arg, engine_fault, engine_pd, engine_router)
    except (ConfigError, HostLimitError) as e:
        raise fail(str(e))
    from dsv4bench.harness.run import run_agents

    sweep_dir = out_dir / _sweep_id(base)
    target = open_target(base, url is not None, engine, engine_router, quiet)
    argv = redact_argv(sys.argv[1:])
    exit_codes = [0]  # each batch judged by --fail-on as `agents` judges its run

    def run_batch(level: int, batch: int) -> tuple[dict, str]:
        config = dataclasses.replace(
            target.config, concurrency=level, sessions=sessions, seed=seed + batch, out=sweep_dir / f"c{level}"
        )
        summary, run_dir = run_agents(config, target.facts, command=batch_command(argv, level, seed + batch))
        exit_codes.append(exit_code(summary, base.fail_on))
        return summary, str(run_dir.relative_to(sweep_dir))

    def on_batch(level: plan_rules.Level, batch: int) -> None:
        if quiet:
            return
        lower, upper = level.interval(plan.confidence)
        t = level.turns
        err.print(
            markup_safe(
                f"c{level.concurrency} batch {batch}: {level.verdicts[-1]}; level so far {t['total']} "
                f"turns, {t['corrupt']} corrupt of {t['ok']} completed, interval "
                f"{100 * lower:.1f}%-{100 * upper:.1f}%"
            ),
            highlight=False,
            soft_wrap=True,
        )

    levels: list[plan_rules.Level] = []
    try:
        sweep_dir.mkdir(parents=True)
        for level in plan.levels:
            if not quiet:
                err.print(f"level c{level} ...", highlight=False)
            levels.append(plan_rules.run_level(level, plan, run_batch, on_batch))
    finally:
        target.stop()
        summary = plan_rules.sweep_summary(levels, plan, shell_line(["dsv4bench", *argv]))
        if levels:  # an interrupted sweep still says what its finished levels found
            plan_rules.write_sweep(sweep_dir, summary)
    _print_result(summary, sweep_dir)
    raise typer.Exit(max(exit_codes))


def _sweep_id(config: RunConfig) -> str:
    """A fresh, sortable, unique sweep folder name, as run folders are named."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"sweep-{stamp}-{config.scenario}-{secrets.token_hex(2)}"


def batch_command(argv: list[str], level: int, seed: int) -> str:
    """The `agents` line that reruns one batch: the sweep's flags less its own, at the batch's
    concurrency and seed (`argv`: the sweep's arguments, already redacted)."""
    kept: list[str] = []
    skip_value = False
    for arg in argv[1:]:  # argv[0] is "sweep"
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in _SWEEP_ONLY or name in _PER_BATCH:
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    return shell_line(["dsv4bench", "agents", *kept, "--concurrency", str(level), "--seed", str(seed)])


def _print_result(summary: dict, sweep_dir: Path) -> None:
    """One line per level and the threshold, on stdout."""
    for lv in summary["levels"]:
        lower, upper = lv["interval"]
        rate = "-" if lv["rate"] is None else f"{100 * lv['rate']:.1f}%"
        style = VERDICT_STYLE.get(lv["verdict"], "bold")
        out.print(
            f"c{lv['concurrency']:<4} [{style}]{markup_safe(lv['verdict'])}[/]  turns {lv['turns']['total']} "
            f"(corrupt {lv['turns']['corrupt']} of {lv['turns']['ok']} completed)  rate {rate} "
            f"({100 * lower:.1f}%-{100 * upper:.1f}%)  stopped by {lv['stopped_by']}",
            highlight=False,
            soft_wrap=True,
        )
    found = summary["threshold"]
    where = f"corruption appears at concurrency {found}" if found is not None else "no level shows corruption"
    out.print(markup_safe(f"{where}  report: {sweep_dir / 'sweep.md'}"), highlight=False, soft_wrap=True)
