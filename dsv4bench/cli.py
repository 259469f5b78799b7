"""The `dsv4bench` command line. Flags become one RunConfig here; errors become one line."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import anyio
import typer
from rich.console import Console

from . import __version__
from .config import ConfigError, RunConfig, parse_fail_on
from .preflight import ServerError, server_facts

app = typer.Typer(
    name="dsv4bench",
    help="Load-test and correctness audit for LLM servers under agentic load.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

VERDICT_STYLE = {"CLEAN": "bold green", "CORRUPTION": "bold red", "WEDGE": "bold magenta", "ERRORS": "bold yellow"}


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        out.print(f"dsv4bench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Drive multi-turn tool-calling agents at an OpenAI-compatible server, check every tool
    call, record a history, and write an incident report."""


@app.command()
def agents(
    url: Optional[str] = typer.Option(None, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1."),
    concurrency: int = typer.Option(8, help="Sessions in flight at once (closed pool; with --rate, the cap)."),
    rate: Optional[float] = typer.Option(None, help="Open model: new sessions per second, Poisson arrivals."),
    sessions: Optional[int] = typer.Option(None, help="Total sessions to run."),
    duration: Optional[float] = typer.Option(None, help="Seconds to keep starting turns; in-flight turns finish."),
    max_turns: int = typer.Option(12, help="Turns per session before it is cut off."),
    scenario: str = typer.Option("mixed", help="Scenario family: coding, data, ops, or mixed (round robin)."),
    seed: int = typer.Option(0, help="Run seed; the same seed replays the same tasks."),
    thinking: bool = typer.Option(False, "--thinking/--no-thinking", help="Ask for thinking mode (chat_template_kwargs)."),
    stream: bool = typer.Option(True, "--stream/--no-stream", help="Stream responses over SSE."),
    max_tokens: int = typer.Option(1024, help="max_tokens of each turn."),
    temperature: float = typer.Option(0.0, help="Sampling temperature."),
    ttft_timeout: float = typer.Option(60.0, help="Seconds to the first token before a turn is timeout_ttft."),
    total_timeout: float = typer.Option(300.0, help="Seconds to the end of a turn before it is timeout_total."),
    on_corrupt: str = typer.Option("continue", help="After a corrupt turn: continue (feed back an error) or stop."),
    raw: bool = typer.Option(False, "--raw", help="Also ask /v1/completions with the deepseek-recipe prompt and compare parsers."),
    model: Optional[str] = typer.Option(None, help="Model name; default: the first id of /v1/models."),
    api_key: Optional[str] = typer.Option(None, envvar="DSV4BENCH_API_KEY", help="Bearer token for the server."),
    out_dir: Path = typer.Option(Path("runs"), "--out", help="Folder under which the run folder is created."),
    fail_on: Optional[str] = typer.Option(None, help="Exit 1 on these verdicts: corruption,errors,wedge."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress; print the verdict line only."),
) -> None:
    """The main job: N multi-turn tool-calling agent sessions, every turn checked, a report written."""
    if url is None:
        raise fail("agents needs --url: the OpenAI-compatible server to test (e.g. --url http://127.0.0.1:30000/v1). "
                   "Starting the bundled engine without --url is not available in this version.")
    try:
        config = RunConfig(
            url=url, concurrency=concurrency, rate=rate, sessions=sessions, duration=duration, max_turns=max_turns,
            scenario=scenario, seed=seed, thinking=thinking, stream=stream, max_tokens=max_tokens,
            temperature=temperature, ttft_timeout=ttft_timeout, total_timeout=total_timeout, on_corrupt=on_corrupt,
            raw=raw, model=model, api_key=api_key, out=out_dir, fail_on=parse_fail_on(fail_on), quiet=quiet,
        )
        _check_scenario(scenario)
    except ConfigError as e:
        raise fail(str(e))
    from .run import run_agents

    try:
        facts = server_facts(config.base_url, config.api_key)
    except ServerError as e:
        raise fail(str(e))
    summary, run_dir = run_agents(config, facts, command=_command_line())
    _print_verdict(summary, run_dir)
    raise typer.Exit(_exit_code(summary, config.fail_on))


def _check_scenario(scenario: str) -> None:
    from .agents import FAMILIES

    if scenario != "mixed" and scenario not in FAMILIES:
        raise ConfigError(f"--scenario must be one of {', '.join([*FAMILIES, 'mixed'])}; got {scenario!r}")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run folder (possibly partial, e.g. from a killed run).")) -> None:
    """Rebuild summary.json, report.md and the plots from a run's history."""
    from .history import HistoryError
    from .report import build_report

    try:
        summary = build_report(run_dir)
    except HistoryError as e:
        raise fail(str(e))
    _print_verdict(summary, run_dir)


@app.command()
def audit(
    file: Path = typer.Argument(..., help="JSONL of recorded request/response pairs or SSE transcripts."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Write per-record verdicts as JSONL here."),
    fail_on: Optional[str] = typer.Option(None, help="Exit 1 on these verdicts: corruption,errors."),
) -> None:
    """Run the checkers offline over traffic captured in production."""
    from .audit import AuditError, audit_file, render_audit

    try:
        results = audit_file(file)
    except AuditError as e:
        raise fail(str(e))
    render_audit(results, out)
    if out_file:
        from .audit import write_results

        write_results(results, out_file)
    codes = parse_fail_on(fail_on)
    bad = [c for c in codes if c not in ("corruption", "errors")]
    if bad:
        raise fail(f"audit --fail-on takes corruption,errors; got {', '.join(bad)}")
    if ("corruption" in codes and any(r.corrupt for r in results)) or ("errors" in codes and any(r.errors for r in results)):
        raise typer.Exit(1)


def _command_line() -> str:
    return shlex.join(["dsv4bench", *sys.argv[1:]])


def _print_verdict(summary: dict, run_dir: Path) -> None:
    v = summary.get("verdict", "?")
    t = summary.get("turns", {})
    line = (f"[{VERDICT_STYLE.get(v, 'bold')}]{v}[/]  turns {t.get('total', 0)} (ok {t.get('ok', 0)}, "
            f"corrupt {t.get('corrupt', 0)}, error {t.get('error', 0)}, killed {t.get('killed', 0)})  "
            f"report: {Path(run_dir) / 'report.md'}")
    out.print(line, highlight=False)


def _exit_code(summary: dict, fail_on: tuple[str, ...]) -> int:
    v = summary.get("verdict")
    t = summary.get("turns", {})
    if "corruption" in fail_on and (v == "CORRUPTION" or t.get("corrupt", 0) > 0):
        return 1
    if "errors" in fail_on and (v == "ERRORS" or t.get("error", 0) > 0):
        return 1
    if "wedge" in fail_on and v == "WEDGE":
        return 1
    return 0


def main() -> None:
    """Console entry point: Ctrl-C and broken pipes end quietly, never with a traceback."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
