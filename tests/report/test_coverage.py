"""What a run could not have found (summary.json's `coverage`), both ways: each gap said where it
holds and absent where the run did exercise it, on literal runs and recorded /metrics pages; and
the short form said beside a CLEAN verdict, in report.md's headline and the CLI's verdict line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bench.cli import common
from dsv4bench.history.run_folder import read_history
from dsv4bench.report import render_report
from dsv4bench.report.coverage import coverage_gaps, short_gaps
from dsv4bench.report.summary import summarize

# An agents run's config as RunConfig.to_json() writes it, with every flag a gap is about off.
AGENTS_CONFIG = {
    "concurrency": 8,
    "kill": [],
    "recheck": 0.0,
    "reference": None,
    "metrics": ["http://127.0.0.1:30000/metrics"],
    "context": "short",
    "cache_pressure": None,
}


def agents_run(**config: object) -> dict:
    return {"run": "r", "command": "dsv4bench agents", "config": {**AGENTS_CONFIG, **config}}


def report(run_dir: Path) -> tuple[dict, str]:
    """The run's summary and report.md's text (no plots: they cost a third of a second each)."""
    history = read_history(run_dir)
    summary = summarize(history)
    return summary, render_report(history, summary, [])


def headline(run_dir: Path) -> str:
    return report(run_dir)[1].splitlines()[2]


def gaps_of(run_dir: Path) -> list[str]:
    return [g["gap"] for g in summarize(read_history(run_dir))["coverage"]]


def test_a_run_whose_pool_was_never_full_says_no_eviction_reached(run_folder, make_turn, metrics) -> None:
    run_dir = metrics(run_folder([make_turn()], run=agents_run()), ["sglang_radix_start", "sglang_radix_fit"])
    summary, text = report(run_dir)
    gap = summary["coverage"][0]
    assert gap["gap"] == "no eviction reached"
    assert gap["flag"] == "--cache-pressure 2 or --context swe"
    assert "fit the device KV pool" in gap["why"]
    assert text.splitlines()[2].startswith("**CLEAN** (not exercised: eviction, recheck, kills) — ")


def test_the_cli_verdict_line_names_what_a_clean_run_did_not_exercise(
    run_folder, make_turn, metrics, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = metrics(run_folder([make_turn()], run=agents_run()), ["sglang_radix_start", "sglang_radix_fit"])
    common.print_verdict(report(run_dir)[0], run_dir)
    assert "CLEAN (not exercised: eviction, recheck, kills)  turns 1" in capsys.readouterr().out


def test_a_run_with_evictions_and_host_loads_has_no_pressure_gap(run_folder, make_turn, metrics) -> None:
    run = agents_run(kill=["all@20s,restart"], recheck=0.3)
    run_dir = metrics(run_folder([make_turn()], run=run), ["sglang_hicache_start", "sglang_hicache_busy"])
    summary, text = report(run_dir)
    assert summary["coverage"] == []
    assert text.splitlines()[2].startswith("**CLEAN** — ")
    assert "Nothing known:" in text


def test_hicache_off_never_says_host_tier_never_read(run_folder, make_turn, metrics) -> None:
    # HiCache off (no host series) and the pool ran out: eviction reached, and no host tier to read.
    run_dir = metrics(run_folder([make_turn()], run=agents_run()), ["sglang_radix_start", "sglang_radix_evicted"])
    gaps = gaps_of(run_dir)
    assert "host tier never read" not in gaps and "no eviction reached" not in gaps
    assert gaps == ["answers changed by load not compared", "no kills"]


def test_eviction_without_host_reads_says_host_tier_never_read() -> None:
    summary = {"wedge_checked": True, "cache": {"eviction_reached": True, "host_reads_reached": False}}
    gaps = coverage_gaps(summary, agents_run())
    assert gaps[0]["gap"] == "host tier never read"
    assert short_gaps(gaps) == "not exercised: host-tier reads, recheck, kills"


def test_no_metrics_says_wedges_not_checked_and_nothing_of_eviction(run_folder, make_turn) -> None:
    summary, _ = report(run_folder([make_turn()], run=agents_run(metrics=[])))
    assert [g["gap"] for g in summary["coverage"]] == [
        "wedges not checked",
        "answers changed by load not compared",
        "no kills",
    ]
    wedges = summary["coverage"][0]
    assert wedges["flag"] == "--metrics URL" and "no --metrics endpoint" in wedges["why"]


def test_the_headline_says_wedges_once(run_folder, make_turn) -> None:
    line = headline(run_folder([make_turn()], run=agents_run(metrics=[])))
    assert line.startswith("**CLEAN** (wedge not checked: no --metrics endpoint; not exercised: recheck, kills) — ")
    assert line.count("wedge") == 1


def test_a_server_without_an_eviction_counter_says_eviction_not_measured(run_folder, make_turn, metrics) -> None:
    run_dir = metrics(run_folder([make_turn()], run=agents_run()), ["vllm_v1_start", "vllm_v1_busy"])
    gap = summarize(read_history(run_dir))["coverage"][0]
    assert gap["gap"] == "eviction not measured"
    assert gap["flag"] == "--cache-pressure 2"  # the pool is known (vLLM's cache_config_info): no --kv-pool-tokens


def test_eviction_not_measured_without_a_pool_asks_for_one() -> None:
    summary = {
        "wedge_checked": True,
        "cache": {"eviction_reached": None, "pool": None, "servers": {"x": {"scrapes": 3}}},
    }
    assert coverage_gaps(summary, agents_run())[0]["flag"] == "--kv-pool-tokens N --cache-pressure 2"
    # Nothing scraped: the wedge gap says so, and no eviction gap is made up.
    unscraped = {"wedge_checked": False, "cache": {"eviction_reached": None, "servers": {"x": {"scrapes": 0}}}}
    assert [g["gap"] for g in coverage_gaps(unscraped, agents_run())][0] == "wedges not checked"


def test_kills_given_leave_no_kills_gap() -> None:
    summary = {"wedge_checked": True, "cache": None}
    assert "no kills" in [g["gap"] for g in coverage_gaps(summary, agents_run())]
    assert "no kills" not in [g["gap"] for g in coverage_gaps(summary, agents_run(kill=["frac=0.25/every=10s"]))]


def test_a_mode_without_the_flags_gets_no_gap_about_them() -> None:
    # A proxy run's config has no kill, recheck or cache_pressure: its user cannot add them there.
    proxy = {"config": {"upstream": "http://127.0.0.1:30000/v1", "capture": True}}
    summary = {"wedge_checked": True, "cache": {"eviction_reached": False}}
    gaps = coverage_gaps(summary, proxy)
    assert [g["gap"] for g in gaps] == ["no eviction reached"]
    assert gaps[0]["flag"] == "dsv4bench agents --cache-pressure 2"


def test_a_run_sized_and_still_short_of_the_pool_is_told_to_press_harder() -> None:
    summary = {"wedge_checked": True, "cache": {"eviction_reached": False}}
    assert coverage_gaps(summary, agents_run(cache_pressure=1.5))[0]["flag"] == "--cache-pressure 3"


def test_recheck_on_a_server_that_is_not_deterministic() -> None:
    triage = {"determinism": {"deterministic": False, "detail": "answered two ways"}, "findings": []}
    summary = {"wedge_checked": True, "cache": None, "triage": triage}
    gaps = coverage_gaps(summary, agents_run(recheck=0.3, kill=["all@20s"]))
    assert [g["gap"] for g in gaps] == ["server not deterministic"]
    assert "only well-formedness was judged" in gaps[0]["why"]
    deterministic = {**summary, "triage": {"determinism": {"deterministic": True}}}
    assert coverage_gaps(deterministic, agents_run(recheck=0.3, kill=["all@20s"])) == []


def test_a_reference_run_compares_answers() -> None:
    summary = {"wedge_checked": True, "cache": None}
    gaps = [g["gap"] for g in coverage_gaps(summary, agents_run(reference="/runs/ref"))]
    assert "answers changed by load not compared" not in gaps and "no kills" in gaps


def test_gaps_keep_their_order_and_shape() -> None:
    summary = {"wedge_checked": False, "wedge_unchecked_reason": "only a router was scraped"}
    summary["cache"] = {"eviction_reached": False}
    gaps = coverage_gaps(summary, agents_run())
    assert [g["gap"] for g in gaps] == [
        "no eviction reached",
        "wedges not checked",
        "answers changed by load not compared",
        "no kills",
    ]
    assert all(list(g) == ["gap", "why", "flag"] and all(g.values()) for g in gaps)
    assert short_gaps(gaps) == "not exercised: eviction, wedges, recheck, kills"
    assert short_gaps(gaps, ("wedges not checked",)) == "not exercised: eviction, recheck, kills"
    assert short_gaps([]) == ""


def test_a_corrupt_run_keeps_its_headline_plain(run_folder, make_turn) -> None:
    turns = [make_turn(verdicts=[("args_not_json", "tool_calls[0].arguments")])]
    summary, text = report(run_folder(turns, run=agents_run()))
    assert summary["coverage"]  # the gaps are still listed in the file and the report
    assert text.splitlines()[2].startswith("**CORRUPTION** — ")
    assert "## What this run could not have found" in text
