"""summary.json's `cache` block on literal histories: where each turn's prompt prefix came from
(from usage dicts as servers write them), the working set the sessions held, and the pressure
each server's recorded /metrics pages say the run reached."""

from __future__ import annotations

import pytest

from dsv4bench.history.run_folder import read_history
from dsv4bench.report.cache_summary import (
    cached_tokens,
    cache_block,
    prefix_source,
    working_set_peak,
)
from dsv4bench.report.summary import summarize

# Usage as the servers write it, one per prefix source (SGLang's split by tier where it was asked).
HOST_USAGE = {"prompt_tokens": 9000, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 8000}}
HOST_TIERS = {"device": 3000, "host": 5000}
DEVICE_USAGE = {"prompt_tokens": 6000, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 4000}}
COLD_USAGE = {"prompt_tokens": 1200, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 0}}
PLAIN_USAGE = {"prompt_tokens": 1500, "completion_tokens": 10}  # a server that reports no cached figure


@pytest.mark.parametrize(
    ("usage", "tiers", "source"),
    [
        (HOST_USAGE, HOST_TIERS, "host"),
        (DEVICE_USAGE, None, "device"),
        (DEVICE_USAGE, {"device": 4000, "host": 0}, "device"),  # split by tier, none of it from host
        (COLD_USAGE, {"device": 0, "host": 0}, "computed"),
        (PLAIN_USAGE, None, "computed"),
        (None, None, "unknown"),
        ({"completion_tokens": 5}, None, "unknown"),  # usage without the prompt's figures
        (None, {"device": 700, "host": 0}, "device"),  # the split alone says it was cached
    ],
)
def test_prefix_source_from_literal_usage(make_turn, usage, tiers, source) -> None:
    assert prefix_source(make_turn(usage=usage, cached_tokens_details=tiers)) == source


def test_cached_tokens_reads_usage_then_the_split_by_tier(make_turn) -> None:
    assert cached_tokens(make_turn(usage=HOST_USAGE, cached_tokens_details=HOST_TIERS)) == 8000
    assert cached_tokens(make_turn(usage=PLAIN_USAGE, cached_tokens_details={"device": 300, "host": 200})) == 500
    assert cached_tokens(make_turn(usage=PLAIN_USAGE)) is None
    # A figure that is no count (hand-edited, or a server's bug) is no figure.
    assert cached_tokens(make_turn(usage={"prompt_tokens_details": {"cached_tokens": "many"}})) is None


def test_findings_split_by_where_the_prefix_came_from(run_folder, make_turn) -> None:
    turns = [
        make_turn("s1", 0, usage=COLD_USAGE, start_s=0),
        make_turn(
            "s1",
            1,
            usage=HOST_USAGE,
            cached_tokens_details=HOST_TIERS,
            start_s=2,
            verdicts=[("args_not_json", "tool_calls[0].arguments")],
        ),
        make_turn("s2", 0, usage=DEVICE_USAGE, start_s=1),
        make_turn("s2", 1, start_s=3),  # no usage
        make_turn("s3", 0, status="error", error="HTTP 503", start_s=1),  # not completed: not classified
    ]
    cache = summarize(read_history(run_folder(turns)))["cache"]
    sources = cache["prefix_sources"]
    assert list(sources) == ["host", "device", "computed", "unknown"]
    assert sources["host"] == {"total": 1, "ok": 1, "good": 0, "killed": 0, "corrupt": 1, "error": 0}
    assert (sources["device"]["total"], sources["device"]["corrupt"]) == (1, 0)
    assert (sources["computed"]["total"], sources["unknown"]["total"]) == (1, 1)
    assert sum(g["total"] for g in sources.values()) == 4
    assert cache["cached_tokens_per_turn"]["n"] == 3 and cache["cached_tokens_per_turn"]["max"] == 8000
    # Deepest prompt per session: s1 9,000, s2 6,000 (its second turn reported none).
    deepest = cache["deepest_prompt_per_session"]
    assert (deepest["n"], deepest["max"], deepest["p50"]) == (2, 9000, 7500)
    assert deepest["p95"] == pytest.approx(8850)


