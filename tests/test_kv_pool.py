"""The device KV pool read from SGLang's /get_server_info and from /metrics pages of SGLang and
vLLM (tests/fixtures/metrics_text), one rank and several, and which source wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bench.servers.kv_pool import GIVEN_SOURCE, KvPool, kv_pool, pool_from_metrics, pool_from_server_info
from dsv4bench.servers.monitor import parse_metrics

FIXTURES = Path(__file__).parent / "fixtures"


def text(name: str) -> str:
    return (FIXTURES / "metrics_text" / f"{name}.prom").read_text()


def scrape(name: str) -> dict[str, float]:
    return parse_metrics(text(name))


def without(page: str, needle: str) -> dict[str, float]:
    """A page's scrape less every line that names `needle`."""
    return parse_metrics("".join(line for line in page.splitlines(keepends=True) if needle not in line))


# SGLang's /get_server_info: its server args, its first scheduler's info and one internal state
# per data-parallel rank (the scheduler's memory_usage), as http_server.get_server_info builds it.
def server_info(top: object = 412000, dp_size: object = 1, states: object = None) -> dict[str, object]:
    info: dict[str, object] = {"model_path": "Qwen/Qwen3-32B", "tp_size": 2, "dp_size": dp_size, "version": "0.5.6"}
    if top is not None:
        info["max_total_num_tokens"] = top
    info["internal_states"] = (
        states
        if states is not None
        else [{"last_gen_throughput": 0.0, "memory_usage": {"weight": 30.6, "kvcache": 52.4, "token_capacity": top}}]
    )
    return info


# --- /metrics ------------------------------------------------------------------------------------


def test_vllm_pool_is_gpu_blocks_times_block_size() -> None:
    pool = pool_from_metrics(scrape("vllm_v1_start"))
    assert pool == KvPool(27125 * 16, "/metrics vllm:cache_config_info num_gpu_blocks x block_size")


def test_vllm_before_profiling_has_no_pool() -> None:
    page = text("vllm_v1_start").replace('num_gpu_blocks="27125"', 'num_gpu_blocks="None"')
    assert 'num_gpu_blocks="None"' in page
    assert pool_from_metrics(parse_metrics(page)) is None


def test_vllm_kv_cache_size_tokens_wins_where_a_release_gives_it() -> None:
    # Newer releases count a hybrid model's KV groups right; blocks x size can be wrong there.
    page = text("vllm_v1_start").replace('engine="0",gpu', 'engine="0",kv_cache_size_tokens="216960",gpu')
    pool = pool_from_metrics(parse_metrics(page))
    assert pool is not None and pool.tokens == 216960 and "kv_cache_size_tokens" in pool.source


def test_vllm_data_parallel_engines_sum_their_pools() -> None:
    page = text("vllm_v1_start")
    info = next(line for line in page.splitlines() if line.startswith("vllm:cache_config_info{"))
    two = (
        page
        + info.replace('engine="0"', 'engine="1"').replace('num_gpu_blocks="27125"', 'num_gpu_blocks="27000"')
        + "\n"
    )
    assert pool_from_metrics(parse_metrics(two)) == KvPool(
        27125 * 16 + 27000 * 16, "/metrics vllm:cache_config_info num_gpu_blocks x block_size (2 engines)"
    )
    # One engine not profiled yet: the deployment's pool is not known.
    half = page + info.replace('engine="0"', 'engine="1"').replace('num_gpu_blocks="27125"', 'num_gpu_blocks="None"')
    assert pool_from_metrics(parse_metrics(half + "\n")) is None


def test_sglang_pool_gauge() -> None:
    assert pool_from_metrics(scrape("sglang_hicache_start")) == KvPool(412000, "/metrics sglang:max_total_num_tokens")


def test_sglang_data_parallel_ranks_sum_but_their_tensor_parallel_copies_do_not() -> None:
    values = scrape("sglang_dp2_start")
    series = [v for k, v in values.items() if k.startswith("sglang:max_total_num_tokens{")]
    assert len(series) == 4 and sum(series) == 1_200_000  # two ranks, each reported by its two schedulers
    assert pool_from_metrics(values) == KvPool(600000, "/metrics sglang:max_total_num_tokens (2 DP ranks)")


