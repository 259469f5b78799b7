"""The server-kind table: each kind recognised from what it answers, and judged by what it offers;
and the run's rule for the two canaries (not streamed, streamed) in wedge.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bench.servers.canary import CanaryResult, HealthResult
from dsv4bench.servers.dialect import TRTLLM_RUNNING, TRTLLM_WAITING, dialect_of, trtllm_series
from dsv4bench.servers.monitor import parse_metrics
from dsv4bench.servers.kinds import (
    BUNDLED,
    HEALTH,
    HEALTH_GENERATE,
    KINDS,
    SGLANG,
    SGLANG_ROUTER,
    TRTLLM,
    UNKNOWN_KIND,
    VLLM,
    kind,
    not_offered,
    recognise,
)
from dsv4bench.servers.wedge import WedgeConfig, detect_wedge

FIXTURES = Path(__file__).parent / "fixtures"


def _json(name: str):
    return json.loads((FIXTURES / "discovery" / name).read_text())


def _prom(name: str) -> dict[str, float]:
    return parse_metrics((FIXTURES / "metrics" / name).read_text())


@pytest.mark.parametrize(
    "info,metrics,workers,json_metrics,expected",
    [
        (_json("bundled_decode_server_info.json"), None, None, False, BUNDLED),
        (_json("bundled_router_server_info.json"), None, _json("bundled_router_workers.json"), False, BUNDLED),
        (_json("sglang_pd_decode_server_info.json"), None, None, False, SGLANG),
        (_json("sglang_router_server_info.json"), None, None, False, SGLANG_ROUTER),
        (None, _prom("sglang_router_smg.prom"), None, False, SGLANG_ROUTER),
        (None, None, _json("sglang_router_pd_workers.json"), False, SGLANG_ROUTER),
        (None, _prom("sglang_pd_prefill.prom"), None, False, SGLANG),
        (None, _prom("vllm_nixl.prom"), None, False, VLLM),
        (None, {TRTLLM_RUNNING: 1.0}, None, True, TRTLLM),
        (None, None, None, True, TRTLLM),  # an idle trtllm-serve answers /metrics with []
        (None, None, None, False, UNKNOWN_KIND),
    ],
)
def test_each_kind_is_recognised_from_what_it_answers(info, metrics, workers, json_metrics, expected):
    found, source = recognise(info, metrics, workers, json_metrics)
    assert found.name == expected, source
    assert source


def test_an_endpoint_a_kind_never_had_is_not_offered_and_one_it_has_is_judged():
    # vLLM never had /health_generate: not offered, whatever it answers (it is not asked).
    assert not_offered(KINDS[VLLM], HEALTH_GENERATE, None) and not_offered(KINDS[VLLM], HEALTH_GENERATE, 500)
    # TensorRT-LLM added it in later releases: a 404 says not offered, a 503 is an answer to judge.
    assert not_offered(KINDS[TRTLLM], HEALTH_GENERATE, 404)
    assert not not_offered(KINDS[TRTLLM], HEALTH_GENERATE, 503) and not not_offered(KINDS[TRTLLM], HEALTH_GENERATE, 200)
    # The look-alike: SGLang has it, so its 404 is no "not offered" but a failing check.
    assert not not_offered(KINDS[SGLANG], HEALTH_GENERATE, 404) and not not_offered(
        KINDS[BUNDLED], HEALTH_GENERATE, 404
    )
    # An unknown kind: judged by what answers.
    for status in (404, 405, 501):
        assert not_offered(kind(None), HEALTH, status)
    assert not not_offered(kind("no such kind"), HEALTH, 503)


def test_trtllm_iteration_stats_read_as_gauges_from_the_latest_iteration():
    stats = [
        {"iter": 7, "numActiveRequests": 4, "numQueuedRequests": 1},
        {"iter": 9, "numActiveRequests": 2, "numQueuedRequests": 0, "kvCacheStats": {"freeNumBlocks": 3}},
    ]
    values = parse_metrics(json.dumps(stats))
    assert values == {TRTLLM_RUNNING: 2.0, TRTLLM_WAITING: 0.0, "trtllm:iter": 9.0}
    assert dialect_of(values).name == "trtllm"
    for bad in ([], [1, 2], {"numActiveRequests": 1}, [{"gpuMemUsage": 1}]):
        with pytest.raises(ValueError):
            trtllm_series(bad)
    with pytest.raises(ValueError):
        parse_metrics("[{not json")


def _canary(stream: bool, result: str, t_ns: int = 10) -> CanaryResult:
    return CanaryResult(t_ns, "http://s:1/v1", result, 1.0, None if result == "ok" else "x", 200, stream)


def _health(status: int) -> list[HealthResult]:
    return [HealthResult(5, "http://s:1/health", "ok" if status == 200 else "failing", 0.01, status)]


def test_a_stalled_stream_is_canary_timeout_though_the_unstreamed_canary_answered():
    found = detect_wedge(
        [], 0, WedgeConfig(), health=_health(200), canaries=[_canary(False, "ok"), _canary(True, "timeout")]
    )
    assert found["http://s:1/v1"].codes == ["canary_timeout", "health_lies"]
    assert any("streamed canary" in d for d in found["http://s:1/v1"].details)


def test_both_canaries_answering_is_healthy_and_a_streamed_error_is_no_hang():
    found = detect_wedge(
        [], 0, WedgeConfig(), health=_health(200), canaries=[_canary(False, "ok"), _canary(True, "ok")]
    )
    assert found["http://s:1/v1"].codes == []
    found = detect_wedge(
        [], 0, WedgeConfig(), health=_health(200), canaries=[_canary(False, "ok"), _canary(True, "error")]
    )
    assert found["http://s:1/v1"].codes == [] and found["http://s:1/v1"].check_errors


def test_the_latest_canary_of_each_way_decides():
    # A stream that hung during the run but answers after it: the latest decides.
    found = detect_wedge(
        [],
        0,
        WedgeConfig(),
        health=_health(200),
        canaries=[_canary(True, "timeout", 10), _canary(True, "ok", 20), _canary(False, "ok", 20)],
    )
    assert found["http://s:1/v1"].codes == []


def test_a_not_offered_health_generate_is_no_lie():
    probes = [*_health(200), HealthResult(6, "http://s:1/health_generate", "not_offered", 0.0, 404)]
    found = detect_wedge([], 0, WedgeConfig(), health=probes)
    assert all(f.codes == [] for f in found.values())


def test_a_scrape_waits_as_long_as_its_kind_holds_metrics() -> None:
    from dsv4bench.servers.kinds import LONGEST_HOLD_S, SCRAPE_MARGIN_S, scrape_timeout

    # TensorRT-LLM gathers stats for 2 s before it answers; the others answer at once.
    assert KINDS[TRTLLM].metrics_hold_s == 2.0 and KINDS[VLLM].metrics_hold_s == 0.0
    assert scrape_timeout(KINDS[TRTLLM], 1.0) == 2.0 + SCRAPE_MARGIN_S
    assert scrape_timeout(KINDS[VLLM], 1.0) == max(1.0, SCRAPE_MARGIN_S)
    assert scrape_timeout(KINDS[VLLM], 5.0) == 5.0  # never shorter than the interval
    # Before its first answer says its kind, a scrape waits as long as any kind may hold it.
    assert scrape_timeout(None, 0.2) == LONGEST_HOLD_S + SCRAPE_MARGIN_S >= scrape_timeout(KINDS[TRTLLM], 0.2)