def test_working_set_peak_counts_only_sessions_still_open(make_turn) -> None:
    def turn(session, n, start_s, prompt, completion):
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        return make_turn(session, n, start_s=start_s, e2e_s=1.0, usage=usage)

    # Ends: s1/0 at 1 s, s2/0 at 2 s, s1/1 at 3 s (s1's last), s2/1 at 5 s.
    overlapping = [
        turn("s1", 0, 0, 100, 10),
        turn("s2", 0, 1, 200, 20),
        turn("s1", 1, 2, 300, 30),
        turn("s2", 1, 4, 400, 40),
    ]
    assert working_set_peak(overlapping) == 330 + 220  # s1's latest and s2's latest, at 3 s
    # One after the other: a session past its last turn holds nothing any more.
    apart = [
        turn("s1", 0, 0, 100, 10),
        turn("s1", 1, 2, 300, 30),
        turn("s2", 0, 10, 200, 20),
        turn("s2", 1, 12, 250, 25),
    ]
    assert working_set_peak(apart) == 330
    assert working_set_peak([make_turn()]) is None  # no turn reported its prompt


def test_a_server_that_evicted_and_read_back_from_host(run_folder, make_turn, metrics) -> None:
    run_dir = metrics(
        run_folder([make_turn()]), ["sglang_hicache_start", "sglang_hicache_busy", "sglang_hicache_drained"]
    )
    cache = summarize(read_history(run_dir))["cache"]
    assert (cache["eviction_reached"], cache["host_reads_reached"]) == (True, True)
    (server,) = cache["servers"].values()
    assert server["evicted_tokens"] == 252000 and server["load_back_tokens"] == 41000
    assert server["eviction_reached"] is True and server["host_reads_reached"] is True
    assert "timeline" not in server and server["scrapes"] == 3
    # No pool in the server's facts: the largest one a scrape gave, and where it came from.
    assert cache["pool"] == {"tokens": 412000, "source": "scraped from http://127.0.0.1:30000/metrics"}


def test_a_pool_never_full_and_hicache_off(run_folder, make_turn, metrics) -> None:
    run = {"run": "r", "server": {"kv_pool": {"tokens": 500000, "source": "/get_server_info max_total_num_tokens"}}}
    run_dir = metrics(run_folder([make_turn()], run=run), ["sglang_radix_start", "sglang_radix_fit"])
    cache = summarize(read_history(run_dir))["cache"]
    assert cache["eviction_reached"] is False
    assert cache["host_reads_reached"] is None  # no host tier: neither reached nor not
    assert cache["pool"] == {"tokens": 500000, "source": "/get_server_info max_total_num_tokens"}  # facts win


def test_run_level_flags_from_several_servers(run_folder, make_turn, metrics) -> None:
    run_dir = run_folder([make_turn()])
    metrics(run_dir, ["sglang_radix_start", "sglang_radix_fit"], "http://prefill:30000/metrics")
    metrics(run_dir, ["sglang_radix_start", "sglang_radix_evicted"], "http://decode:30000/metrics", append=True)
    cache = summarize(read_history(run_dir))["cache"]
    assert [s["eviction_reached"] for s in cache["servers"].values()] == [False, True]
    assert cache["eviction_reached"] is True  # any server that evicted


def test_a_server_that_exports_no_eviction_counter(run_folder, make_turn, metrics) -> None:
    run_dir = metrics(run_folder([make_turn()]), ["vllm_v1_start", "vllm_v1_busy"])
    cache = summarize(read_history(run_dir))["cache"]
    assert cache["eviction_reached"] is None and cache["host_reads_reached"] is None


def test_no_turns_and_no_metrics_is_no_block(run_folder) -> None:
    history = read_history(run_folder([], run={}))
    assert cache_block(history) is None
    assert summarize(history)["cache"] is None


def test_a_plan_is_kept_as_the_run_made_it(run_folder, make_turn) -> None:
    plan = {"pressure": 2.0, "pool_tokens": 400000, "pool_source": "--kv-pool-tokens", "working_set": 800000}
    cache = summarize(read_history(run_folder([make_turn()], run={"run": "r", "server": {"cache_plan": plan}})))[
        "cache"
    ]
    assert cache["plan"] == plan
    assert cache["pool"] == {"tokens": 400000, "source": "--kv-pool-tokens"}  # no facts' pool: the plan's
    assert cache["servers"] == {} and cache["eviction_reached"] is None
