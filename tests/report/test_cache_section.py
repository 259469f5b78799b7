"""report.md's "Cache pressure" and "What this run could not have found" sections, and the KV
cache plot, on recorded /metrics pages and literal turns; a server's text stays inert in them."""

from __future__ import annotations

from pathlib import Path

from dsv4bench.history.run_folder import read_history
from dsv4bench.report import render_report
from dsv4bench.report.cache_section import cache_section, coverage_section
from dsv4bench.report import plots
from dsv4bench.report.plots import PLOTS_DIR, kv_cache_figure, render_plots
from dsv4bench.report.summary import summarize

PLAN = {
    "pressure": 2.0,
    "pool_tokens": 412000,
    "pool_source": "/get_server_info max_total_num_tokens",
    "concurrency": 16,
    "context_tokens": 131072,
    "context": "swe",
    "mean_depth": 51500,
    "working_set": 824000,
    "reached": 2.0,
    "sessions": None,
}


def section_text(run_dir: Path) -> str:
    return "\n".join(cache_section(summarize(read_history(run_dir))))


def test_a_hicache_run_shows_what_each_figure_reached(run_folder, make_turn, metrics) -> None:
    usage = {"prompt_tokens": 9000, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 8000}}
    turns = [make_turn(usage=usage, cached_tokens_details={"device": 3000, "host": 5000})]
    run_dir = run_folder(turns, run={"run": "r", "server": {"cache_plan": PLAN}})
    text = section_text(metrics(run_dir, ["sglang_hicache_start", "sglang_hicache_busy", "sglang_hicache_drained"]))
    assert text.startswith("## Cache pressure")
    assert "Device KV pool: 412,000 tokens (/get_server_info max_total_num_tokens)." in text
    assert (
        "Plan (`--cache-pressure 2`): 16 sessions at once, context profile swe, working set 824,000 tokens = 2x" in text
    )
    assert "Eviction from the device pool: reached. Reads back from the host tier: reached." in text
    assert "| tokens evicted from the device pool | 252,000 |" in text
    assert "| tokens loaded back from host | 41,000 |" in text
    assert "| host used peak / host total | 702,000 / 1,600,000 |" in text
    assert "| KV used peak / pool | 398,000 / 412,000 |" in text
    assert "| preemptions | 3 |" in text
    assert "| `host` | 1 | 1 | 0 | 0.0% |" in text
    assert "| deepest prompt per session | 1 | 9,000 | 9,000 | 9,000 |" in text


def test_hicache_off_and_a_server_without_the_counters(run_folder, make_turn, metrics) -> None:
    radix = section_text(metrics(run_folder([make_turn()]), ["sglang_radix_start", "sglang_radix_fit"]))
    assert "Eviction from the device pool: **not reached**." in radix
    assert "| tokens loaded back from host | no host tier |" in radix
    vllm = section_text(metrics(run_folder([make_turn()]), ["vllm_v1_start", "vllm_v1_busy"]))
    assert "| tokens evicted from the device pool | not exported |" in vllm
    assert "Eviction from the device pool: not measured." in vllm


def test_no_metrics_says_the_servers_cache_is_not_known(run_folder, make_turn) -> None:
    text = section_text(run_folder([make_turn()]))
    assert "No server's /metrics was scraped" in text and "`--metrics URL`" in text
    assert "Device KV pool: not known" in text


def test_an_endpoint_and_a_pool_source_stay_inert(run_folder, make_turn, metrics) -> None:
    run = {"run": "r", "server": {"kv_pool": {"tokens": 1000, "source": "<img src=x> *bold*"}}}
    endpoint = "http://h/metrics` <b>x</b>"
    run_dir = metrics(run_folder([make_turn()], run=run), ["sglang_radix_start", "sglang_radix_fit"], endpoint)
    text = section_text(run_dir)
    assert "<img" not in text and "(&lt;img src=x&gt; \\*bold\\*)" in text
    assert "`` http://h/metrics` <b>x</b> ``" in text  # a code span no backtick inside can end


def test_coverage_section_gives_each_gap_its_flag() -> None:
    gaps = [
        {"gap": "no eviction reached", "why": "It fit.", "flag": "--cache-pressure 2 or --context swe"},
        {"gap": "server not deterministic", "why": "Two answers.", "flag": "a deterministic server"},
    ]
    lines = coverage_section({"coverage": gaps})
    assert lines[0] == "## What this run could not have found"
    assert lines[2] == "- **no eviction reached**: It fit. To change it: `--cache-pressure 2` or `--context swe`."
    assert lines[3] == "- **server not deterministic**: Two answers. To change it: a deterministic server."
    assert coverage_section({"coverage": []})[2].startswith("Nothing known:")
    assert coverage_section({}) == []  # a summary from before coverage was kept


def test_the_sections_follow_the_server_and_precede_the_codes(run_folder, make_turn) -> None:
    history = read_history(run_folder([make_turn()]))
    text = render_report(history, summarize(history), [])
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    at = headings.index("## Cache pressure")
    assert headings[at - 1] == "## Server"
    assert headings[at + 1 : at + 3] == ["## What this run could not have found", "## Verdict codes"]


def test_the_kv_cache_plot_is_drawn_only_from_a_timeline(run_folder, make_turn, metrics, monkeypatch) -> None:
    assert kv_cache_figure(read_history(run_folder([make_turn()]))) is None  # no scrape, no plot
    # Only this plot drawn: the others cost a third of a second each and are tested elsewhere.
    monkeypatch.setattr(plots, "PLOTS", {"kv_cache.png": kv_cache_figure})
    run_dir = metrics(run_folder([make_turn()]), ["sglang_hicache_start", "sglang_hicache_busy"])
    history = read_history(run_dir)
    written = render_plots(history, run_dir)
    assert written == [f"{PLOTS_DIR}/kv_cache.png"]
    assert (run_dir / PLOTS_DIR / "kv_cache.png").read_bytes().startswith(b"\x89PNG")
    assert "![kv cache](plots/kv_cache.png)" in render_report(history, summarize(history), written)
