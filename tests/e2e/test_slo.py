"""End to end: `agents --slo` against the known-bad replay server on loopback, and the figures of
summary.json and report.md checked against the turn timings computed by hand from the recorded
turns.jsonl, here, without report/slo.py; then the same history judged again against other
targets by `dsv4bench report --slo`, run.json left as the run wrote it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from dsv4bench.history.records import CORRUPTION_CODES

from .conftest import only_run_dir, run_cli


def _by_hand(run_dir: Path, ttft: float, itl: float, e2e: float) -> dict[str, Any]:
    """The figures docs/slo.md defines, from the raw records: killed and unjudged turns left out,
    failed and corrupt never good, each target met at or under it, ITL on the turn's mean gap."""
    records = [json.loads(x) for x in (run_dir / "turns.jsonl").read_text().splitlines()]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    counted = good = tokens = 0
    for r in records:
        if r["status"] == "killed" or (r["status"] == "ok" and r["check_errors"]):
            continue
        counted += 1
        corrupt = any(v["code"] in CORRUPTION_CODES for v in r["verdicts"])
        if r["status"] != "ok" or corrupt:
            continue
        t = r["timings"]
        gaps = t["token_gaps_ms"]
        if (
            (t["first_token_ns"] - t["start_ns"]) / 1e9 <= ttft
            and (not gaps or sum(gaps) / len(gaps) / 1e3 <= itl)
            and (t["end_ns"] - t["start_ns"]) / 1e9 <= e2e
        ):
            good += 1
            tokens += r["response"]["usage"]["completion_tokens"]
    start = min(e["t_wall_ns"] for e in events if e["kind"] == "run_start")
    end = max(e["t_wall_ns"] for e in events if e["kind"] == "run_end")
    duration = (end - start) / 1e9
    return {"turns": counted, "good": good, "tokens": tokens, "duration": duration, "records": records}


def _check(slo: dict[str, Any], hand: dict[str, Any]) -> None:
    assert (slo["turns"], slo["good"], slo["good_output_tokens"]) == (hand["turns"], hand["good"], hand["tokens"])
    assert slo["window_s"] == pytest.approx(hand["duration"])
    assert slo["goodput_turns_per_s"] == pytest.approx(hand["good"] / hand["duration"])
    assert slo["goodput_tokens_per_s"] == pytest.approx(hand["tokens"] / hand["duration"])
    assert slo["share"] == pytest.approx(hand["good"] / hand["turns"])


def test_slo_figures_match_the_recorded_timings_computed_by_hand(replay, tmp_path):
    out = tmp_path / "runs"
    r = run_cli(
        "agents",
        "--url",
        replay.url,
        "--concurrency",
        "4",
        "--sessions",
        "8",
        "--ttft-timeout",
        "3",
        "--quiet",
        "--out",
        str(out),
        "--slo",
        "ttft=2000ms,itl=0.5,e2e=5s",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = only_run_dir(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    slo = summary["slo"]
    assert slo["spec"] == "ttft=2s,itl=500ms,e2e=5s"  # written back whole, as run.json records it
    assert json.loads((run_dir / "run.json").read_text())["config"]["slo"] == slo["spec"]
    hand = _by_hand(run_dir, 2.0, 0.5, 5.0)
    _check(slo, hand)
    # The replay server plants corruption and stalls: some turns are counted and never good.
    assert slo["outcomes"]["corrupt"] > 0 and slo["good"] < slo["turns"]
    assert slo["window_s"] == summary["duration_s"]
    report = (run_dir / "report.md").read_text()
    assert f"| turns meeting every target | {hand['good']} of {hand['turns']} (" in report

    # Targets at the median recorded TTFT and E2E of the clean completed turns split them: the
    # report rebuilt from the history judges them again, by hand and by the tool alike.
    clean = [
        x["timings"]
        for x in hand["records"]
        if x["status"] == "ok" and not any(v["code"] in CORRUPTION_CODES for v in x["verdicts"])
    ]
    ttft = statistics.median((t["first_token_ns"] - t["start_ns"]) / 1e9 for t in clean)
    e2e = statistics.median((t["end_ns"] - t["start_ns"]) / 1e9 for t in clean)
    # A microsecond over each median, written in ms to the nanosecond: the median turns meet them.
    ttft_ms, e2e_ms = f"{ttft * 1e3 + 1e-3:.6f}", f"{e2e * 1e3 + 1e-3:.6f}"
    recorded = (run_dir / "run.json").read_bytes()
    again = run_cli("report", str(run_dir), "--slo", f"ttft={ttft_ms}ms,e2e={e2e_ms}ms")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (run_dir / "run.json").read_bytes() == recorded  # what the run was given stays as it was
    bad = run_cli("report", str(run_dir), "--slo", "ttft=fast")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "ttft" in bad.stdout + bad.stderr
    rebuilt = json.loads((run_dir / "summary.json").read_text())["slo"]
    _check(rebuilt, _by_hand(run_dir, float(ttft_ms) * 1e-3, float("inf"), float(e2e_ms) * 1e-3))
    assert 0 < rebuilt["good"] < rebuilt["outcomes"]["met"] + rebuilt["outcomes"]["missed"]
    assert rebuilt["outcomes"]["missed"] > 0
