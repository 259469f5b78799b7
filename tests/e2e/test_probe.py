"""End to end on loopback: the wedge test server, switched into the incident's shapes, must be
called healthy, wedged or unreachable by `probe`, and judged by the detector from real scrapes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from rich.console import Console

from dsv4bench.servers.canary import CanaryResult, HealthResult, check_canary, check_health
from dsv4bench.servers.monitor import MetricSample, scrape_once
from dsv4bench.servers.probe import DEFAULT_STUCK_S, probe, probe_exit_code, probe_main, render_probe
from dsv4bench.servers.wedge import WedgeConfig, detect_wedge

from dsv4bench.engine.launcher import start_engine

from .conftest import ROOT, free_port, start_fixture_server

TIMEOUT = 1.0  # canary / health_generate hang until this client deadline


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_fixture_server("wedge_server.py", tmp_path_factory.mktemp("wedge"), "/health")
    yield srv.root
    srv.stop()


def control(root: str, **state) -> None:
    httpx.post(f"{root}/control", json={"reset": True, **state}, timeout=2).raise_for_status()


def test_probe_healthy_exits_0(server, tmp_path, capsys):
    control(server)
    result = probe([server], timeout=TIMEOUT)
    [ep] = result.endpoints
    assert ep.state == "healthy", ep.reasons
    assert ep.canary.ok and ep.health.status == 200 and ep.health_generate.status == 200
    assert probe_exit_code(result) == 0
    assert probe_main([server], TIMEOUT, tmp_path / "p.json") == 0
    assert json.loads((tmp_path / "p.json").read_text())["exit_code"] == 0
    assert f"{server}: healthy" in capsys.readouterr().out


def test_probe_stuck_and_lying_exits_1_and_names_the_gauge(server, tmp_path, capsys):
    control(server, stuck={"sglang:num_decode_transfer_queue_reqs": 58}, wedged=True, lie_health=True)
    t0 = time.monotonic()
    code = probe_main([server], TIMEOUT, tmp_path / "p.json")
    assert time.monotonic() - t0 < 5 * TIMEOUT  # a hung server must not hang the probe
    assert code == 1
    out = capsys.readouterr().out
    assert "sglang:num_decode_transfer_queue_reqs" in out and "=58" in out and "wedged" in out
    [ep] = json.loads((tmp_path / "p.json").read_text())["endpoints"]
    assert ep["state"] == "wedged"
    assert ep["codes"] == ["canary_timeout", "health_lies", "queue_stuck"]
    assert ep["health"]["status"] == 200 and ep["health_generate"]["status"] is None
    assert any(k.startswith("sglang:num_decode_transfer_queue_reqs{") and v == 58 for k, v in ep["gauges"].items())


def test_probe_wedged_with_honest_health_exits_1(server):
    control(server, stuck={"sglang:num_prefill_inflight_queue_reqs": 1}, wedged=True)
    [ep] = probe([server], timeout=TIMEOUT).endpoints
    assert ep.state == "wedged" and ep.health.status == 503
    assert ep.codes == ["canary_timeout", "queue_stuck"]


def test_probe_unreachable_exits_2(server):
    control(server)
    dead = f"http://127.0.0.1:{free_port()}"
    result = probe([server, dead], timeout=TIMEOUT)
    assert [e.state for e in result.endpoints] == ["healthy", "unreachable"]
    assert probe_exit_code(result) == 2


async def _record(
    root: str, scrapes: int, every: float
) -> tuple[list[MetricSample], int, list[HealthResult], list[CanaryResult]]:
    """Scrape like the monitor does after load stops, then canary + /health like a run does."""
    async with httpx.AsyncClient(trust_env=False) as client:
        stopped = time.monotonic_ns()
        samples = []
        for _ in range(scrapes):
            samples.append(await scrape_once(client, f"{root}/metrics", TIMEOUT))
            await anyio.sleep(every)
        samples.append(await scrape_once(client, f"{root}/metrics", TIMEOUT))
        h = await check_health(client, root, timeout=TIMEOUT)
        c = await check_canary(client, f"{root}/v1", "wedge-test", timeout=TIMEOUT)
    return samples, stopped, [h], [c]


CFG = WedgeConfig(drain_timeout_s=10.0, min_stuck_s=0.4)


def test_detector_on_real_scrapes_stuck_and_lying(server):
    control(server, stuck={"sglang:num_decode_transfer_queue_reqs": 58}, wedged=True, lie_health=True)
    samples, stopped, h, c = anyio.run(_record, server, 5, 0.12)
    found = detect_wedge(samples, stopped, CFG, health=h, canaries=c)
    assert found[f"{server}/metrics"].codes == ["queue_stuck"]
    assert "sglang:num_decode_transfer_queue_reqs" in found[f"{server}/metrics"].details[0]
    assert found[f"{server}/v1"].codes == ["canary_timeout", "health_lies"]


def test_detector_on_real_scrapes_ghost_and_healthy(server):
    control(server, ghost=True)
    samples, stopped, h, c = anyio.run(_record, server, 5, 0.12)
    found = detect_wedge(samples, stopped, CFG, health=h, canaries=c)
    assert found[f"{server}/metrics"].codes == ["ghost_requests"]
    control(server)
    samples, stopped, h, c = anyio.run(_record, server, 2, 0.05)
    found = detect_wedge(samples, stopped, CFG, health=h, canaries=c)
    assert all(f.codes == [] for f in found.values()), found
    assert found[f"{server}/metrics"].drain_s == 0.0


# --- each endpoint by its role --------------------------------------------------------------------


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """Three wedge servers playing a PD deployment: router, prefill (says so in /get_server_info)
    and decode (says so in its metrics labels only)."""
    tmp = tmp_path_factory.mktemp("trio")
    servers = [start_fixture_server("wedge_server.py", tmp, "/health") for _ in range(3)]
    roots = [s.root for s in servers]
    yield roots
    for s in servers:
        s.stop()


def play(roots: list[str], router: dict | None = None, prefill: dict | None = None, decode: dict | None = None):
    for root, role, state in zip(roots, ("router", "prefill", "decode"), (router, prefill, decode)):
        control(root, engine_type=role, server_info=role != "decode", **(state or {}))


def test_a_healthy_pd_trio_is_healthy_and_only_the_router_gets_a_canary(trio):
    play(trio)
    result = probe(trio, timeout=TIMEOUT)
    assert [(e.role, e.state) for e in result.endpoints] == [
        ("router", "healthy"),
        ("prefill", "healthy"),
        ("decode", "healthy"),
    ]
    router, prefill, decode = result.endpoints
    assert router.canary.ok and router.role_source == "/get_server_info engine_type"
    assert prefill.role_source == "/get_server_info disaggregation_mode"
    assert decode.role_source == "/metrics engine_type label"
    assert prefill.canary is None and decode.canary is None and "router" in prefill.canary_skipped
    assert probe_exit_code(result) == 0


def test_a_leaked_queue_behind_a_serving_router_is_stuck_after_stuck_s(trio):
    play(trio, decode={"stuck": {"sglang:num_decode_transfer_queue_reqs": 3}})
    t0 = time.monotonic()
    result = probe(trio, timeout=TIMEOUT, stuck_s=0.5)
    assert time.monotonic() - t0 >= 0.5
    router, prefill, decode = result.endpoints
    assert router.state == "healthy" and prefill.state == "healthy"
    assert decode.state == "wedged" and decode.codes == ["queue_stuck"]
    assert any("sglang:num_decode_transfer_queue_reqs=3" in r and "no counter moved" in r for r in decode.reasons)
    assert probe_exit_code(result) == 1


def test_a_hanging_router_makes_the_held_worker_queues_stuck(trio):
    play(
        trio,
        router={"wedged": True, "lie_health": True},
        prefill={"stuck": {"sglang:num_prefill_bootstrap_queue_reqs": 2}},
    )
    router, prefill, decode = probe(trio, timeout=TIMEOUT).endpoints
    assert router.codes == ["canary_timeout", "health_lies"]
    assert prefill.codes == ["queue_stuck"] and "hung" in prefill.reasons[0]
    assert decode.state == "healthy"


@pytest.mark.parametrize(
    "answer,state,code",
    [("404", "error", 2), ("401", "error", 2), ("html", "error", 2), ("not_json", "error", 2), ("500", "unhealthy", 1)],
)
def test_a_canary_answered_with_an_error_is_that_error_never_a_hang(trio, answer, state, code):
    play(trio, router={"chat_answer": answer, "lie_health": True})
    result = probe(trio, timeout=TIMEOUT)
    router = result.endpoints[0]
    assert router.codes == [] and router.state == state, router
    assert router.canary.result == "error" and router.canary.latency_s < TIMEOUT
    assert any(e.startswith("canary: ") and "not a hang" in e for e in router.errors)
    assert probe_exit_code(result) == code


def test_a_worker_whose_health_generate_hangs_while_health_says_200_lies(trio):
    play(trio, decode={"wedged": True, "lie_health": True})
    decode = probe(trio, timeout=TIMEOUT).endpoints[2]
    assert decode.canary is None and decode.codes == ["health_lies"]
    assert decode.reasons == ["health_lies: /health answered 200 while /health_generate hung"]


def test_the_probe_output_fits_80_columns_with_one_verdict_line_per_endpoint(trio):
    play(
        trio,
        router={"wedged": True, "lie_health": True},
        decode={"stuck": {"sglang:num_decode_transfer_queue_reqs": 58}},
    )
    result = probe(trio, timeout=TIMEOUT)
    console = Console(width=80, record=True, file=io.StringIO())
    render_probe(result, console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    heads = [line.rstrip() for line in lines if not line.startswith(" ")]
    assert heads[:3] == [
        f"router   {trio[0]}: wedged (canary_timeout, health_lies)",
        f"prefill  {trio[1]}: healthy",
        f"decode   {trio[2]}: wedged (queue_stuck)",
    ]
    assert heads[3] == "1 healthy, 2 wedged (exit 1)"
    assert "sglang:num_decode_transfer_queue_reqs=58" in text
    assert "not sent: a prefill server takes its requests from the router" in text


# --- the bundled PD engine ------------------------------------------------------------------------


def cli_80(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`dsv4bench ARGS` in an 80-column terminal."""
    return subprocess.run(
        [sys.executable, "-m", "dsv4bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80"},
    )


