"""The wedge detector on recorded series: the incident's shapes must be caught, drains passed."""

from __future__ import annotations

import pytest

from dsv4bench.servers.canary import ERROR, FAILING, OK, TIMEOUT, UNREACHABLE, CanaryResult, HealthResult
from dsv4bench.history.codes import WEDGE_CODES
from dsv4bench.servers.monitor import MetricSample
from dsv4bench.servers.wedge import WedgeConfig, detect_wedge

S = 1_000_000_000
STOP = 1_000 * S  # monotonic ns when load stopped
DEC = "http://d/metrics"
PRE = "http://p/metrics"
LBL = '{engine_type="decode",model_name="m"}'
CFG = WedgeConfig(drain_timeout_s=30.0, min_stuck_s=5.0)


def s(name: str) -> str:
    return f"{name}{LBL}"


RUN, QUEUE = s("sglang:num_running_reqs"), s("sglang:num_queue_reqs")
TRANSFER, INFLIGHT = s("sglang:num_decode_transfer_queue_reqs"), s("sglang:num_prefill_inflight_queue_reqs")
REQS, GEN = s("sglang:num_requests_total"), s("sglang:generation_tokens_total")


def sample(t_s: float, endpoint: str = DEC, ok: bool = True, **values: float) -> MetricSample:
    keys = {"run": RUN, "queue": QUEUE, "transfer": TRANSFER, "inflight": INFLIGHT, "reqs": REQS, "gen": GEN}
    if not ok:
        return MetricSample(0, STOP + int(t_s * S), endpoint, False, error="ConnectError: refused")
    return MetricSample(0, STOP + int(t_s * S), endpoint, True, values={keys[k]: float(v) for k, v in values.items()})


def test_healthy_drain_reports_drain_time_and_no_codes():
    series = [sample(-1, run=80, queue=5, reqs=100, gen=9000)]  # before stop: ignored
    series += [
        sample(0, run=80, queue=0, reqs=100, gen=9000),
        sample(1, run=40, queue=0, reqs=140, gen=9400),
        sample(2, run=10, queue=0, reqs=170, gen=9600),
        sample(3, run=0, queue=0, reqs=180, gen=9700),
        sample(10, run=0, queue=0, reqs=180, gen=9700),
    ]
    found = detect_wedge(series, STOP, CFG)
    assert found[DEC].codes == []
    assert found[DEC].drain_s == 3.0
    assert found[DEC].gauges == {QUEUE: 0.0, RUN: 0.0}


def test_decode_transfer_queue_stuck_at_58():
    series = [sample(t, run=0, transfer=58, reqs=500, gen=40000) for t in range(0, 31)]
    series.append(sample(40, run=0, transfer=0, reqs=500, gen=40000))  # after the window: ignored
    found = detect_wedge(series, STOP, CFG)
    f = found[DEC]
    assert f.codes == ["queue_stuck"]
    assert f.drain_s is None
    assert f.gauges[TRANSFER] == 58.0
    [line] = f.details
    assert "sglang:num_decode_transfer_queue_reqs" in line and "=58" in line and DEC in line
    assert "30.0 s" in line


def test_prefill_inflight_queue_stuck_at_1_beside_a_healthy_decode():
    series = [sample(t, PRE, inflight=1, run=0, reqs=10) for t in range(0, 21, 2)]
    series += [sample(t, DEC, run=0, transfer=0, reqs=10) for t in range(0, 21, 2)]
    found = detect_wedge(series, STOP, CFG)
    assert found[PRE].codes == ["queue_stuck"]
    assert "sglang:num_prefill_inflight_queue_reqs" in found[PRE].details[0]
    assert "=1 " in found[PRE].details[0] and "20.0 s" in found[PRE].details[0]
    assert found[DEC].codes == [] and found[DEC].drain_s == 0.0


def test_ghost_decoding_is_ghost_requests_not_queue_stuck():
    series = [sample(t, run=3, reqs=200, gen=1000 + 50 * t) for t in range(0, 31)]
    found = detect_wedge(series, STOP, CFG)
    assert found[DEC].codes == ["ghost_requests"]
    assert "sglang:num_running_reqs" in found[DEC].details[0]


