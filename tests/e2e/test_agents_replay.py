"""End to end: the real CLI against a known-bad server on loopback, its findings compared
with the ground truth the server wrote while planting faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

from dsv4bench.history.codes import ANSWER_CHANGED_CODE, CODES
from dsv4bench.history.run_folder import read_history
from dsv4bench.history.records import CORRUPTION_CODES, REFERENCE_CODE

from .conftest import ROOT, only_run_dir, run_cli

# What a request asks of its answer (tool_choice, ...): judged by checks/request_compliance.py.
REQUEST_TERMS_CODES = {c.code for c in CODES if (c.checker or "").startswith("request_compliance.")}
# Other families' markup: this server writes DeepSeek-V4's; the replay server's --family writes
# theirs (test_agents_families.py).
OTHER_FAMILIES_CODES = {"markup_leak_content", "markup_leak_reasoning", "markup_in_arguments"}


def test_80_sessions_every_planted_fault_found_and_no_clean_turn_flagged(replay, tmp_path):
    out = tmp_path / "runs"
    r = run_cli(
        "agents",
        "--url",
        replay.url,
        "--concurrency",
        "80",
        "--sessions",
        "200",
        "--max-turns",
        "12",
        "--ttft-timeout",
        "10",
        "--total-timeout",
        "30",
        "--quiet",
        "--out",
        str(out),
        "--fail-on",
        "corruption",
    )
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stderr  # --fail-on corruption with planted corruption
    assert "CORRUPTION" in r.stdout
    run_dir = only_run_dir(out)
    h = read_history(run_dir)
    planted = replay.planted()
    assert h.complete and h.skipped_lines == 0

    # Every turn the harness recorded carries exactly the codes the server planted, and a
    # clean turn carries none.
    mismatches = []
    for t in h.turns:
        got = frozenset(v.code for v in t.verdicts)
        want = planted.get((t.session, t.turn), frozenset())
        if got != want:
            mismatches.append((t.session, t.turn, sorted(want), sorted(got), [v.detail for v in t.verdicts]))
    assert not mismatches, mismatches[:10]
    recorded = {(t.session, t.turn) for t in h.turns}
    assert set(planted) <= recorded, "a planted fault is missing from the history"

    sessions = {e["session"] for e in h.events if e["kind"] == "session_end"}
    assert len(sessions) == 200
    # Every failure shape was planted at least once, so each was really checked (a reference
    # mismatch needs a reference run: test_reference_run.py; an answer changed under load needs
    # --recheck: test_triage.py; a broken request term needs a
    # request that asked for it: test_request_mix.py, against its own known-bad server; other
    # families' markup: test_agents_families.py).
    shapes = Counter(code for codes in planted.values() for code in codes)
    assert set(shapes) >= (
        set(CORRUPTION_CODES)
        - {"garbled_text", REFERENCE_CODE, ANSWER_CHANGED_CODE}
        - REQUEST_TERMS_CODES
        - OTHER_FAMILIES_CODES
        | {"http_error", "timeout_ttft", "connection_error"}
    )
    assert shapes["garbled_text"] >= 1

    # summary.json counts exactly what was planted.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "CORRUPTION"
    assert {k: v for k, v in summary["counts"].items() if v} == dict(shapes)
    corrupt_turns = sum(1 for codes in planted.values() if codes & set(CORRUPTION_CODES))
    assert summary["turns"]["corrupt"] == corrupt_turns
    assert summary["turns"]["total"] == len(h.turns)
    # Failing turns keep their raw SSE and exact request; clean ones do not.
    for t in h.turns:
        if t.verdicts and t.status.value == "ok":
            assert t.raw_sse and t.request.get("body", {}).get("messages")
        if not t.verdicts:
            assert t.raw_sse is None and "body" not in t.request
    report = (run_dir / "report.md").read_text()
    assert "CORRUPTION" in report.split("\n\n")[1] or "CORRUPTION" in report[:400]
    assert "dsv4bench agents --url" in report

    # The same checkers offline, over the recorded turns, agree with the live run.
    a = run_cli("audit", str(run_dir / "turns.jsonl"), "--out", str(tmp_path / "audit.jsonl"))
    assert a.returncode == 0, a.stderr
    audited = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    live = [sorted({v.code for v in t.verdicts}) for t in h.turns]
    offline = [sorted({v["code"] for v in x["verdicts"]}) for x in audited]
    assert offline == live


def test_clean_server_gives_clean_report_without_stream(clean_replay, tmp_path):
    out = tmp_path / "runs"
    r = run_cli(
        "agents",
        "--url",
        clean_replay.url,
        "--concurrency",
        "4",
        "--sessions",
        "6",
        "--no-stream",
        "--quiet",
        "--out",
        str(out),
        "--fail-on",
        "corruption,errors",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((only_run_dir(out) / "summary.json").read_text())
    assert summary["verdict"] == "CLEAN" and summary["turns"]["corrupt"] == 0 and summary["turns"]["total"] >= 30


def test_sessions_end_before_the_context_is_full_and_the_report_stays_clean(clean_replay, tmp_path):
    """A context too small for a second turn: every session ends context_full after its first,
    no request is refused, and the verdict is CLEAN (the workload, not the server, ran out)."""
    out = tmp_path / "runs"
    r = run_cli(
        "agents",
        "--url",
        clean_replay.url,
        "--concurrency",
        "4",
        "--sessions",
        "6",
        "--max-tokens",
        "1000",
        "--context-length",
        "1100",
        "--quiet",
        "--out",
        str(out),
        "--fail-on",
        "corruption,errors",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((only_run_dir(out) / "summary.json").read_text())
    assert summary["verdict"] == "CLEAN" and summary["turns"]["error"] == 0
    ended = summary["sessions"]["ended_by"]
    assert ended.get("context_full", 0) >= 1 and sum(ended.values()) == 6
    bad = run_cli(
        "agents", "--url", clean_replay.url, "--sessions", "1", "--context-length", "500", "--quiet", "--out", str(out)
    )
    assert bad.returncode == 2 and "--context-length must be more than --max-tokens" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_kill_9_leaves_a_history_that_report_renders(replay, tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "agents",
            "--url",
            replay.url,
            "--concurrency",
            "16",
            "--duration",
            "120",
            "--ttft-timeout",
            "10",
            "--quiet",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    turns_file = None
    while time.monotonic() < deadline:
        runs = list(out.glob("*/turns.jsonl")) if out.exists() else []
        if runs and len(runs[0].read_text().splitlines()) >= 40:
            turns_file = runs[0]
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert turns_file is not None, "the run never got going"
    run_dir = turns_file.parent
    assert not (run_dir / "report.md").exists()
    r = run_cli("report", str(run_dir))
    assert r.returncode == 0, r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["partial"] is True and summary["turns"]["total"] >= 40
    assert (run_dir / "report.md").read_text().strip()


def test_ctrl_c_writes_the_report_and_exits_130(clean_replay, tmp_path):
    """Ctrl-C mid-run: the report of what ran is written, and the exit code says the run did not
    finish (a shell's 130), not a verdict of 0 that a script would read as a whole clean run."""
    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "agents",
            "--url",
            clean_replay.url,
            "--concurrency",
            "8",
            "--duration",
            "120",
            "--quiet",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        len(p.read_text().splitlines()) >= 8 for p in (out.glob("*/turns.jsonl") if out.exists() else [])
    ):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "interrupted" in stderr
    run_dir = only_run_dir(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["end_reason"] == "interrupted" and summary["turns"]["total"] >= 8
    assert (run_dir / "report.md").is_file() and str(run_dir / "report.md") in stdout


def test_raw_oracle_agrees_on_clean_turns_and_disagrees_on_leaks(replay, tmp_path):
    out = tmp_path / "runs"
    r = run_cli(
        "agents",
        "--url",
        replay.url,
        "--concurrency",
        "8",
        "--sessions",
        "24",
        "--raw",
        "--ttft-timeout",
        "10",
        "--quiet",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    h = read_history(only_run_dir(out))
    planted = replay.planted()
    leaks = 0
    for t in h.turns:
        codes = {v.code for v in t.verdicts}
        want = planted.get((t.session, t.turn), frozenset())
        if not want:
            assert codes == set(), (t.session, t.turn, t.verdicts)
        if "dsml_leak_content" in want and t.status.value == "ok":
            # The server's parser left markup in content; DeepSeek's parser reads a tool call.
            leaks += 1
            assert "parser_disagreement" in codes, t.verdicts
    assert len(h.turns) > 100 and leaks >= 1


def test_open_model_poisson_arrivals_run_every_session(clean_replay, tmp_path):
    out = tmp_path / "runs"
    r = run_cli(
        "agents",
        "--url",
        clean_replay.url,
        "--rate",
        "40",
        "--concurrency",
        "16",
        "--sessions",
        "20",
        "--scenario",
        "data",
        "--quiet",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    h = read_history(only_run_dir(out))
    starts = [e for e in h.events if e["kind"] == "session_start"]
    assert len(starts) == 20 and {e["scenario"] for e in starts} == {"data"}
    assert json.loads((h.run_dir / "summary.json").read_text())["verdict"] == "CLEAN"
