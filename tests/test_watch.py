"""`dsv4bench watch`: WatchState on literal series, sparklines, and watch_main against the wedge server."""

from __future__ import annotations

import io
from collections.abc import Iterator

import anyio
import httpx
import pytest
from rich.console import Console

from dsv4bench.engine.launcher import free_port
from dsv4bench.servers.monitor import MetricSample
from dsv4bench.servers.roles import DECODE, PREFILL, ROUTER, Role
from dsv4bench.servers.watch import SPARK_CHARS, WatchState, endpoint_label, render_watch, sparkline, watch_main
from tests.fixtures.wedge_server import WedgeState, serve_in_thread

S = 1_000_000_000
EP = "http://decode:30000/metrics"
TRANSFER = 'sglang:num_decode_transfer_queue_reqs{engine_type="decode",model_name="m"}'
RUNNING = 'sglang:num_running_reqs{engine_type="decode",model_name="m"}'
REQS = 'sglang:num_requests_total{engine_type="decode",model_name="m"}'


def _sample(t_s: float, transfer: float, running: float, reqs: float, ok: bool = True) -> MetricSample:
    if not ok:
        return MetricSample(int(t_s * S), int(t_s * S), EP, False, error="ConnectError: refused")
    return MetricSample(int(t_s * S), int(t_s * S), EP, True, values={TRANSFER: transfer, RUNNING: running, REQS: reqs})


def _feed(state: WatchState, rows: list[tuple[float, float, float, float]]) -> None:
    for row in rows:
        state.add(_sample(*row))


def test_healthy_series_is_never_marked() -> None:
    st = WatchState(stuck_s=2)
    # Busy: running > 0 throughout, but the request counter moves every scrape.
    _feed(st, [(t, 0, 4, 10 + t) for t in range(10)])
    assert st.wedge_forming(10 * S) == {}


def test_stuck_transfer_queue_with_frozen_counters_is_marked_after_stuck_s() -> None:
    st = WatchState(stuck_s=3)
    _feed(st, [(0, 10, 2, 5), (1, 58, 0, 9)])  # counters last moved at t=1
    _feed(st, [(t, 58, 0, 9) for t in (2, 3)])
    assert st.wedge_forming(3 * S) == {}  # flat for 2 s only
    _feed(st, [(4, 58, 0, 9)])
    assert st.wedge_forming(4 * S) == {EP: [TRANSFER]}
    # A failed scrape is no evidence of progress: the mark stays.
    st.add(_sample(5, 0, 0, 0, ok=False))
    assert st.wedge_forming(5 * S) == {EP: [TRANSFER]}
    assert "WEDGE: decode transfer queue stuck at 58 for 4 s" in _text(render_watch(st))


def test_draining_queue_is_unmarked() -> None:
    st = WatchState(stuck_s=2)
    _feed(st, [(t, 58, 0, 9) for t in range(4)])
    assert st.wedge_forming(3 * S) == {EP: [TRANSFER]}
    # It drains without counters moving (e.g. requests dropped): shrinking restarts the clock.
    _feed(st, [(4, 40, 0, 9), (5, 20, 0, 9)])
    assert st.wedge_forming(5 * S) == {}
    _feed(st, [(6, 0, 0, 9)])
    assert st.wedge_forming(20 * S) == {}


def test_history_is_bounded() -> None:
    st = WatchState(stuck_s=2, history=5)
    _feed(st, [(t, t, 0, t) for t in range(20)])
    assert [v for _, v in st.endpoints[EP].gauges[TRANSFER]] == [15, 16, 17, 18, 19]


def test_sparkline_of_a_known_series() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == SPARK_CHARS
    assert sparkline([58, 58, 58]) == "███"  # high and flat reads as full, not empty
    assert sparkline([0, 0]) == "▁▁"
    assert sparkline([]) == ""


def _text(renderable: object, width: int = 200) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


# --- a PD deployment at 80 columns --------------------------------------------------------------

ROUTER_EP, PREFILL_EP, DECODE_EP = (f"http://10.20.30.40:{p}/metrics" for p in (8000, 30000, 30002))
GAUGES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
)


def _pd_sample(
    endpoint: str, engine_type: str, t_s: float, gauges: dict[str, list[float]], reqs: float
) -> MetricSample:
    """Every gauge a bundled PD server exports (all six, whatever its role), over two tp ranks."""
    values: dict[str, float] = {}
    for name in GAUGES:
        for rank, v in enumerate(gauges.get(name, [0.0, 0.0])):
            values[f'{name}{{engine_type="{engine_type}",model_name="dsv4-mini",tp_rank="{rank}"}}'] = v
    values[f'sglang:num_requests_total{{engine_type="{engine_type}",model_name="dsv4-mini"}}'] = reqs
    return MetricSample(0, int(t_s * S), endpoint, True, values=values)


