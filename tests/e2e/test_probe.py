"""End to end on loopback: the wedge test server, switched into the incident's shapes, must be
called healthy, wedged or unreachable by `probe`, and judged by the detector from real scrapes."""

from __future__ import annotations

import json
import time

import anyio
import httpx
import pytest

from dsv4bench.canary import canary, health
from dsv4bench.monitor import scrape_once
from dsv4bench.probe import probe, probe_exit_code, probe_main
from dsv4bench.wedge import WedgeConfig, detect_wedge

from .conftest import free_port, start_fixture_server

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
    assert ep.canary["ok"] and ep.health["status"] == 200 and ep.health_generate["status"] == 200
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
    assert ep.state == "wedged" and ep.health["status"] == 503
    assert ep.codes == ["canary_timeout", "queue_stuck"]


def test_probe_unreachable_exits_2(server):
    control(server)
    dead = f"http://127.0.0.1:{free_port()}"
    result = probe([server, dead], timeout=TIMEOUT)
    assert [e.state for e in result.endpoints] == ["healthy", "unreachable"]
    assert probe_exit_code(result) == 2


async def _record(root: str, scrapes: int, every: float) -> tuple[list[dict], int, list[dict], list[dict]]:
    """Scrape like the monitor does after load stops, then canary + /health like a run does."""
    async with httpx.AsyncClient(trust_env=False) as client:
        stopped = time.monotonic_ns()
        samples = []
        for _ in range(scrapes):
            samples.append(await scrape_once(client, f"{root}/metrics", TIMEOUT))
            await anyio.sleep(every)
        samples.append(await scrape_once(client, f"{root}/metrics", TIMEOUT))
        h = await health(client, root, timeout=TIMEOUT)
        c = await canary(client, f"{root}/v1", "wedge-test", timeout=TIMEOUT)
    return samples, stopped, [h], [c]


CFG = WedgeConfig(drain_timeout_s=10.0, min_stuck_s=0.4)


def test_detector_on_real_scrapes_stuck_and_lying(server):
    control(server, stuck={"sglang:num_decode_transfer_queue_reqs": 58}, wedged=True, lie_health=True)
    samples, stopped, h, c = anyio.run(_record, server, 5, 0.12)
    found = detect_wedge(samples, stopped, CFG, health=h, canaries=c)
    assert found[f"{server}/metrics"]["codes"] == ["queue_stuck"]
    assert "sglang:num_decode_transfer_queue_reqs" in found[f"{server}/metrics"]["details"][0]
    assert found[f"{server}/v1"]["codes"] == ["canary_timeout", "health_lies"]


def test_detector_on_real_scrapes_ghost_and_healthy(server):
    control(server, ghost=True)
    samples, stopped, h, c = anyio.run(_record, server, 5, 0.12)
    found = detect_wedge(samples, stopped, CFG, health=h, canaries=c)
    assert found[f"{server}/metrics"]["codes"] == ["ghost_requests"]
    control(server)
    samples, stopped, h, c = anyio.run(_record, server, 2, 0.05)
    found = detect_wedge(samples, stopped, CFG, health=h, canaries=c)
    assert all(f["codes"] == [] for f in found.values()), found
    assert found[f"{server}/metrics"]["drain_s"] == 0.0
