"""What a report may claim and what it may carry: INCOMPLETE, the `good` count, the wedge that
was never checked, hints that name real flags, and server text escaped everywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsv4bench.history.run_folder import read_history
from dsv4bench.report import build_report
from dsv4bench.report.escape import escape_text
from dsv4bench.report.markdown import cell, code_span, fence, inline, render_report, table
from dsv4bench.report.summary import summarize

ROOT = Path(__file__).resolve().parents[2]
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
)
HOSTILE = (
    "nul\x00 esc\x1b[31m bell\x07 cr\r c1\x85 rlo\u202e lri\u2066 ls\u2028 bom\ufeff lone\ud800 ```fence <!-- |pipe|"
)


def test_escape_text_makes_every_unsafe_character_visible() -> None:
    assert (
        escape_text("a\x00b\x1b\x7f\x85\u202e\u2066\ud800\ufeff")
        == "a\\x00b\\x1b\\x7f\\x85\\u202e\\u2066\\ud800\\ufeff"
    )
    assert escape_text("tab\tnew\nline 日本語 é ｜DSML｜ 🙂") == "tab\tnew\nline 日本語 é ｜DSML｜ 🙂"
    assert not _UNSAFE.search(escape_text(HOSTILE))


def test_markdown_helpers_escape_and_cannot_be_broken_out_of() -> None:
    for helper in (inline, cell, code_span, fence):
        assert not _UNSAFE.search(helper(HOSTILE)), helper
    assert "\n" not in inline("a\nb") and "<!--" not in inline(HOSTILE)
    assert "|pipe|" in cell(HOSTILE) and "|pipe\\|" in table(["a"], [[cell(HOSTILE)]])  # table() escapes pipes
    assert code_span("a`b") == "`` a`b ``" and code_span("ok") == "`ok`"
    assert fence("x ```` y").startswith("`````\n")


def test_report_escapes_server_text_everywhere(run_folder, make_turn) -> None:
    turn = make_turn(
        "s1",
        0,
        verdicts=[("garbled_text", "content"), ("unknown_tool", "tool_calls[0]")],
        content=HOSTILE,
        raw_sse=[f"data: {HOSTILE}"],
    )
    turn.response.response_id = HOSTILE
    turn.response.tool_calls[0].name = HOSTILE
    turn.verdicts[1] = turn.verdicts[1].__class__("unknown_tool", f"unknown tool {HOSTILE}", "tool_calls[0]")
    err = make_turn("s2", 0, status="error", verdicts=[("http_error", "")], error=f"HTTP 500: {HOSTILE}")
    run = {
        "run": "r",
        "command": "dsv4bench agents",
        "server": {"models": [HOSTILE], "server_info": {"version": HOSTILE}},
        "wedge": {HOSTILE: {"codes": ["queue_stuck"], "gauges": {HOSTILE: 3}, "details": [HOSTILE]}},
    }
    run_dir = run_folder([turn, err], run=run)
    build_report(run_dir)
    text = (run_dir / "report.md").read_bytes().decode("utf-8")
    assert not _UNSAFE.search(text), repr(_UNSAFE.search(text))
    assert "\\x00" in text and "\\u202e" in text and "\\ud800" in text


def test_good_counts_ok_turns_that_are_not_corrupt(run_folder, make_turn) -> None:
    turns = [
        make_turn("s1", 0),
        make_turn("s1", 1, verdicts=[("args_not_json", "tool_calls[0].arguments")]),
        make_turn("s1", 2, check_errors=["schema_violation: boom"]),
        make_turn("s1", 3, status="killed"),
    ]
    s = summarize(read_history(run_folder(turns)))
    assert s["turns"] == {"total": 4, "ok": 3, "good": 1, "killed": 1, "corrupt": 1, "error": 0}
    md = render_report(read_history(run_folder(turns)), s, [])
    assert "| turns | 4 total: 1 good, 3 ok (1 corrupt), 1 killed, 0 error |" in md
    assert "**good** = ok, judged by every checker and not corrupt" in md


def test_lost_records_make_a_clean_run_incomplete(run_folder, make_turn, event) -> None:
    turns = [make_turn("s1", 0), make_turn("s1", 1)]
    run_dir = run_folder(turns, events=[event("session_end", 5.0, session="s1", turns=3)])
    summary = build_report(run_dir)
    assert summary["verdict"] == "INCOMPLETE" and summary["history"]["complete"] is False
    assert summary["history"]["gaps"] == ["session s1 ended after 3 turns but 2 are recorded"]
    md = (run_dir / "report.md").read_text()
    assert md.splitlines()[2].startswith("**INCOMPLETE** — the history lost turn records (session s1 ended after")
    assert "> **Incomplete history:**" in md


def test_a_turn_a_checker_raised_on_makes_a_clean_run_incomplete(run_folder, make_turn) -> None:
    """A checker that raised is our failure: the code it checks is unknown on that turn, so the
    run cannot be called CLEAN, live or rebuilt; the history itself is complete."""
    turns = [make_turn("s1", 0), make_turn("s1", 1, check_errors=["schema_violation: KeyError: 'type'"])]
    run_dir = run_folder(turns)
    summary = build_report(run_dir)
    assert summary["verdict"] == "INCOMPLETE" and summary["history"]["complete"] is True
    assert summary["unjudged"] == [
        "a checker raised on 1 turn(s), which were not judged by every checker "
        "(first: s1 turn 1, schema_violation: KeyError: 'type')"
    ]
    md = (run_dir / "report.md").read_text()
    assert md.splitlines()[2].startswith("**INCOMPLETE** — a checker raised on 1 turn(s)"), md.splitlines()[2]
    assert "> **Incomplete history:**" not in md and "> A checker raised on 1 turn(s)" in md
    # What was found still wins: a corrupt turn beside it is CORRUPTION.
    turns.append(make_turn("s1", 2, verdicts=[("args_not_json", "tool_calls[0].arguments")]))
    assert summarize(read_history(run_folder(turns)))["verdict"] == "CORRUPTION"
    assert summarize(read_history(run_folder([make_turn("s1", 0)])))["unjudged"] == []


def test_findings_still_win_over_incomplete(run_folder, make_turn, event) -> None:
    turns = [make_turn("s1", 0, verdicts=[("args_not_json", "tool_calls[0].arguments")])]
    s = summarize(read_history(run_folder(turns, events=[event("history_write_error", 1.0, file="turns.jsonl")])))
    assert s["verdict"] == "CORRUPTION" and not s["history"]["complete"]


def test_errors_with_lost_records_are_incomplete(run_folder, make_turn, event) -> None:
    turns = [make_turn("s1", 0, status="error", verdicts=[("http_error", "")], error="HTTP 500")]
    end = event("run_end", 9.0, turns_recorded=5, write_failures={"turns.jsonl": 0})
    s = summarize(read_history(run_folder(turns, events=[end], duration_s=None)))
    assert s["verdict"] == "INCOMPLETE" and s["partial"] is False
    assert s["history"]["gaps"] == ["the run wrote 5 turn records; 1 can be read back"]


def test_clean_without_metrics_says_the_wedge_was_not_checked(run_folder, make_turn) -> None:
    s = build_report(run_folder([make_turn()]))
    assert s["verdict"] == "CLEAN" and s["wedge_checked"] is False
    assert s["wedge_unchecked_reason"] == "no --metrics endpoint"


def test_clean_with_metrics_given_but_never_scraped(run_folder, make_turn) -> None:
    run = {"run": "r", "config": {"metrics": ["http://127.0.0.1:1/metrics"]}}
    run_dir = run_folder([make_turn()], run=run)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"t_wall_ns": 1, "t_ns": 1, "endpoint": "x", "ok": False}) + "\n")
    s = build_report(run_dir)
    md = (run_dir / "report.md").read_text()
    assert md.splitlines()[2].startswith("**CLEAN** (wedge not checked: no --metrics endpoint could be scraped) — ")
    assert "Wedge not checked (no --metrics endpoint could be scraped)" in md and s["wedge_checked"] is False


def test_clean_with_scraped_metrics_has_a_plain_headline(run_folder, make_turn, metrics) -> None:
    # A server that evicted and read back from its host tier: nothing left out to say beside CLEAN.
    run_dir = run_folder([make_turn()], run={"run": "r", "config": {"metrics": ["http://m/metrics"]}})
    metrics(run_dir, ["sglang_hicache_start", "sglang_hicache_busy"], "http://m/metrics")
    s = build_report(run_dir)
    assert s["wedge_checked"] is True and s["wedge_unchecked_reason"] is None
    assert (run_dir / "report.md").read_text().splitlines()[2].startswith("**CLEAN** — ")


def _cli_flags() -> set[str]:
    import typer

    from dsv4bench.cli import app

    flags: set[str] = set()

    def walk(cmd) -> None:
        for p in getattr(cmd, "params", []):
            flags.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    return flags


@pytest.mark.parametrize("path", [*sorted((ROOT / "dsv4bench" / "report").glob("*.py"))], ids=lambda p: p.name)
def test_every_flag_a_hint_names_exists(path: Path) -> None:
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", path.read_text()))
    assert named <= _cli_flags(), sorted(named - _cli_flags())


def test_a_harness_stall_is_reported_beside_the_turns_it_touched(run_folder, make_turn, event) -> None:
    calm = make_turn("s1", 0)
    stalled_ok, stalled_failed = (
        make_turn("s1", 1),
        make_turn("s2", 0, status="error", error="HTTP 500", verdicts=[("http_error", "")]),
    )
    stalled_ok.timings.harness_stall_ms, stalled_failed.timings.harness_stall_ms = 120.0, 1500.0
    clock = event(
        "harness_clock",
        30.0,
        tick_s=0.01,
        stall_s=0.05,
        ticks=3000,
        lag_p50_ms=0.3,
        lag_p99_ms=9.0,
        lag_max_ms=1500.0,
        stalls=2,
        stalled_s=1.62,
        longest_stall_s=1.5,
    )
    run_dir = run_folder([calm, stalled_ok, stalled_failed], events=[clock])
    summary = build_report(run_dir)
    h = summary["harness"]
    assert (h["stalls"], h["turns_stalled"], h["failed_stalled"], h["turn_stall_max_ms"]) == (2, 2, 1, 1500.0)
    md = (run_dir / "report.md").read_text()
    assert (
        "> **The harness itself stalled:** its event loop stood still 2 times (longest 1.50 s, 1.62 s in all; "
        "loop lag p50 / p99 0.3 / 9.0 ms)"
    ) in md
    assert "2 turns in flight then may be late by up to 1.50 s" in md and "1 turn of those failed" in md
    # Read back: the stall stays on the turn.
    assert [t.timings.harness_stall_ms for t in read_history(run_dir).turns] == [0.0, 120.0, 1500.0]


def test_a_run_whose_loop_never_stalled_has_no_stall_note(run_folder, make_turn, event) -> None:
    clock = event(
        "harness_clock",
        30.0,
        tick_s=0.01,
        stall_s=0.05,
        ticks=3000,
        lag_p50_ms=0.3,
        lag_p99_ms=2.0,
        lag_max_ms=20.0,
        stalls=0,
        stalled_s=0.0,
        longest_stall_s=0.0,
    )
    run_dir = run_folder([make_turn()], events=[clock])
    summary = build_report(run_dir)
    assert summary["harness"]["stalls"] == 0 and summary["harness"]["lag_p99_ms"] == 2.0
    assert "harness itself stalled" not in (run_dir / "report.md").read_text()
    assert build_report(run_folder([make_turn()]))["harness"] is None  # no clock recorded (older runs, Locust)
