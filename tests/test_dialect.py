"""The metrics dialects on recorded /metrics pages: SGLang's generations of names, several ranks,
priority breakdowns, vLLM with NIXL, SGLang's router; and the wedge verdict on them."""

from __future__ import annotations

import pytest

from dsv4bench.servers.dialect import (
    FAILURE_COUNTERS,
    QUEUE_GAUGES,
    Dialect,
    counters,
    dialect_of,
    failures,
    generation_tokens,
    is_queue_gauge,
    is_router_metrics,
    metric_name,
    stage,
)
from dsv4bench.servers.monitor import MetricSample, parse_metrics
from dsv4bench.servers.roles import (
    DECODE,
    GAUGE_LABELS,
    GAUGE_WORDS,
    PREFILL,
    ROUTER,
    UNIFIED,
    own_gauges_shown,
    part_labels,
    role_from_metrics,
    role_gauges,
)
from dsv4bench.servers.wedge import WedgeConfig, detect_wedge
from tests.fixtures.metrics import page


def scrape(name: str) -> dict[str, float]:
    return parse_metrics(page(name))


def stages(values: dict[str, float]) -> dict[str, float]:
    """The queue gauges of a scrape summed per stage, as a view of one number per gauge shows them."""
    out: dict[str, float] = {}
    for k, v in values.items():
        if is_queue_gauge(k):
            out[stage(k)] = out.get(stage(k), 0.0) + v
    return out


@pytest.mark.parametrize(
    "fixture,dialect",
    [
        ("sglang_pd_prefill", Dialect("sglang", "bootstrap")),
        ("sglang_pd_decode", Dialect("sglang", "bootstrap")),
        ("sglang_multi_rank", Dialect("sglang", "bootstrap")),
        ("sglang_old_names", Dialect("sglang", "prealloc")),
        ("sglang_old_infight", Dialect("sglang", "infight")),
        ("vllm_nixl", Dialect("vllm", "v1")),
        ("sglang_router_smg", Dialect("sglang-router", "smg")),
    ],
)
def test_the_dialect_and_generation_are_told_from_one_scrape(fixture, dialect):
    assert dialect_of(scrape(fixture)) == dialect


def test_dialects_without_a_fixture():
    assert dialect_of(parse_metrics('vllm:num_requests_running{model_name="m"} 0.0\n')) == Dialect("vllm", "v0")
    assert dialect_of({'sgl_router_worker_health{worker="http://w:1"}': 1.0}) == Dialect("sglang-router", "sgl_router")
    assert dialect_of({'sglang:num_running_reqs{engine_type="unified"}': 0.0}) == Dialect("sglang", "")
    assert dialect_of({"process_cpu_seconds_total": 4.0}) == Dialect()


@pytest.mark.parametrize(
    "fixture,expected",
    [
        (
            "sglang_pd_prefill",
            {"running": 2, "waiting": 4, "bootstrap": 7, "inflight": 3, "prealloc": 0, "transfer": 0},
        ),
        # With priority scheduling: the totals only, never the per-priority series on top.
        (
            "sglang_pd_decode",
            {
                "running": 31,
                "waiting": 2,
                "bootstrap": 0,
                "inflight": 0,
                "prealloc": 5,
                "transfer": 12,
                "host recv": 4,
                "release": 1,
            },
        ),
        (
            "sglang_multi_rank",
            {"running": 12, "waiting": 1, "bootstrap": 0, "inflight": 0, "prealloc": 2, "transfer": 14},
        ),
        (
            "sglang_old_names",
            {"running": 0, "waiting": 0, "bootstrap": 60, "inflight": 0, "prealloc": 0, "transfer": 0},
        ),
        (
            "sglang_old_infight",
            {"running": 0, "waiting": 0, "bootstrap": 0, "inflight": 41, "prealloc": 0, "transfer": 0},
        ),
        ("vllm_nixl", {"running": 13, "waiting": 1}),
        ("sglang_router_smg", {}),  # the router's per-worker counts are no queue of its own
    ],
)
def test_queue_gauges_per_stage_whatever_the_server_calls_them(fixture, expected):
    assert stages(scrape(fixture)) == expected


def test_histograms_and_created_samples_are_no_gauges():
    for fixture in ("sglang_pd_prefill", "sglang_pd_decode", "sglang_multi_rank", "vllm_nixl"):
        for k in scrape(fixture):
            if k.split("{")[0].endswith(("_bucket", "_sum", "_count", "_created")):
                assert not is_queue_gauge(k), k


