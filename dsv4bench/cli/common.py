"""What every command shares: the typer app, the two consoles, the one-line error, the verdict line."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from dsv4bench.terminal import markup_safe

from dsv4bench import __version__

app = typer.Typer(
    name="dsv4bench",
    help="Load-test and correctness audit for LLM servers under agentic load.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

VERDICT_STYLE = {
    "CLEAN": "bold green",
    "CORRUPTION": "bold red",
    "POISONED": "bold red",
    "WEDGE": "bold magenta",
    "ERRORS": "bold yellow",
    "INCOMPLETE": "bold red",
}


REQUEST_MIX_HELP = (
    "Vary what each turn asks, drawn per turn from a seeded mix: tool_choice (auto, required, none, named), "
    "parallel_tool_calls (unset, true, false), thinking (off, on, low, high, xhigh, max: the reasoning_effort "
    "tiers) and stop (none, set). `frameworks` is what common agent frameworks send; or name=value:weight,... "
    "per dimension, `;` between them, after a preset or alone: e.g. 'frameworks;thinking=off' or "
    "'tool_choice=auto:6,none:2,named:2'. Each value's expectation is checked (tool_choice_violation, "
    "parallel_calls_violation, stop_sequence_ignored, reasoning_only) and the report splits every code by "
    "variant. Grammar and the default weights: dsv4bench/harness/request_mix.py."
)


def fail(message: str, code: int = 2) -> typer.Exit:
    """The one line a bad flag or an unusable input gets on stderr; raise what it returns.
    `message` is plain text: brackets in it (an IPv6 URL, `pip install 'pkg[extra]'`) print as they are."""
    err.print(f"[bold red]error:[/] {markup_safe(message)}", highlight=False, soft_wrap=True)
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


def print_verdict(summary: dict, run_dir: Path) -> None:
    """The run's verdict and turn counts in one line, with the report's path; beside CLEAN, what
    the run could not have found."""
    # Imported here: the report package is loaded lazily, and by now the report has been built.
    from dsv4bench.report.coverage import WEDGES_NOT_CHECKED, short_gaps

    v = summary.get("verdict", "?")
    t = summary.get("turns", {})
    unchecked = " (wedge not checked)" if summary.get("wedge_checked") is False and v in ("CLEAN", "ERRORS") else ""
    if v == "CLEAN" and (gaps := short_gaps(summary.get("coverage") or [], (WEDGES_NOT_CHECKED,))):
        unchecked += f" ({gaps})"  # what a CLEAN could not have found (report/coverage.py)
    line = (
        f"[{VERDICT_STYLE.get(v, 'bold')}]{v}[/]{unchecked}  turns {t.get('total', 0)} "
        f"(good {t.get('good', 0)}, corrupt {t.get('corrupt', 0)}, error {t.get('error', 0)}, "
        f"killed {t.get('killed', 0)})  report: {markup_safe(str(Path(run_dir) / 'report.md'))}"
    )
    out.print(line, highlight=False, soft_wrap=True)