def test_probe_and_watch_on_the_healthy_bundled_pd_engine(tmp_path):
    with start_engine(["--pd", "--num-pages", "1024"], log_dir=tmp_path) as engine:
        router, prefill, decode = engine.roots
        # The router's URL alone: its /workers names the halves, each judged by its role.
        r = cli_80("probe", router, "--json", str(tmp_path / "p.json"))
        assert r.returncode == 0, r.stdout + r.stderr
        assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
        for role, root in (("router", router), ("prefill", prefill), ("decode", decode)):
            assert f"{role:<8} {root}: healthy" in r.stdout, r.stdout
        assert "listed by the router as prefill, healthy" in r.stdout and "transfer tcp" in r.stdout, r.stdout
        found = json.loads((tmp_path / "p.json").read_text())
        assert [(e["root"], e["role"]) for e in found["endpoints"]] == [
            (router, "router"),
            (prefill, "prefill"),
            (decode, "decode"),
        ]
        assert found["endpoints"][0]["canary"]["ok"] and found["endpoints"][1]["canary"] == {}
        assert found["deployment"]["found_via"] == [router]
        halves = found["deployment"]["endpoints"][1:]
        assert [e["settings"]["disaggregation_mode"] for e in halves] == ["prefill", "decode"]
        assert found["deployment"]["endpoints"][1]["listed_bootstrap_port"] > 0

        alone = cli_80("probe", router, "--no-workers", "--json", str(tmp_path / "alone.json"))
        assert [e["root"] for e in json.loads((tmp_path / "alone.json").read_text())["endpoints"]] == [router], alone

        w = cli_80("watch", *engine.metrics_urls, "--duration", "2", "--interval", "0.5")
        assert w.returncode == 0, w.stdout + w.stderr
        lines = [line for line in w.stderr.splitlines() if line.strip()]
        assert lines and max(len(line) for line in lines) <= 80, w.stderr
        assert "{" not in w.stderr and "no wedge forming" in w.stderr
        heads = [line.split() for line in lines if not line.startswith(" ") and ":" in line.split()[0]]
        assert [h[:3] for h in heads[-3:]] == [
            [urlsplit(u).netloc, role, "idle"] for u, role in zip(engine.roots, ("router", "prefill", "decode"))
        ]
        router_rows = lines[lines.index(next(x for x in lines if x.startswith(urlsplit(router).netloc + " "))) + 1 :][
            :2
        ]
        assert [row.split()[:2] for row in router_rows] == [["waiting", "0"], ["running", "0"]]