@pytest.mark.parametrize(
    "fixture,progress,failed",
    [
        # scheduler_loop_iterations_total ticks with nothing to do: no progress.
        (
            "sglang_pd_prefill",
            {
                "sglang:num_requests_total",
                "sglang:num_aborted_requests_total",
                "sglang:prompt_tokens_total",
                "sglang:generation_tokens_total",
                "sglang:realtime_tokens_total",
            },
            {"sglang:num_bootstrap_failed_reqs_total": 2, "sglang:num_transfer_failed_reqs_total": 1},
        ),
        (
            "sglang_old_names",
            {
                "sglang:num_requests_total",
                "sglang:prompt_tokens_total",
                "sglang:generation_tokens_total",
                "sglang:cached_tokens_total",
            },
            {"sglang:num_bootstrap_failed_reqs_total": 17, "sglang:num_transfer_failed_reqs_total": 0},
        ),
        (
            "sglang_old_infight",
            {"sglang:num_requests_total", "sglang:prompt_tokens_total", "sglang:generation_tokens_total"},
            {"sglang:num_bootstrap_failed_reqs_total": 0, "sglang:num_transfer_failed_reqs_total": 41},
        ),
        # process_cpu_seconds_total and python_gc_*_total tick on their own; preemptions are no progress.
        (
            "vllm_nixl",
            {"vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"},
            {
                "vllm:nixl_num_failed_transfers_total": 3,
                "vllm:nixl_num_failed_notifications_total": 0,
                "vllm:nixl_num_kv_expired_reqs_total": 1,
            },
        ),
        ("sglang_router_smg", set(), {"smg_worker_retries_total": 14, "smg_worker_retries_exhausted_total": 3}),
    ],
)
def test_progress_and_failure_counters(fixture, progress, failed):
    values = scrape(fixture)
    assert {metric_name(k) for k in counters(values)} == progress
    found: dict[str, float] = {}
    for k, v in failures(values).items():
        found[metric_name(k)] = found.get(metric_name(k), 0.0) + v
    assert found == failed
    assert set(found) <= FAILURE_COUNTERS and not set(found) & {metric_name(k) for k in counters(values)}


@pytest.mark.parametrize(
    "fixture,tokens",
    [
        ("sglang_pd_prefill", 123),  # no decode tokens counted as they are made: the finished requests' count
        ("sglang_pd_decode", 88231),  # realtime decode tokens, not the 60412 of finished requests
        ("sglang_multi_rank", 20411 + 19876 + 7012 + 21230),
        ("sglang_old_names", 60),
        ("vllm_nixl", 20511 + 19780),
        ("sglang_router_smg", 0),
    ],
)
def test_generation_tokens(fixture, tokens):
    assert generation_tokens(scrape(fixture)) == tokens


def test_only_the_router_is_a_router():
    assert is_router_metrics(scrape("sglang_router_smg"))
    assert is_router_metrics({'sgl_router_requests_total{route="/generate"}': 1.0})
    for fixture in ("sglang_pd_prefill", "sglang_pd_decode", "sglang_multi_rank", "sglang_old_names", "vllm_nixl"):
        assert not is_router_metrics(scrape(fixture))


@pytest.mark.parametrize(
    "fixture,role",
    [
        ("sglang_pd_prefill", PREFILL),
        ("sglang_pd_decode", DECODE),
        ("sglang_multi_rank", DECODE),
        ("sglang_router_smg", ROUTER),
        ("vllm_nixl", UNIFIED),
        # A release that labels every server "unified", PD workers too: the label tells nothing.
        ("sglang_old_names", None),
        ("sglang_old_infight", None),
    ],
)
def test_roles_from_the_recorded_pages(fixture, role):
    found = role_from_metrics(scrape(fixture))
    assert (found.name if found else None) == role


def test_an_old_name_shows_as_its_stage_once():
    present = {metric_name(k) for k in scrape("sglang_old_names")}
    shown = own_gauges_shown(PREFILL, present)
    assert shown[0] == "sglang:num_prefill_prealloc_queue_reqs"
    assert [GAUGE_LABELS[g] for g in shown] == ["bootstrap", "waiting", "running", "inflight"]
    assert GAUGE_WORDS["sglang:num_prefill_infight_queue_reqs"] == "inflight queue"
    assert "sglang:num_prefill_prealloc_queue_reqs" in role_gauges(PREFILL)
    assert all(len(label) <= 9 for label in GAUGE_LABELS.values())  # watch's label column
    assert set(QUEUE_GAUGES) <= set(GAUGE_LABELS)


def test_rank_labels_tell_the_series_of_one_server_apart():
    values = scrape("sglang_multi_rank")
    ranks = sorted(part_labels(k) for k in values if k.startswith("sglang:num_decode_transfer_queue_reqs"))
    assert ranks[2] == "dp_rank=2,moe_ep_rank=2,pp_rank=0,tp_rank=2"
    total = next(k for k in scrape("sglang_pd_decode") if k.startswith("sglang:num_decode_transfer_queue_reqs"))
    assert part_labels(total) == "moe_ep_rank=0,pp_rank=0,tp_rank=0"  # priority="" is the total, no part


