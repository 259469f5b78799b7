"""The cache pressure a run reached, read from metrics.jsonl records built from recorded /metrics
pages (tests/fixtures/metrics_text): SGLang with HiCache on and off, vLLM V1, a restart, two
data-parallel ranks; each failure beside its clean look-alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dsv4bench.servers.cache_pressure import TIMELINE_POINTS, CachePressure, cache_pressure
from dsv4bench.servers.dialect import per_rank
from dsv4bench.servers.monitor import MetricSample, parse_metrics

PAGES = Path(__file__).parent / "fixtures" / "metrics_text"
EP = "http://127.0.0.1:30000/metrics"
STEP_NS = 5 * 10**9
T0_NS = 7 * 10**12


def text(name: str) -> str:
    return (PAGES / f"{name}.prom").read_text()


def scrape(name: str) -> dict[str, float]:
    return parse_metrics(text(name))


def without(name: str, needle: str) -> dict[str, float]:
    """A page's scrape less every line that names `needle`."""
    return parse_metrics("".join(line for line in text(name).splitlines(keepends=True) if needle not in line))


def record(i: int, values: dict[str, float] | None, endpoint: str = EP) -> dict[str, object]:
    """The metrics.jsonl record of the i-th scrape of `endpoint`; None: a failed one."""
    t_wall, t = 1_765_051_200 * 10**9 + i * STEP_NS, T0_NS + i * STEP_NS
    if values is None:
        return MetricSample(t_wall, t, endpoint, False, error="ConnectError: [Errno 111] Connection refused").as_dict()
    return MetricSample(t_wall, t, endpoint, True, values=values).as_dict()


def run(*pages: dict[str, float]) -> CachePressure:
    return cache_pressure(record(i, v) for i, v in enumerate(pages))[EP]


# --- SGLang with HiCache on -------------------------------------------------------------------------


def test_sglang_hicache_run_that_evicted_and_read_back_from_host() -> None:
    p = run(scrape("sglang_hicache_start"), scrape("sglang_hicache_busy"), scrape("sglang_hicache_drained"))
    assert p.evicted_tokens == 260000 - 8000 and p.eviction_reached is True
    # The load-back series appeared during the run (SGLang creates it at the first load-back): from zero.
    assert p.load_back_tokens == 41000 and p.host_reads_reached is True
    assert (p.host_used_tokens_max, p.host_total_tokens) == (702000, 1600000)
    assert p.kv_used_tokens_max == 398000  # the peak, not the drained last value
    assert (p.kv_total_tokens, p.evictable_tokens_max) == (412000, 381000)
    assert p.cached_tokens == (92000 - 30000) + 45000  # device and host hits add up
    assert p.prompt_tokens == 262000 - 52000
    assert p.cache_hit_rate == pytest.approx(107000 / 210000)
    assert p.preemptions == 3  # retracted during the run
    assert (p.spec_accept_first, p.spec_accept_min, p.spec_accept_last) == (None, None, None)
    assert (p.counter_resets, p.scrapes) == (0, 3)
    assert p.timeline == ((0.0, 0.0, 0.0, 0.0), (5.0, 398000, 252000, 41000), (10.0, 0.0, 252000, 41000))


def test_sglang_hicache_run_whose_working_set_fit_reached_neither() -> None:
    # Counters that stay put: exported, and no pressure.
    p = run(scrape("sglang_hicache_busy"), scrape("sglang_hicache_drained"))
    assert (p.evicted_tokens, p.eviction_reached) == (0, False)
    assert (p.load_back_tokens, p.host_reads_reached) == (0, False)


def test_load_back_reads_the_device_kv_pool_only() -> None:
    # A hybrid model's host pools count the same tokens again (pool="mamba").
    def with_mamba(name: str, value: float) -> dict[str, float]:
        values = scrape(name)
        kv = next(s for s in values if s.startswith("sglang:load_back_tokens_total{"))
        return {**values, kv.replace('pool="kv"', 'pool="mamba"'): value}

    p = run(
        scrape("sglang_hicache_start"),
        with_mamba("sglang_hicache_busy", 900),
        with_mamba("sglang_hicache_drained", 950),
    )
    assert p.load_back_tokens == 41000


