"""The report's "Latency targets" section: summary.json's `slo` block (report/slo.py) in words,
for a run given --slo; nothing for a run given none."""

from __future__ import annotations

from typing import Any

from dsv4bench.report import blocks as md

_NAMES = {"ttft": "TTFT", "itl": "ITL (the turn's mean gap between tokens)", "e2e": "E2E"}


def _per_second(x: float | None) -> str:
    return "–" if x is None else f"{x:,.2f}/s"


def slo_section(summary: dict[str, Any]) -> list[str]:
    """The section's lines; [] for a run given no targets."""
    slo = summary.get("slo")
    if not isinstance(slo, dict):
        return []
    head = ["## Latency targets (--slo)", ""]
    if "error" in slo:
        return [
            *head,
            f"The run's targets cannot be read ({md.inline(slo['error'])}): no turn was judged against them.",
        ]
    targets = ", ".join(f"{_NAMES[k]} ≤ {md.fmt_seconds(v)}" for k, v in slo["targets_s"].items())
    outcomes, missed = slo["outcomes"], slo["missed"]
    window = slo["window_s"]
    rows = [
        [
            "turns meeting every target",
            f"{md.fmt_int(slo['good'])} of {md.fmt_int(slo['turns'])} ({md.fmt_rate(slo['share'])})",
            _per_second(slo["goodput_turns_per_s"]),
        ],
        ["their output tokens", md.fmt_int(slo["good_output_tokens"]), _per_second(slo["goodput_tokens_per_s"])],
    ]
    missed_words = ", ".join(f"{k.upper()} {md.fmt_int(n)}" for k, n in missed.items())
    lines = [
        *head,
        f"Targets: {targets}. A turn is good when it completed, no checker found it corrupt, and it met every "
        "target (at the target is meeting it).",
        "",
        md.table(["", "count", "goodput"], rows),
        "",
        f"Not good: {md.plural(outcomes['missed'], 'turn')} missed a target ({missed_words}), "
        f"{md.fmt_int(outcomes['corrupt'])} corrupt, {md.fmt_int(outcomes['failed'])} failed. "
        f"Not counted: {md.fmt_int(outcomes['killed'])} killed by the nemesis, {md.fmt_int(outcomes['unjudged'])} "
        "a checker raised on.",
        "",
        f"Per second of the run's duration ({md.fmt_seconds(window)}, run start to run end)."
        if window
        else "The run's duration is unknown: no rate is given.",
    ]
    if slo["tokens_unknown"]:
        lines += [
            "",
            f"{md.plural(slo['tokens_unknown'], 'good turn')} reported no completion_tokens in usage: "
            "their tokens are not counted.",
        ]
    return lines