def _pd_state(transfer: list[float]) -> WatchState:
    st = WatchState(stuck_s=5)
    st.set_role(ROUTER_EP, Role(ROUTER, "/get_server_info engine_type"))
    for t in range(0, 21):
        st.add(_pd_sample(ROUTER_EP, "router", t, {}, 100))
        st.add(_pd_sample(PREFILL_EP, "prefill", t, {"sglang:num_prefill_inflight_queue_reqs": [1, 0]}, 100))
        st.add(_pd_sample(DECODE_EP, "decode", t, {"sglang:num_decode_transfer_queue_reqs": transfer}, 100))
    return st


def test_pd_view_fits_80_columns_and_shows_each_role_its_own_gauges() -> None:
    st = _pd_state([25, 15])
    text = _text(render_watch(st, width=80), width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert "{" not in text and "engine_type" not in text and "model_name" not in text  # labels collapsed
    blocks: dict[str, list[str]] = {}
    for line in lines[1:-1]:
        if not line.startswith(" "):
            blocks[line.split()[0]] = [line]
        else:
            blocks[list(blocks)[-1]].append(line)
    assert list(blocks) == ["10.20.30.40:8000", "10.20.30.40:30000", "10.20.30.40:30002"]
    router, prefill, decode = blocks.values()
    assert router[0].split()[1] == ROUTER and prefill[0].split()[1] == PREFILL and decode[0].split()[1] == DECODE
    assert [r.split()[0] for r in router[1:]] == ["waiting", "running"]  # no PD queues on the router
    assert [r.split()[0] for r in prefill[2:]] == ["bootstrap", "waiting", "running", "inflight"]
    assert [r.split()[0] for r in decode[1:]] == ["prealloc", "transfer", "waiting", "running"]
    # Current value beside its sparkline, summed over the ranks.
    transfer = next(r for r in decode if r.split()[0] == "transfer").split()
    assert transfer[1] == "40" and set(transfer[2]) == {"█"}
    assert decode[0].split(None, 2)[2] == "WEDGE: decode transfer queue stuck at 40 for 20 s"
    # One rank of two stuck: the words name it (wrapped below the state column, not cut).
    assert (
        " ".join(prefill[0].split()[2:] + prefill[1].split())
        == "WEDGE: prefill inflight queue stuck at 1 for 20 s (tp_rank=0)"
    )
    assert prefill[2].split()[0] == "bootstrap"
    assert router[0].endswith("idle")
    assert lines[-1].startswith("WEDGE forming: 3 gauge(s)")


def test_states_in_words() -> None:
    st = WatchState(stuck_s=5)
    _feed(st, [(0, 0, 0, 10)])
    assert st.describe(EP, 0).plain == "idle"
    _feed(st, [(1, 5, 3, 12)])  # work in flight, counters moving
    assert st.describe(EP, 1 * S).plain == "busy"
    _feed(st, [(2, 4, 2, 12)])  # shrinking
    assert st.describe(EP, 2 * S).plain == "draining"
    _feed(st, [(t, 4, 2, 12) for t in (3, 4, 5)])  # held, counters frozen since t=1
    assert st.describe(EP, 5 * S).plain == "stuck 3 s"
    _feed(st, [(t, 4, 2, 12) for t in range(6, 9)])
    assert st.describe(EP, 8 * S).plain == "WEDGE: decode transfer queue stuck at 4 for 6 s (+1 more)"
    assert WatchState().endpoints == {}
    st.add(MetricSample(0, 0, "http://x:1/metrics", False, error="ConnectError: refused"))
    assert st.describe("http://x:1/metrics", 0).plain == "no answer: ConnectError: refused"


def test_a_gauge_outside_the_role_shows_once_it_holds_requests() -> None:
    st = WatchState(stuck_s=5)
    st.add(_pd_sample(ROUTER_EP, "router", 0, {}, 1))
    assert st.shown_gauges(ROUTER_EP) == ["sglang:num_queue_reqs", "sglang:num_running_reqs"]
    st.add(_pd_sample(ROUTER_EP, "router", 1, {"sglang:num_decode_transfer_queue_reqs": [3, 0]}, 1))
    assert st.shown_gauges(ROUTER_EP)[-1] == "sglang:num_decode_transfer_queue_reqs"


def test_endpoint_label() -> None:
    assert endpoint_label("http://10.0.0.1:30000/metrics") == "10.0.0.1:30000"
    assert endpoint_label("https://h:29000/custom/metrics") == "h:29000/custom/metrics"


# --- watch_main against the fixture server -----------------------------------------------------


@pytest.fixture
def wedge_server() -> Iterator[str]:
    """The SGLang-shaped wedge server on a free loopback port, under uvicorn in a thread."""
    with serve_in_thread(WedgeState()) as root:
        yield root


def _watch(url: str) -> int:
    console = Console(file=io.StringIO(), width=160)
    return anyio.run(watch_main, [url + "/metrics"], 3.0, 0.2, 1.0, console)


def test_watch_main_exits_1_when_a_queue_is_stuck(wedge_server: str) -> None:
    httpx.post(
        wedge_server + "/control", json={"stuck": {"sglang:num_decode_transfer_queue_reqs": 58}}, trust_env=False
    ).raise_for_status()
    assert _watch(wedge_server) == 1


def test_watch_main_exits_0_when_healthy(wedge_server: str) -> None:
    assert _watch(wedge_server) == 0


def test_watch_main_exits_2_when_nothing_answers() -> None:
    port = free_port()  # closed again: nothing listens there
    console = Console(file=io.StringIO())
    assert anyio.run(watch_main, [f"http://127.0.0.1:{port}/metrics"], 0.5, 0.2, 1.0, console) == 2


def test_an_older_releases_gauge_sorts_with_its_current_name() -> None:
    from dsv4bench.servers.dialect import INFIGHT, PREFILL_PREALLOC
    from dsv4bench.servers.watch import _gauge_sort_key

    series = [
        f'{name}{{engine_type="prefill"}}'
        for name in (INFIGHT, "sglang:num_running_reqs", PREFILL_PREALLOC, "sglang:num_queue_reqs")
    ]
    # running, waiting, bootstrap (was prealloc), inflight (was infight): QUEUE_GAUGES' order.
    assert [s.split("{")[0] for s in sorted(series, key=_gauge_sort_key)] == [
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        PREFILL_PREALLOC,
        INFIGHT,
    ]


# --- kinds that offer no gauges -----------------------------------------------------------------

TRT = "http://trt:8000/metrics"


def test_a_kind_without_gauges_is_not_offered_and_never_a_wedge() -> None:
    st = WatchState(stuck_s=2)
    # A plain OpenAI-compatible server: /metrics 404, its kind unknown.
    plain = "http://plain:8000/metrics"
    for t in range(10):
        st.add(MetricSample(t * S, t * S, plain, False, error="HTTPStatusError: 404", status=404))
    assert (
        st.describe(plain, 9 * S).plain
        == "gauges not offered (/metrics HTTP 404): judged by canaries and /health alone"
    )
    # TensorRT-LLM: gauges held while busy, then `[]` while no iteration runs: the held gauges
    # seen before are not stuck ones, however long the empty answers last.
    st.add(
        MetricSample(
            0, 0, TRT, True, values={"trtllm:numActiveRequests": 3.0, "trtllm:iter": 7.0}, status=200, metrics_json=True
        )
    )
    for t in range(1, 10):
        st.add(
            MetricSample(
                t * S,
                t * S,
                TRT,
                False,
                error="NoIterationStats: none",
                status=200,
                metrics_json=True,
                no_iteration=True,
            )
        )
    assert st.wedge_forming(9 * S) == {}
    assert st.describe(TRT, 9 * S).plain.startswith("gauges not offered (no iteration since the last look)")
    text = _text(render_watch(st))
    assert "scrape failed" not in text and "WEDGE:" not in text and "no wedge forming" in text


def test_a_kind_with_gauges_whose_scrape_fails_says_so() -> None:
    """The look-alikes: vLLM (it has /metrics) answering 404, and a failed TensorRT-LLM scrape
    after a held gauge, keep their clocks and say the scrape failed."""
    st = WatchState(stuck_s=2)
    vllm = "http://vllm:8000/metrics"
    st.add(MetricSample(0, 0, vllm, True, values={"vllm:num_requests_running": 0.0}, status=200))
    st.add(MetricSample(S, S, vllm, False, error="HTTPStatusError: 404", status=404))
    assert st.describe(vllm, S).plain == "scrape failed: HTTPStatusError: 404"
    for t in range(4):
        st.add(
            MetricSample(
                t * S,
                t * S,
                TRT,
                True,
                values={"trtllm:numActiveRequests": 3.0, "trtllm:iter": 7.0},
                status=200,
                metrics_json=True,
            )
        )
    st.add(MetricSample(4 * S, 4 * S, TRT, False, error="ReadTimeout: ", metrics_json=False))
    assert st.wedge_forming(4 * S) == {TRT: ["trtllm:numActiveRequests"]}


@pytest.mark.parametrize(
    "kind_args,words",
    [
        ("plain", "gauges not offered (/metrics HTTP 404)"),
        ("trtllm", "gauges not offered (no iteration since the last look)"),
    ],
)
def test_watch_main_on_kinds_without_gauges(kind_args: str, words: str) -> None:

    import uvicorn

    from tests.fixtures.kinds_server import KindState, build_app
    from tests.fixtures.uvicorn_thread import uvicorn_in_thread

    # trtllm's /metrics held for 1.5 s before its `[]`, as the real one holds it for 2 s.
    state = KindState(kind=kind_args, metrics_hold=1.5 if kind_args == "trtllm" else 0.0)
    config = uvicorn.Config(build_app(state), host="127.0.0.1", port=free_port(), log_level="warning")
    with uvicorn_in_thread(config, "kinds server") as root:
        out = io.StringIO()
        code = anyio.run(watch_main, [f"{root}/metrics"], 2.5, 0.2, 1.0, Console(file=out, width=200))
    text = out.getvalue()
    assert code == 0 and words in text, text
    assert "scrape failed" not in text and "WEDGE" not in text.replace("WEDGE after", "")