def test_ghosts_that_end_one_by_one_before_the_window_closes_are_still_ghost_requests():
    """The shape CI recorded behind SGLang's router: six killed requests decoding for nobody,
    three reaching max_tokens soon, the last three 6 s later, just inside an 8 s window."""
    running = [6, 5, 3, 3, 3, 3, 3, 0]
    series = [sample(t + 0.06, run=r, reqs=20, gen=2094 + 440 * min(t, 6)) for t, r in enumerate(running)]
    series.append(sample(7.56, run=0, reqs=26, gen=4734))  # the drain ended: its queues were empty
    found = detect_wedge(series, STOP, WedgeConfig(drain_timeout_s=8.0, min_stuck_s=5.0))[DEC]
    assert found.codes == ["ghost_requests"] and found.drain_s == 7.06
    [line] = found.details
    assert line.startswith(f"{RUN}=6 on {DEC} stayed above 0 for 6.0 s") and "2640 tokens" in line
    assert "(0 when the drain window closed)" in line


@pytest.mark.parametrize("shape", ["admitted from the queue", "another client's requests", "short tail"])
def test_running_work_that_takes_in_work_or_ends_soon_is_no_ghost(shape):
    if shape == "admitted from the queue":  # a slow drain: each finished request's slot is refilled
        series = [sample(t, run=4, queue=12 - t, reqs=100 + t, gen=500 + 90 * t) for t in range(0, 13)]
    elif shape == "another client's requests":  # a shared server: running rises as often as it falls
        series = [sample(t, run=3 + t % 2, reqs=100 + t, gen=500 + 90 * t) for t in range(0, 31)]
    else:  # the killed requests' aborts took a few seconds to land
        series = [sample(t, run=max(0, 6 - 2 * t), reqs=100, gen=500 + 90 * min(t, 3)) for t in range(0, 10)]
    assert detect_wedge(series, STOP, CFG)[DEC].codes == []


def test_lying_health_gives_canary_timeout_and_health_lies():
    series = [sample(t, run=0, transfer=0, reqs=5) for t in range(0, 11)]
    health = [HealthResult(STOP + 31 * S, "http://d/health", OK, 0.01, status=200)]
    canaries = [CanaryResult(STOP + 31 * S, "http://d/v1", TIMEOUT, 10.0, error="timeout after 10 s")]
    found = detect_wedge(series, STOP, CFG, health=health, canaries=canaries)
    assert found["http://d/v1"].codes == ["canary_timeout", "health_lies"]
    assert found["http://d/health"].codes == []
    assert found[DEC].codes == []
    assert set(found["http://d/v1"].codes) <= set(WEDGE_CODES)


def test_honest_health_with_failed_canary_is_only_canary_timeout():
    health = [
        HealthResult(STOP + S, "http://d/health", OK, 0.01, status=200),
        HealthResult(STOP + 31 * S, "http://d/health", FAILING, 0.01, status=503),
    ]
    canaries = [CanaryResult(STOP + 31 * S, "http://d/v1", TIMEOUT, 1.0, error="x")]
    found = detect_wedge([], STOP, CFG, health=health, canaries=canaries)
    assert found["http://d/v1"].codes == ["canary_timeout"]


def test_recovered_canary_clears_canary_timeout():
    canaries = [
        CanaryResult(STOP + 31 * S, "http://d/v1", TIMEOUT, 1.0, error="x"),
        CanaryResult(STOP + 35 * S, "http://d/v1", OK, 0.1),
    ]
    assert detect_wedge([], STOP, CFG, canaries=canaries)["http://d/v1"].codes == []


def test_slow_but_progressing_drain_is_not_a_wedge():
    # Still work at the end of the window, but the queue shrinks and counters move.
    series = [
        sample(t, run=40, queue=60 - 2 * t, transfer=max(0, 30 - t), reqs=100 + 3 * t, gen=5000 + 90 * t)
        for t in range(0, 31)
    ]
    found = detect_wedge(series, STOP, CFG)
    assert found[DEC].codes == []
    assert found[DEC].drain_s is None
    # Still held work when the window closed: said, not hidden behind the empty codes.
    assert any(
        d.startswith(f"{RUN}=40 on {DEC} when the drain window closed") and "neither drained nor stuck" in d
        for d in found[DEC].details
    ), found[DEC].details


