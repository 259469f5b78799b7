"""End to end on loopback: vLLM- and TensorRT-LLM-shaped servers (tests/fixtures/kinds_server.py)
are judged by what they offer. Healthy, they are healthy (no /health_generate is no illness);
wedged, chat hanging behind a /health of 200 or a stream that stops after its first chunk,
they are wedged, by `probe` and by `agents` alike."""

from __future__ import annotations

import json

import httpx
import pytest

from dsv4bench.probe import probe, probe_main

from .conftest import only_run_dir, run_cli, start_fixture_server

TIMEOUT = 1.0
KINDS = ("vllm", "trtllm")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kinds")
    started = {k: start_fixture_server("kinds_server.py", tmp, "/health", "--kind", k) for k in KINDS}
    yield {k: s.root for k, s in started.items()}
    for s in started.values():
        s.stop()


def wedge(root: str, how: str, after: int = 0) -> None:
    httpx.post(f"{root}/control", json={"wedge": how, "wedge_after": after}, timeout=2).raise_for_status()


@pytest.mark.parametrize("kind", KINDS)
def test_a_healthy_server_of_each_kind_is_healthy_and_its_missing_endpoints_are_not_offered(servers, kind, tmp_path,
                                                                                            capsys):
    root = servers[kind]
    wedge(root, "none")
    code = probe_main([root], TIMEOUT, tmp_path / "p.json")
    out = capsys.readouterr().out
    assert code == 0, out
    [ep] = json.loads((tmp_path / "p.json").read_text())["endpoints"]
    assert ep["state"] == "healthy" and ep["codes"] == [] and ep["kind"] == kind, ep
    assert ep["canary"]["ok"] and ep["canary_stream"]["ok"] and ep["canary_stream"]["stream"]
    assert ep["health"]["status"] == 200
    assert ep["health_generate"]["result"] == "not_offered" and "/health_generate" in ep["not_offered"]
    assert "/health_generate not offered" in out and "unhealthy" not in out
    found = json.loads((tmp_path / "p.json").read_text())["deployment"]["endpoints"][0]
    assert found["settings"]["version"] in ("0.11.0", "1.1.0")  # from /version: neither has /get_server_info


def test_vllm_gauges_are_read_by_their_vllm_names(servers):
    wedge(servers["vllm"], "none")
    [ep] = probe([servers["vllm"]], timeout=TIMEOUT).endpoints
    assert ep.kind == "vllm" and ep.kind_source == "/metrics vllm series" and ep.role == "unified"
    assert {k.split("{")[0] for k in ep.gauges} == {"vllm:num_requests_running", "vllm:num_requests_waiting"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["hang", "stall"])
def test_a_wedged_server_of_each_kind_is_wedged(servers, kind, how, tmp_path):
    root = servers[kind]
    wedge(root, how)
    code = probe_main([root], TIMEOUT, tmp_path / "p.json")
    [ep] = json.loads((tmp_path / "p.json").read_text())["endpoints"]
    assert code == 1, ep
    assert ep["state"] == "wedged" and "canary_timeout" in ep["codes"] and "health_lies" in ep["codes"], ep
    if how == "stall":
        # Unstreamed, it answers: only the stream shows the hang, and it did start.
        assert ep["canary"]["ok"] and ep["canary_stream"]["result"] == "timeout"
        assert ep["canary_stream"]["first_chunk_s"] is not None and "stalled after its first chunk" in \
            ep["canary_stream"]["error"]
    else:
        assert ep["canary"]["result"] == "timeout" and ep["canary_stream"]["result"] == "timeout"
        assert "queue_stuck" in ep["codes"]  # its gauges held while the canary hung
    wedge(root, "none")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    srv = start_fixture_server("kinds_server.py", tmp_path_factory.mktemp("plain"), "/v1/models", "--kind", "plain")
    yield srv.root
    srv.stop()


def test_a_server_of_no_known_kind_is_judged_by_what_answers(plain, tmp_path, capsys):
    """/health, /health_generate and /metrics all 404: not offered, so the canaries judge it."""
    wedge(plain, "none")
    code = probe_main([plain], TIMEOUT, tmp_path / "p.json")
    out = capsys.readouterr().out
    [ep] = json.loads((tmp_path / "p.json").read_text())["endpoints"]
    assert code == 0 and ep["state"] == "healthy", out
    assert ep["kind"] == "unknown" and sorted(ep["not_offered"]) == ["/health", "/health_generate", "/metrics"]
    assert ep["health"]["result"] == "not_offered" and ep["health"]["status"] == 404
    assert "gauges not offered: judged by its canaries and /health" in out
    # Its look-alike wedged: the canaries hang, and no /health to lie.
    wedge(plain, "stall")
    [ep] = probe([plain], timeout=TIMEOUT).endpoints
    assert ep.state == "wedged" and ep.codes == ["canary_timeout"], ep.reasons
    wedge(plain, "none")


# --- agents: the wedge after the load -------------------------------------------------------------

def agents(root: str, out, *extra: str):
    return run_cli("agents", "--url", f"{root}/v1", "--metrics-interval", "0.2", "--sessions", "2",
                   "--concurrency", "2", "--max-turns", "2", "--quiet", "--drain-timeout", "1",
                   "--canary-timeout", "1", "--ttft-timeout", "3", "--out", str(out), *extra, timeout=120)


@pytest.mark.parametrize("kind", KINDS)
def test_agents_on_a_healthy_server_of_each_kind_is_clean(servers, kind, tmp_path):
    wedge(servers[kind], "none")
    r = agents(servers[kind], tmp_path)
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["verdict"] == "CLEAN", (summary, r.stdout[-2000:], r.stderr[-2000:])
    assert summary["turns"]["ok"] == 4 and summary["tool_calls"] >= 2  # streamed turns, tool calls and all
    # Its /metrics was found and watched (TensorRT-LLM's JSON stats as well as vLLM's names).
    assert f"{servers[kind]}/metrics" in summary["wedge"]
    assert all(not w["codes"] for w in summary["wedge"].values())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["hang", "stall"])
def test_agents_find_the_wedge_that_sets_in_after_the_load(servers, kind, how, tmp_path):
    # 2 sessions of 2 turns: 4 chats answered, then the wedge, there for the final checks.
    wedge(servers[kind], how, after=4)
    r = agents(servers[kind], tmp_path)
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["verdict"] == "WEDGE", (summary, r.stdout[-2000:], r.stderr[-2000:])
    assert summary["turns"]["error"] == 0, summary["turns"]  # the load itself was served
    codes = {c for w in summary["wedge"].values() for c in w["codes"]}
    assert "canary_timeout" in codes, summary["wedge"]
    held = summary["wedge"][f"{servers[kind]}/metrics"]["gauges"]
    assert any(v > 0 for v in held.values()), held  # the gauges it offers show the requests held
    wedge(servers[kind], "none")