# --- the wedge verdict on the recorded pages ---------------------------------------------------

S = 1_000_000_000
STOP = 1_000 * S
ENDPOINT = "http://10.0.0.12:30001/metrics"


def judge(scrapes: list[dict[str, float]]) -> tuple[list[str], list[str], dict[str, float]]:
    """(codes, details, gauges) of the wedge detector for one scrape a second after the load stopped."""
    samples = [MetricSample(0, STOP + i * S, ENDPOINT, True, values=v) for i, v in enumerate(scrapes)]
    found = detect_wedge(samples, STOP, WedgeConfig(drain_timeout_s=30.0, min_stuck_s=5.0))[ENDPOINT]
    return found.codes, found.details, found.gauges


def changed(values: dict[str, float], **by_prefix: float) -> dict[str, float]:
    """`values` with every series whose name starts with a key (`:` written `__`) set to its value."""
    out = dict(values)
    for prefix, v in by_prefix.items():
        for k in out:
            if k.startswith(prefix.replace("__", ":")):
                out[k] = v
    return out


def test_a_queue_stuck_under_its_old_name_is_a_wedge():
    page = scrape("sglang_old_names")
    # Bootstrap failures keep rising: a server failing in a loop, not making progress.
    codes, details, _ = judge([changed(page, sglang__num_bootstrap_failed_reqs_total=17 + t) for t in range(10)])
    assert codes == ["queue_stuck"]
    assert any("sglang:num_prefill_prealloc_queue_reqs" in d and "=60" in d for d in details)


def test_a_stuck_queue_is_a_wedge_though_the_scheduler_loop_counts_on():
    page = changed(
        scrape("sglang_pd_prefill"),
        sglang__num_running_reqs=0,
        sglang__num_queue_reqs=0,
        sglang__num_prefill_inflight_queue_reqs=0,
    )
    codes, details, _ = judge([changed(page, sglang__scheduler_loop_iterations_total=9e6 + 1e4 * t) for t in range(10)])
    assert codes == ["queue_stuck"] and len(details) == 1 and "num_prefill_bootstrap_queue_reqs" in details[0]


def test_one_stuck_rank_is_found_beside_a_rank_whose_queue_moves():
    page = changed(
        scrape("sglang_multi_rank"),
        sglang__num_running_reqs=0,
        sglang__num_queue_reqs=0,
        sglang__num_decode_prealloc_queue_reqs=0,
    )
    rank0 = next(k for k in page if k.startswith("sglang:num_decode_transfer_queue_reqs") and 'dp_rank="0"' in k)
    # Rank 0's transfer queue goes up and down with nothing finishing (transfers retried over and
    # over) while rank 2's holds 14: their sum falls every other scrape and would hide rank 2.
    scrapes = [{**page, rank0: 3.0 if t % 2 else 1.0} for t in range(12)]
    codes, details, gauges = judge(scrapes)
    assert codes == ["queue_stuck"]
    moving, line = details  # by gauge name: rank 0 first
    assert line.startswith(
        'sglang:num_decode_transfer_queue_reqs{dp_rank="2",engine_type="decode",'
        'model_name="deepseek-v4",moe_ep_rank="2",pp_rank="0",tp_rank="2"}=14 '
    )
    assert moving.startswith(f"{rank0}=3 ") and "neither drained nor stuck" in moving  # rank 0 still moves
    assert sum(v for k, v in gauges.items() if k.startswith("sglang:num_decode_transfer_queue_reqs")) == 14 + 3


def test_a_draining_multi_rank_server_is_no_wedge():
    page = scrape("sglang_multi_rank")
    drain = []
    for t in range(12):
        left = max(0, 14 - 2 * t)
        drain.append(
            changed(
                page,
                sglang__num_decode_transfer_queue_reqs=left,
                sglang__num_running_reqs=min(left, 3),
                sglang__num_decode_prealloc_queue_reqs=0,
                sglang__num_queue_reqs=0,
                sglang__num_requests_total=212 + 2 * min(t, 7),
            )
        )
    codes, _, _ = judge(drain)
    assert codes == []


def test_priority_breakdowns_are_not_judged_twice():
    page = scrape("sglang_pd_decode")
    codes, details, gauges = judge([page] * 10)
    assert codes == ["queue_stuck"]
    assert not any('priority="0"' in k or 'priority="10"' in k for k in gauges)
    assert not any('priority="1' in d or 'priority="0"' in d for d in details)
