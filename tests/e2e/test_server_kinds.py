"""End to end on loopback: vLLM- and TensorRT-LLM-shaped servers (tests/fixtures/kinds_server.py)
are judged by what they offer. Healthy, they are healthy (no /health_generate is no illness);
wedged, chat hanging behind a /health of 200 or a stream that stops after its first chunk,
they are wedged, by `probe` and by `agents` alike.

Timed for a slow machine (CI: two slow cores, and runs side by side): a healthy server answers at
once, so its deadlines are long and cost nothing; a wedge is given time to show, set in only once
the load was served (`--wedge-after`), and each server binds its own port (no port is picked,
freed and taken again, which a run beside this one could take first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dsv4bench.servers.probe import probe, probe_main

from .conftest import ROOT, only_run_dir, run_cli

HEALTHY_TIMEOUT = 10.0  # a healthy answer comes at once: long only for a loaded machine
WEDGED_TIMEOUT = 2.0  # each hung check waits this out; the first chunk of a stalled stream comes within it
KINDS = ("vllm", "trtllm")


class KindsServer:
    """tests/fixtures/kinds_server.py as a child process on a port it bound itself."""

    def __init__(self, tmp: Path, *args: str, ready_path: str = "/v1/models", timeout: float = 60.0) -> None:
        port_file = tmp / f"port-{os.getpid()}-{time.monotonic_ns()}"
        self.log = open(port_file.with_suffix(".log"), "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "fixtures" / "kinds_server.py"),
                "--port",
                "0",
                "--port-file",
                str(port_file),
                *args,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if port_file.exists():
                self.root = f"http://127.0.0.1:{port_file.read_text()}"
                try:
                    if httpx.get(self.root + ready_path, timeout=2, trust_env=False).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"kinds_server.py {' '.join(args)} did not start: {port_file.with_suffix('.log').read_text()[-2000:]}"
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kinds")
    started = {k: KindsServer(tmp, "--kind", k) for k in KINDS}
    yield {k: s.root for k, s in started.items()}
    for s in started.values():
        s.stop()


def wedge(root: str, how: str, after: int = 0, **more: float) -> None:
    httpx.post(
        f"{root}/control", json={"wedge": how, "wedge_after": after, **more}, timeout=10, trust_env=False
    ).raise_for_status()


@pytest.mark.parametrize("kind", KINDS)
def test_a_healthy_server_of_each_kind_is_healthy_and_its_missing_endpoints_are_not_offered(
    servers, kind, tmp_path, capsys
):
    root = servers[kind]
    wedge(root, "none")
    code = probe_main([root], HEALTHY_TIMEOUT, tmp_path / "p.json")
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
    [ep] = probe([servers["vllm"]], timeout=HEALTHY_TIMEOUT).endpoints
    assert ep.kind == "vllm" and ep.kind_source == "/metrics vllm series" and ep.role == "unified"
    assert {k.split("{")[0] for k in ep.gauges} == {"vllm:num_requests_running", "vllm:num_requests_waiting"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["hang", "stall"])
def test_a_wedged_server_of_each_kind_is_wedged(servers, kind, how, tmp_path):
    root = servers[kind]
    wedge(root, how)
    code = probe_main([root], WEDGED_TIMEOUT, tmp_path / "p.json")
    [ep] = json.loads((tmp_path / "p.json").read_text())["endpoints"]
    assert code == 1, ep
    assert ep["state"] == "wedged" and "canary_timeout" in ep["codes"] and "health_lies" in ep["codes"], ep
    if how == "stall":
        # Unstreamed, it answers: only the stream shows the hang, and it did start.
        assert ep["canary"]["ok"] and ep["canary_stream"]["result"] == "timeout"
        assert (
            ep["canary_stream"]["first_chunk_s"] is not None
            and "stalled after its first chunk" in ep["canary_stream"]["error"]
        )
    else:
        assert ep["canary"]["result"] == "timeout" and ep["canary_stream"]["result"] == "timeout"
        assert "queue_stuck" in ep["codes"]  # its gauges held while the canary hung
    wedge(root, "none")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    srv = KindsServer(tmp_path_factory.mktemp("plain"), "--kind", "plain")
    yield srv.root
    srv.stop()


def test_a_server_of_no_known_kind_is_judged_by_what_answers(plain, tmp_path, capsys):
    """/health, /health_generate and /metrics all 404: not offered, so the canaries judge it."""
    wedge(plain, "none")
    code = probe_main([plain], HEALTHY_TIMEOUT, tmp_path / "p.json")
    out = capsys.readouterr().out
    [ep] = json.loads((tmp_path / "p.json").read_text())["endpoints"]
    assert code == 0 and ep["state"] == "healthy", out
    assert ep["kind"] == "unknown" and sorted(ep["not_offered"]) == ["/health", "/health_generate", "/metrics"]
    assert ep["health"]["result"] == "not_offered" and ep["health"]["status"] == 404
    assert "gauges not offered: judged by its canaries and /health" in out
    # Its look-alike wedged: the canaries hang, and no /health to lie.
    wedge(plain, "stall")
    [ep] = probe([plain], timeout=WEDGED_TIMEOUT).endpoints
    assert ep.state == "wedged" and ep.codes == ["canary_timeout"], ep.reasons
    wedge(plain, "none")


# --- agents: the wedge after the load -------------------------------------------------------------


def agents(root: str, out, *extra: str):
    # A drain window of several scrapes, however slow each, and canaries and turns that a loaded
    # machine answers in time: the healthy look-alikes stay CLEAN, the wedges still show.
    return run_cli(
        "agents",
        "--url",
        f"{root}/v1",
        "--metrics-interval",
        "0.2",
        "--sessions",
        "2",
        "--concurrency",
        "2",
        "--max-turns",
        "2",
        "--quiet",
        "--drain-timeout",
        "3",
        "--canary-timeout",
        "3",
        "--ttft-timeout",
        "20",
        "--out",
        str(out),
        *extra,
        timeout=180,
    )


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


def _canary_cell(report: str, endpoint: str) -> str:
    """The canary column of the report's wedge row for `endpoint`."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in report.splitlines()
        if line.startswith("|")
    ]
    return next(row[-1] for row in rows if row[0] == endpoint and len(row) == 5)


