"""The report's "Triage" section: summary.json's `triage` block (harness/alone.py) in words: was
the server deterministic, and one line per finding with its class and the evidence; nothing for
a run that sent nothing alone."""

from __future__ import annotations

from typing import Any

from dsv4bench.report import blocks as md

# What each class says a finding is (docs/triage.md holds the same list).
CLASS_WORDS = {
    "deterministic": "deterministic: the model, the chat template or the parser",
    "cache_state": "cache state: shows again from the cache the load left, never cold",
    "cold_path": "cold path only: shows again only with the prefix cache defeated",
    "intermittent": "intermittent alone: a race even without load",
    "load_dependent": "load-dependent: never alone (batching, a race, a cache under pressure)",
    "not_classed": "not classed",
}


def _finding_line(f: dict[str, Any]) -> str:
    codes = ", ".join(md.code_span(c) for c in f.get("codes") or [])
    cls = CLASS_WORDS.get(str(f.get("class")), md.inline(f.get("class"), 40))
    cause = f" ({md.inline(f['cause'], 40)})" if f.get("cause") else ""
    where = f"{md.inline(f.get('session'), 40)} turn {md.inline(f.get('turn'), 10)}"
    line = f"- {where} ({md.inline(f.get('scenario'), 40)}), {codes}: **{cls}**{cause}; {md.inline(f.get('evidence'))}"
    if f.get("detail"):
        line += f"; {md.inline(f['detail'])}"
    return line


def triage_section(summary: dict[str, Any]) -> list[str]:
    """The section's lines; [] for a run that sent nothing alone."""
    block = summary.get("triage")
    if not isinstance(block, dict):
        return []
    lines = ["## Triage: alone after the load", ""]
    if block.get("error"):
        lines += [f"Triage failed on our side ({md.inline(block['error'])}): what it sent is in events.jsonl.", ""]
    det = v if isinstance(v := block.get("determinism"), dict) else {}
    said: dict[Any, str] = {True: "deterministic at temperature 0", False: "**not deterministic at temperature 0**"}
    lines.append(
        f"Server: {said.get(det.get('deterministic'), 'determinism not known')} ({md.inline(det.get('detail'))})."
        + (" No finding is classed on it." if det.get("deterministic") is not True else "")
    )
    sent = f"{md.plural(int(block.get('requests') or 0), 'request')} sent after the load in {md.fmt_seconds(block.get('elapsed_s'))}"
    cut = ", cut at the time cap: some kept requests were not sent" if block.get("cut") else ""
    kept, triaged = block.get("findings_kept"), block.get("triaged")
    if block.get("cut") and isinstance(kept, int) and isinstance(triaged, int) and triaged < kept:
        cut += f" ({triaged:,} of {kept:,} kept findings triaged)"
    lines += ["", f"{sent}{cut}; none of them is a turn of the run.", ""]
    recheck = block.get("recheck")
    if isinstance(recheck, dict):
        screen_only = int(recheck.get("screen_only") or 0)
        lines += [
            f"Recheck (--recheck {recheck.get('share')}): {md.fmt_int(int(recheck.get('rechecked') or 0))} of "
            f"{md.fmt_int(int(recheck.get('kept') or 0))} kept turns ({md.fmt_int(int(recheck.get('strata') or 0))} "
            f"scenario and depth pairs) sent again, {md.fmt_int(int(recheck.get('group') or 1))} at once, and each "
            f"that differed confirmed alone; {md.fmt_int(int(recheck.get('changed') or 0))} answered otherwise "
            "than under the load."
            + (
                f" {md.fmt_int(screen_only)} differed only beside other requests (alone they gave the load's answer): "
                "the server's greedy answers depend on what else is in its batch."
                if screen_only
                else ""
            ),
            "",
        ]
    findings = block.get("findings") or []
    lines += [_finding_line(f) for f in findings] if findings else ["No finding was sent again alone."]
    return lines