def _storm(served, n: int, ready, max_tokens: int = 200) -> None:
    """`n` streamed chats through the router at once; when `ready()`, every client disconnects."""

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60, trust_env=False) as client:

            async def one(i: int) -> None:
                text = " ".join(f"file{i}_{j}.py" for j in range(40))
                body = {
                    "model": "dsv4-mini",
                    "messages": [{"role": "user", "content": f"Read {text}"}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "stream": True,
                }
                async with client.stream("POST", f"{served.api}/chat/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        pass

            deadline = time.monotonic() + 30
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
                while not ready():
                    assert time.monotonic() < deadline, "the storm never reached the queues it aims at"
                    await anyio.sleep(0.005)
                tg.cancel_scope.cancel()

    anyio.run(main)


def _served(*faults: str):
    from dsv4bench.engine.model.kv_pools import KVPools
    from tests.engine.pd.helpers import ServedPD, tiny_cfg

    # A 13-page prompt crosses the link in ~0.3 s, so transfers are caught in flight: the
    # disconnects' aborts reach the prefill before its transfers end, even on a loaded machine
    # (at ~0.1 s, CI once saw every prefill transfer end first, and no leak there to find).
    link_gbps = 13 * KVPools(tiny_cfg(num_pages=1)).bytes_per_page() / 0.3 / 1e9
    return ServedPD(link_gbps=link_gbps, health_timeout_s=1.0, chunked_prefill_tokens=32, faults=frozenset(faults))


def _probe_pd(served, tmp_path, *extra: str) -> tuple[int, list[dict], str]:
    r = cli_80("probe", served.router, served.prefill, served.decode, "--json", str(tmp_path / "p.json"), *extra)
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
    return r.returncode, json.loads((tmp_path / "p.json").read_text())["endpoints"], r.stdout


def test_abort_leak_after_a_killed_load_is_wedged(tmp_path):
    from tests.engine.pd.helpers import wait_until

    served = _served("abort-leak")
    try:
        code, found, out = _probe_pd(served, tmp_path)
        assert code == 0 and [e["state"] for e in found] == ["healthy"] * 3, out
        _storm(
            served,
            12,
            lambda: (
                served.pd.prefill.stats.num_prefill_inflight_queue >= 1
                and served.pd.decode.stats.num_decode_transfer_queue >= 3
            ),
        )
        wait_until(lambda: served.pd.decode.stats.num_running == 0, what="the killed decodes to end")
        code, found, out = _probe_pd(served, tmp_path, "--stuck-s", "1")
        assert code == 1, out
        router, prefill, decode = found
        assert router["state"] == "healthy" and router["canary"]["ok"]  # it still serves: the wedge is in the queues
        assert prefill["codes"] == ["queue_stuck"] and decode["codes"] == ["queue_stuck"], out
        assert any("sglang:num_decode_transfer_queue_reqs=" in r for r in decode["reasons"])
        assert any("sglang:num_prefill_inflight_queue_reqs=" in r for r in prefill["reasons"])
        assert "decode   " + served.decode + ": wedged (queue_stuck)" in out
    finally:
        served.stop()


def test_bootstrap_stall_after_a_killed_load_is_wedged(tmp_path):
    from tests.engine.pd.helpers import wait_until

    served = _served("bootstrap-stall")
    try:
        _storm(served, 8, lambda: served.pd.decode.stats.num_running >= 2)
        wait_until(lambda: not served.pd.bootstrap.alive(), what="the bootstrap worker to die")
        code, found, out = _probe_pd(served, tmp_path, "--timeout", "3")
        assert code == 1, out
        router, prefill, decode = found
        assert "canary_timeout" in router["codes"] and router["canary"]["result"] == "timeout"
        assert "health_lies" not in router["codes"] and router["health"]["status"] == 503  # it tells the truth
        # The prefill half says it is down; the requests whose KV never comes wait in the
        # decode half's transfer queue while the canary hangs.
        assert prefill["state"] == "unhealthy" and prefill["health"]["status"] == 503
        assert decode["codes"] == ["queue_stuck"], out
        assert any("sglang:num_decode_transfer_queue_reqs=" in r for r in decode["reasons"]), out
        assert prefill["canary"] == {} and decode["canary"] == {}
    finally:
        served.stop()


# --- the run's final checks, by role --------------------------------------------------------------


def test_the_runs_final_checks_judge_each_server_by_its_role(trio, tmp_path):
    from dsv4bench.history.run_folder import EVENTS_FILE, read_jsonl

    from .conftest import only_run_dir, run_cli

    play(trio, router={"chat_answer": "html"})
    metrics = [a for root in trio for a in ("--metrics", f"{root}/metrics")]
    r = run_cli(
        "agents",
        "--url",
        f"{trio[0]}/v1",
        *metrics,
        "--metrics-interval",
        "0.2",
        "--sessions",
        "1",
        "--concurrency",
        "1",
        "--max-turns",
        "1",
        "--no-stream",
        "--quiet",
        "--drain-timeout",
        "1",
        "--canary-timeout",
        "2",
        "--out",
        str(tmp_path),
    )
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] != "WEDGE", r.stdout + r.stderr
    events, _ = read_jsonl(run_dir / EVENTS_FILE)
    canaries = [e for e in events if e["kind"] == "canary"]
    assert sorted(c["stream"] for c in canaries) == [False, True]  # sent not streamed and streamed
    for c in canaries:
        assert c["endpoint"] == f"{trio[0]}/v1" and c["role"] == "router"
        assert c["result"] == "error" and not c["ok"] and "HTML" in c["error"]
    found = summary["wedge"][f"{trio[0]}/v1"]
    assert found["codes"] == [] and any("not a hang" in e for e in found["check_errors"])
    stopped = next(e["t_ns"] for e in events if e["kind"] == "load_stopped")
    after = {
        (e["endpoint"], e.get("role")) for e in events if e["kind"] == "health" and e["t_ns"] >= stopped and "role" in e
    }
    assert after == {
        (f"{trio[0]}/health", "router"),
        (f"{trio[1]}/health", "prefill"),
        (f"{trio[1]}/health_generate", "prefill"),
        (f"{trio[2]}/health", "decode"),
        (f"{trio[2]}/health_generate", "decode"),
    }


def test_failure_counters_that_rose_during_the_probe_are_shown_not_judged():
    from dsv4bench.servers.probe import EndpointProbe, ProbeResult, _classify

    failed = 'sglang:num_bootstrap_failed_reqs_total{engine_type="prefill"}'
    ok = [HealthResult(0, f"http://p:1{path}", "ok", 0.01, 200) for path in ("/health", "/health_generate")]
    ep = EndpointProbe(
        root="http://p:1",
        role="prefill",
        health=ok[0],
        health_generate=ok[1],
        looks=[(0, {failed: 1.0}), (10**9, {failed: 4.0})],
    )
    _classify(ep, None, DEFAULT_STUCK_S)
    assert ep.state == "healthy" and ep.codes == [] and ep.failures == [f"{failed} +3"]
    console = Console(width=80, record=True, file=io.StringIO())
    render_probe(ProbeResult([ep]), console)
    text = " ".join(console.export_text().split())
    assert f"failed {failed} +3 during the probe" in text