def test_used_tokens_from_the_usage_fraction_where_only_it_is_there() -> None:
    busy = without("sglang_hicache_busy", "_used_tokens{")
    assert not any("used_tokens{" in s and "hicache" not in s for s in busy)
    p = run(without("sglang_hicache_start", "_used_tokens{"), busy)
    assert p.kv_used_tokens_max == pytest.approx(0.966 * 412000)


def test_sglang_speculative_acceptance_from_its_gauge_only_where_it_ran() -> None:
    def spec(name: str, rate: float, length: float) -> dict[str, float]:
        page = text(name).replace(
            "} 0.0\n# HELP sglang:spec_accept_rate", f"}} {length}\n# HELP sglang:spec_accept_rate"
        )
        page = page.replace("} 0.0\n# HELP sglang:num_retracted_reqs", f"}} {rate}\n# HELP sglang:num_retracted_reqs")
        return parse_metrics(page)

    p = run(
        spec("sglang_hicache_start", 0.0, 0.0),
        spec("sglang_hicache_busy", 0.71, 3.1),
        spec("sglang_hicache_drained", 0.64, 2.9),
    )
    # The start logged no speculation (length 0): its rate of 0 is no rate.
    assert (p.spec_accept_first, p.spec_accept_min, p.spec_accept_last) == (0.71, 0.64, 0.64)


# --- SGLang with HiCache off ------------------------------------------------------------------------


def test_hicache_off_has_no_host_tier_rather_than_no_host_reads() -> None:
    p = run(scrape("sglang_radix_start"), scrape("sglang_radix_fit"))
    assert p.load_back_tokens is None and p.host_reads_reached is None
    assert p.host_used_tokens_max is None and p.host_total_tokens is None
    # Never evicted: SGLang shows no eviction series, and a release that exports the evictable
    # gauge counts evictions, so this is none, not unknown.
    assert (p.evicted_tokens, p.eviction_reached) == (0, False)
    assert p.preemptions == 0
    assert [pt[2:] for pt in p.timeline] == [(0.0, None), (0.0, None)]


def test_hicache_off_look_alike_that_ran_out_of_pool() -> None:
    p = run(scrape("sglang_radix_start"), scrape("sglang_radix_fit"), scrape("sglang_radix_evicted"))
    assert (p.evicted_tokens, p.eviction_reached) == (51200, True)
    assert p.host_reads_reached is None
    assert p.preemptions == 2
    assert p.kv_used_tokens_max == 404200


def test_a_release_without_the_evictable_gauge_cannot_tell_no_eviction() -> None:
    p = run(without("sglang_radix_start", "kv_evictable"), without("sglang_radix_fit", "kv_evictable"))
    assert (p.evicted_tokens, p.eviction_reached, p.preemptions) == (None, None, None)
    # Its look-alike whose eviction series shows: that it exports.
    q = run(without("sglang_radix_start", "kv_evictable"), without("sglang_radix_evicted", "kv_evictable"))
    assert q.eviction_reached is True


# --- vLLM ---------------------------------------------------------------------------------------------


def test_vllm_run() -> None:
    p = run(scrape("vllm_v1_start"), scrape("vllm_v1_busy"))
    assert p.kv_total_tokens == 27125 * 16
    assert p.kv_used_tokens_max == pytest.approx(0.93 * 27125 * 16)
    # vLLM counts no evicted tokens and has no host tier: unknown, never "no eviction".
    assert (p.eviction_reached, p.host_reads_reached, p.evictable_tokens_max) == (None, None, None)
    assert p.preemptions == 14
    # 0.9 exports each counter under its old name too: counted once.
    assert p.cached_tokens == 300000 - 60000
    assert p.prompt_tokens == 510000 - 118000
    assert p.cache_hit_rate == pytest.approx(240000 / 400000)  # hits / queries
    assert (p.spec_accept_first, p.spec_accept_min, p.spec_accept_last) == (0.6, 0.6, 0.6)


def test_a_restart_is_neither_negative_pressure_nor_counted_twice() -> None:
    clean = run(scrape("vllm_v1_start"), scrape("vllm_v1_busy"))
    p = run(scrape("vllm_v1_start"), scrape("vllm_v1_busy"), scrape("vllm_v1_restarted"))
    assert clean.counter_resets == 0
    # Each counter that fell: hits, queries, prompt, preemptions, accepted and draft tokens.
    assert p.counter_resets == 6
    assert p.cached_tokens == 240000 + 2000
    assert p.prompt_tokens == 392000 + 7900
    assert p.preemptions == 14  # 14, then a new process at 0: not -14
    assert p.cache_hit_rate == pytest.approx(242000 / 408000)
    assert (p.spec_accept_first, p.spec_accept_min, p.spec_accept_last) == (0.6, 0.5, 0.5)