def test_a_scrape_without_a_pool_figure_gives_none() -> None:
    assert pool_from_metrics(without(text("sglang_hicache_start"), "max_total_num_tokens")) is None
    assert pool_from_metrics({}) is None


def test_a_pool_gauge_that_is_not_a_whole_count_is_no_pool() -> None:
    page = text("sglang_hicache_start").replace("} 412000.0", "} NaN")
    assert pool_from_metrics(parse_metrics(page)) is None
    assert pool_from_metrics(parse_metrics(text("sglang_hicache_start").replace("} 412000.0", "} 0.0"))) is None


# --- /get_server_info ------------------------------------------------------------------------------


def test_server_info_of_one_rank() -> None:
    assert pool_from_server_info(server_info()) == KvPool(412000, "/get_server_info internal_states")


def test_server_info_top_level_where_the_ranks_give_no_figure() -> None:
    info = server_info(states=[{"last_gen_throughput": 0.0, "memory_usage": {"weight": 30.6, "kvcache": 52.4}}])
    assert pool_from_server_info(info) == KvPool(412000, "/get_server_info max_total_num_tokens")


def test_server_info_ranks_may_name_the_figure_max_total_num_tokens() -> None:
    info = server_info(top=None, dp_size=2, states=[{"max_total_num_tokens": 300000}, {"max_total_num_tokens": 310000}])
    assert pool_from_server_info(info) == KvPool(610000, "/get_server_info internal_states (2 DP ranks)")


def test_server_info_of_a_data_parallel_deployment_sums_its_ranks() -> None:
    # Eight DP-attention ranks on one decode server (tests/fixtures/discovery): the top-level
    # figure is one rank's pool, the deployment's is eight of them.
    info = json.loads((FIXTURES / "discovery" / "sglang_pd_decode_server_info.json").read_text())
    assert info["max_total_num_tokens"] == 2097152 and len(info["internal_states"]) == 8
    assert pool_from_server_info(info) == KvPool(8 * 2097152, "/get_server_info internal_states (8 DP ranks)")


def test_server_info_top_level_times_dp_size_where_the_ranks_are_not_all_there() -> None:
    states = [{"memory_usage": {"token_capacity": 300000}}]
    assert pool_from_server_info(server_info(top=300000, dp_size=4, states=states)) == KvPool(
        1_200_000, "/get_server_info max_total_num_tokens x dp_size 4"
    )


def test_a_rank_listed_twice_counts_once() -> None:
    states = [{"dp_rank": 0, "memory_usage": {"token_capacity": 300000}}] * 2
    assert pool_from_server_info(server_info(top=None, states=states)) == KvPool(
        300000, "/get_server_info internal_states"
    )


@pytest.mark.parametrize("bad", [True, False, -412000, 0, 412000.0, "412000", None, [412000], float("inf")])
def test_a_figure_that_is_no_positive_int_is_rejected(bad: object) -> None:
    states = [{"memory_usage": {"token_capacity": bad}}]
    assert pool_from_server_info(server_info(top=bad, states=states)) is None


@pytest.mark.parametrize("body", [None, [], "max_total_num_tokens", 412000, {}])
def test_a_body_that_is_no_server_info_gives_none(body: object) -> None:
    assert pool_from_server_info(body) is None


# --- which source wins -----------------------------------------------------------------------------


def test_a_given_figure_wins_then_server_info_then_metrics() -> None:
    values = scrape("sglang_hicache_start")
    info = server_info(top=400000, states=[{"memory_usage": {"token_capacity": 400000}}])
    assert kv_pool(info, values, 250000) == KvPool(250000, GIVEN_SOURCE)
    assert kv_pool(info, values, None) == KvPool(400000, "/get_server_info internal_states")
    assert kv_pool({"error": "not found"}, values, None) == KvPool(412000, "/metrics sglang:max_total_num_tokens")
    assert kv_pool(None, None, None) is None
    assert kv_pool(None, {}, None) is None


@pytest.mark.parametrize("bad", [0, -1, True])
def test_a_given_figure_that_is_no_pool_is_an_error(bad: int) -> None:
    with pytest.raises(ValueError):
        kv_pool(None, None, bad)


def test_a_pool_is_a_positive_count() -> None:
    with pytest.raises(ValueError):
        KvPool(0, GIVEN_SOURCE)
