"""The report's sections on what follows a finding: "Corruption that persists" (run.json's
`persistence`, harness/persistence.py), "Where it started" (summary.json's `first_findings`,
onset.py) and "What to run next" (next_steps.py). Each says nothing it was not given: a run
without the check, or without findings, gets no section or one line."""

from __future__ import annotations

from typing import Any

from dsv4bench.report import blocks as md
from dsv4bench.report.next_steps import next_steps


def persistence_section(summary: dict[str, Any]) -> list[str]:
    """The fresh sessions after the load and what they say; [] when the check did not run."""
    block = summary.get("persistence")
    if not isinstance(block, dict):
        return []
    out = ["## Corruption that persists", ""]
    if block.get("error"):
        return out + [f"The check failed on the harness's side ({md.inline(block['error'])}): nothing is claimed."]
    poisoned = block.get("poisoned")
    words = {
        True: "**Poisoned** (`poisoned_state`): the corruption outlived the load",
        False: "Not poisoned: alone after the load, the sessions' seeds are clean again; the corruption needed the load",
        None: "Not judged",
    }[poisoned]
    out.append(f"{words} ({md.inline(block.get('why') or '')}).")
    rows = [
        [
            md.code_span(s.get("session")),
            md.code_span(s.get("replays")),
            md.cell(s.get("scenario")),
            md.cell(s.get("seed")),
            md.cell(s.get("outcome")),
            f"{s.get('corrupt_turns', 0)}/{s.get('turns', 0)}",
            ", ".join(md.code_span(c) for c in s.get("codes") or []) or "–",
        ]
        for s in block.get("sessions") or []
        if isinstance(s, dict)
    ]
    if rows:
        head = ["fresh session", "replays", "scenario", "seed", "outcome", "corrupt/turns", "codes"]
        out += ["", md.table(head, rows)]
    after = block.get("after_recovery")
    if isinstance(after, dict):
        clean = after.get("clean_after_s")
        out += [
            "",
            f"After `--recover-cmd`: a fresh session was clean {md.fmt_seconds(clean)} after the command started "
            f"({md.plural(after.get('tries') or 0, 'try')})."
            if clean is not None
            else f"After `--recover-cmd`: no fresh session was clean within {md.fmt_seconds(block.get('cap_s'))} "
            f"({md.plural(after.get('tries') or 0, 'try')}, the last {md.inline(after.get('last') or 'none')}).",
        ]
    return out


def _move(m: dict[str, Any]) -> str:
    unit = "/s" if m.get("kind") == "rate" else ""

    def value(x: Any) -> str:
        return f"{x:g}{unit}" if isinstance(x, (int, float)) else "?"

    return (
        f"{md.code_span(m.get('series'), 160)} @ {md.cell(m.get('endpoint'))}: "
        f"{value(m.get('before'))} → {value(m.get('after'))}"
    )


def onset_section(summary: dict[str, Any]) -> list[str]:
    """Per code, its first finding and the metrics that moved most in the minute before it."""
    firsts = summary.get("first_findings")
    if not isinstance(firsts, dict) or not firsts:
        return []
    rows = [
        [
            md.code_span(code),
            md.fmt_seconds(f.get("t_s")),
            f"{md.code_span(f.get('session'))} turn {md.cell(f.get('turn'))}",
            "<br>".join(_move(m) for m in f.get("moved") or []) or "none moved",
        ]
        for code, f in firsts.items()
        if isinstance(f, dict)
    ]
    return [
        "## Where it started",
        "",
        "The first turn of each code (seconds since the run's start, as the timeline marks it), and the scraped "
        "series whose rate (counters) or level (gauges) changed most in the minute before it against the run "
        "before that. Evidence, not verdicts: a metric that moved may be a cause, an effect or neither.",
        "",
        md.table(["code", "first at", "where", "metrics that moved (before → after)"], rows),
    ]


def next_steps_section(run: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """The commands this run's findings call for; one line for a run that calls for none."""
    steps = next_steps(run, summary)
    out = ["## What to run next", ""]
    if not steps:
        return out + ["Nothing: the run found nothing that a next command would explain."]
    for step in steps:
        out += [f"- {md.inline(step.why)}", "", md.fence(step.command, "sh"), ""]
    return out[:-1]