def test_evictions_across_a_restart_add_up_and_never_go_down() -> None:
    start, busy = scrape("sglang_hicache_start"), scrape("sglang_hicache_busy")
    # The restarted server, warm again: its counter restarts at 8000, then climbs to 260000.
    p = run(start, busy, start, busy)
    assert p.evicted_tokens == 252000 + 8000 + 252000
    assert [pt[2] for pt in p.timeline] == [0, 252000, 260000, 512000]
    assert p.counter_resets == 3  # evicted, cached and prompt tokens fell
    # The load-back and retraction series vanished with the old process: anew, they count from zero.
    assert (p.load_back_tokens, p.preemptions) == (41000 + 41000, 3 + 3)


# --- several ranks ------------------------------------------------------------------------------------


def test_two_data_parallel_ranks_sum_and_their_copies_count_once() -> None:
    p = run(scrape("sglang_dp2_start"), scrape("sglang_dp2_busy"))
    assert p.evicted_tokens == (100000 - 40000) + (30000 - 10000)
    assert p.kv_used_tokens_max == 250000 + 180000
    assert p.kv_total_tokens == 600000
    assert p.evictable_tokens_max == 12000 + 10000
    assert p.prompt_tokens == (270000 + 80000) - (70000 + 30000)  # streaming and not add up
    assert p.cached_tokens == 100000
    assert p.cache_hit_rate == pytest.approx(0.4)
    assert p.preemptions == (5 - 1) + (1 - 0)


def test_a_priority_class_series_is_left_out_and_copies_are_one() -> None:
    values = {
        'sglang:kv_used_tokens{priority="",tp_rank="0"}': 5.0,
        'sglang:kv_used_tokens{priority="",tp_rank="1"}': 5.0,
        'sglang:kv_used_tokens{priority="1",tp_rank="0"}': 2.0,
        'sglang:num_used_tokens{priority="",tp_rank="0"}': 9.0,
    }
    assert per_rank(values, ["sglang:kv_used_tokens"]) == {(("priority", ""),): 5.0}


# --- records ------------------------------------------------------------------------------------------


def test_failed_scrapes_are_skipped_and_endpoints_keep_their_first_seen_order() -> None:
    other = "http://127.0.0.1:30001/metrics"
    down = "http://127.0.0.1:30002/metrics"
    records = [
        record(0, None, down),
        record(0, scrape("vllm_v1_start"), other),
        record(0, scrape("sglang_hicache_start")),
        record(1, None),
        record(1, scrape("vllm_v1_busy"), other),
        record(2, scrape("sglang_hicache_busy")),
        record(3, None),
    ]
    got = cache_pressure(records)
    assert list(got) == [down, other, EP]
    assert (got[EP].scrapes, got[EP].evicted_tokens) == (2, 252000)
    assert got[EP].timeline[-1][0] == 10.0  # the failed scrape between held no point
    assert got[other].preemptions == 14
    figures = [f.name for f in dataclasses.fields(CachePressure)][1:-3]
    assert len(figures) == 14 and all(getattr(got[down], f) is None for f in figures)
    assert (got[down].counter_resets, got[down].scrapes, got[down].timeline) == (0, 0, ())


def test_a_long_run_keeps_at_most_its_timeline_points_evenly() -> None:
    start = scrape("sglang_hicache_start")
    evicted = next(s for s in start if s.startswith("sglang:evicted_tokens_total{"))
    p = run(*({**start, evicted: 8000.0 + 100 * i} for i in range(1000)))
    assert p.scrapes == 1000 and len(p.timeline) == TIMELINE_POINTS
    assert (p.timeline[0][0], p.timeline[-1][0]) == (0.0, 999 * 5.0)
    assert p.timeline[-1][2] == p.evicted_tokens == 99900
    gaps = {round(b[0] - a[0]) for a, b in zip(p.timeline, p.timeline[1:])}
    assert gaps <= {25, 30}  # evenly: every fifth scrape or so
