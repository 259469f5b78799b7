"""--cache-pressure: the run sized to put X times the KV pool in its live sessions, or refused."""

import pytest

from dsv4bench.harness.cache_plan import CachePlanError, plan_cache_pressure, plan_run
from dsv4bench.harness.config import ConfigError, RunConfig
from dsv4bench.harness.context_profile import SHORT, SWE, parse_context

URL = "http://127.0.0.1:9/v1"


def plan(pressure=2.0, pool=262_144, concurrency=80, context=65_536, profile=SHORT, sessions=80):
    return plan_cache_pressure(pressure, pool, "/get_server_info", concurrency, context, profile, 1024, sessions)


@pytest.mark.parametrize("pressure, pool, concurrency", [(2.0, 262_144, 80), (1.5, 1_048_576, 96), (4.0, 65_536, 8)])
def test_the_plan_reaches_the_pressure_asked_from_the_short_profile(pressure, pool, concurrency):
    p = plan(pressure, pool, concurrency)
    assert p.reached == pytest.approx(pressure, rel=0.02)
    assert p.working_set == pytest.approx(concurrency * p.mean_depth)
    assert p.evicted_per_round == pytest.approx(p.working_set - pool)
    assert p.profile.grows and p.profile.p95 / p.profile.p50 == pytest.approx(SWE.p95 / SWE.p50, rel=0.01)
    # the run draws the very depths the plan counted: its profile reads back from its name
    assert parse_context(p.profile.name).mean_depth(65_536 - 1024) == pytest.approx(p.mean_depth, rel=0.03)


def test_a_profile_that_already_reaches_the_pressure_is_kept():
    p = plan(0.5, 262_144, 80, profile=SWE)
    assert p.profile == SWE and p.reached > 0.5


def test_a_profile_too_shallow_for_the_pressure_is_scaled_up_in_its_shape():
    p = plan(16.0, 262_144, 80, profile=SWE)
    assert p.profile.p50 > SWE.p50 and p.reached == pytest.approx(16.0, rel=0.02)


def test_a_pressure_past_the_context_at_this_concurrency_is_refused_with_the_concurrency_that_would_do():
    with pytest.raises(CachePlanError, match=r"past the server's context of 16,384 .* --concurrency to at least 137"):
        plan(2.0, 1_048_576, 80, context=16_384)


def test_without_a_known_context_the_plan_is_not_capped():
    p = plan(2.0, 1_048_576, 8, context=None)
    assert p.reached == pytest.approx(2.0, rel=0.02) and p.context_tokens is None


def test_a_duration_run_stays_unbounded_and_a_short_session_count_is_raised_to_the_concurrency():
    assert plan(sessions=None).sessions is None
    assert plan(sessions=10).sessions == 80


@pytest.mark.parametrize("pressure", [0.0, -1.0, float("nan")])
def test_a_nonsense_pressure_is_refused(pressure):
    with pytest.raises(CachePlanError, match="--cache-pressure"):
        plan(pressure)


def test_the_printed_plan_names_pool_working_set_and_evictions():
    text = "\n".join(plan().lines())
    for words in ("KV pool 262,144 tokens (/get_server_info)", "80 at once", "2.00x the pool", "must evict at least"):
        assert words in text


def test_plan_run_reads_the_pool_from_the_facts_or_the_flag_and_says_when_it_has_none():
    config = RunConfig(url=URL, concurrency=40, cache_pressure=2.0)
    facts = {
        "kv_pool": {"tokens": 131_072, "source": "/get_server_info max_total_num_tokens"},
        "context_length": 65_536,
    }
    sized, p = plan_run(config, facts)
    assert p.pool_tokens == 131_072 and sized.context == p.profile.name and sized.max_turns == SWE.max_turns
    flagged = RunConfig(url=URL, concurrency=40, cache_pressure=2.0, kv_pool_tokens=65_536)
    assert plan_run(flagged, facts)[1].pool_source == "--kv-pool-tokens"
    with pytest.raises(CachePlanError, match="--kv-pool-tokens"):
        plan_run(config, {"context_length": 65_536})
    assert plan_run(RunConfig(url=URL), facts) is None


@pytest.mark.parametrize(
    "field, value, flag", [("cache_pressure", 0.0, "--cache-pressure"), ("kv_pool_tokens", 0, "--kv-pool-tokens")]
)
def test_runconfig_refuses_a_bad_pressure_or_pool_by_its_flag(field, value, flag):
    with pytest.raises(ConfigError, match=flag):
        RunConfig(url=URL, **{field: value})