def test_short_plateau_under_min_stuck_is_not_stuck():
    series = [sample(t, transfer=10 if t < 27 else 4, reqs=1 if t < 27 else 7) for t in range(0, 31)]
    found = detect_wedge(series, STOP, CFG)[DEC]
    assert found.codes == []
    assert [d for d in found.details if "not" in d or "neither" in d] == [
        f"{TRANSFER}=4 on {DEC} when the drain window closed, but it had moved in its last 5 s: neither drained "
        "nor stuck (a longer --drain-timeout would tell)"
    ]


def test_endpoint_down_mid_window_is_skipped_not_a_crash():
    series = [sample(t, transfer=58, reqs=9) for t in range(0, 10)]
    series += [sample(t, ok=False) for t in range(10, 25)]
    series += [sample(t, transfer=58, reqs=9) for t in range(25, 31)]
    found = detect_wedge(series, STOP, CFG)
    assert found[DEC].codes == ["queue_stuck"]
    all_down = detect_wedge([sample(t, PRE, ok=False) for t in range(0, 31)], STOP, CFG)
    assert all_down[PRE].as_dict() == {"codes": [], "gauges": {}, "drain_s": None, "details": []}


def test_vllm_names_are_judged_too():
    ep = "http://v/metrics"
    key = 'vllm:num_requests_waiting{model_name="m"}'
    values = {key: 7.0, 'vllm:generation_tokens_total{model_name="m"}': 100.0}
    series = [MetricSample(0, STOP + t * S, ep, True, values=values) for t in range(0, 31)]
    found = detect_wedge(series, STOP, CFG)
    assert found[ep].codes == ["queue_stuck"] and key in found[ep].details[0]


def test_a_canary_answered_with_an_error_is_a_check_error_not_a_wedge():
    health = [HealthResult(STOP + 31 * S, "http://d/health", OK, 0.01, status=200)]
    for result, error in (
        (ERROR, "HTTP 200 but not JSON (text/html): an HTML page"),
        (ERROR, "HTTP 500: internal error"),
        (UNREACHABLE, "ConnectError: refused"),
    ):
        canaries = [CanaryResult(STOP + 31 * S, "http://d/v1", result, 0.02, error=error)]
        found = detect_wedge([], STOP, CFG, health=health, canaries=canaries)["http://d/v1"]
        assert found.codes == [], result
        assert found.check_errors == found.details and error in found.check_errors[0]


def test_a_worker_lies_when_health_generate_hangs_behind_a_200():
    health = [
        HealthResult(STOP + 31 * S, "http://p/health", OK, 0.01, status=200),
        HealthResult(STOP + 31 * S, "http://p/health_generate", TIMEOUT, 5.0, error="timeout after 5 s"),
    ]
    found = detect_wedge([], STOP, CFG, health=health)
    assert found["http://p/health_generate"].codes == ["health_lies"]
    assert found["http://p/health"].codes == []


@pytest.mark.parametrize(("status", "lies"), [(503, True), (500, False), (200, False)])
def test_a_worker_lies_when_health_generate_says_503_behind_a_200(status, lies):
    """A patient check outwaits the server's own probe timeout and hears its 503: the same lie."""
    health = [
        HealthResult(STOP + 31 * S, "http://p/health", OK, 0.01, status=200),
        HealthResult(STOP + 31 * S, "http://p/health_generate", OK if status == 200 else FAILING, 20.0, status=status),
    ]
    found = detect_wedge([], STOP, CFG, health=health)
    assert found["http://p/health_generate"].codes == (["health_lies"] if lies else [])
    assert any("answered 503" in d for d in found["http://p/health_generate"].details) == lies


def test_failures_that_rose_in_the_drain_window_are_evidence_never_a_code():
    from dsv4bench.servers.monitor import MetricSample
    from dsv4bench.servers.wedge import WedgeConfig, detect_wedge, failures_rose

    failed = 'sglang:num_transfer_failed_reqs_total{engine_type="decode"}'
    stuck = 'sglang:num_decode_transfer_queue_reqs{engine_type="decode"}'
    ep = "http://d:30002/metrics"
    samples = [
        MetricSample(t * 10**9, t * 10**9, ep, True, values={stuck: 0.0, failed: f})
        for t, f in ((1, 2.0), (2, 5.0), (3, 5.0))
    ]
    [found] = detect_wedge(samples, 0, WedgeConfig(drain_timeout_s=10, min_stuck_s=1)).values()
    assert found.codes == [] and found.details == [f"failures counted on {ep} after load stop: {failed} +3"]
    assert failures_rose({failed: 9.0}, {failed: 1.0}) == []  # reset by a restart