@pytest.mark.parametrize("how", ["stall", "hang_unstreamed", "none"])
def test_the_report_shows_the_canary_that_failed(servers, how, tmp_path):
    """Streamed stalls while unstreamed answers, and the reverse: either way the finding's canary
    is the one that hung, not whichever was recorded last. Healthy, it is the one that answered."""
    root = servers["vllm"]
    wedge(root, how, after=4)
    try:
        r = agents(root, tmp_path)
    finally:
        wedge(root, "none")
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    found = summary["wedge"][f"{root}/v1"]
    report = (run_dir / "report.md").read_text()
    if how == "none":
        assert summary["verdict"] == "CLEAN" and found["canary"]["ok"], (summary, r.stderr[-2000:])
        return
    assert summary["verdict"] == "WEDGE" and "canary_timeout" in found["codes"], (summary, r.stderr[-2000:])
    assert found["canary"]["result"] == "timeout" and not found["canary"]["ok"], found
    # Which of the two hung: a stalled stream says so in its error.
    assert ("stalled after its first chunk" in (found["canary"]["error"] or "")) == (how == "stall"), found
    assert _canary_cell(report, f"{root}/v1").startswith("hung"), report


def test_a_trtllm_metrics_that_holds_each_scrape_is_still_read(servers, tmp_path):
    """trtllm-serve's /metrics answers only after it gathered stats for a while (2 s; here 1.5 s):
    scrapes given only the 0.2 s scrape interval would all time out and leave the wedge without
    its gauges. Given the kind's own timeout, they are read."""
    root = servers["trtllm"]
    wedge(root, "hang", after=4, metrics_hold=1.5)
    try:
        r = agents(root, tmp_path)
    finally:
        wedge(root, "none", metrics_hold=0)
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "WEDGE", (summary, r.stderr[-2000:])
    held = summary["wedge"][f"{root}/metrics"]["gauges"]
    assert held and any(v > 0 for v in held.values()), summary["wedge"]
    samples = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    mine = [s for s in samples if s["endpoint"] == f"{root}/metrics"]
    assert mine and not [s for s in mine if "Timeout" in s.get("error", "")], mine
