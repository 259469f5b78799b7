"""`engine serve --pd` as a deployment of processes: the launcher's three ports and /metrics
URLs, each half its own process, chat through the router, the deployment stopping when a half
dies; one-line CLI errors; a few abort-soak storms."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dsv4bench.engine.launcher import start_engine
from dsv4bench.servers.monitor import parse_metrics

ROOT = Path(__file__).resolve().parents[3]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dsv4bench", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_launcher_starts_three_servers_and_exposes_all_their_metrics(tmp_path):
    with start_engine(["--pd", "--num-pages", "1024"], log_dir=tmp_path) as ep:
        assert len(ep.metrics_urls) == 3 and ep.metrics_urls[0] == ep.metrics_url
        r = httpx.post(
            f"{ep.url}/chat/completions",
            timeout=60,
            json={
                "model": "dsv4-mini",
                "messages": [{"role": "user", "content": "Read main.py please."}],
                "max_tokens": 8,
            },
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        types = []
        for url in ep.metrics_urls:
            values = parse_metrics(httpx.get(url, timeout=5).text)
            running = [k for k in values if k.startswith("sglang:num_running_reqs{")]
            assert len(running) == 1 and values[running[0]] == 0
            types.append(running[0].split('engine_type="')[1].split('"')[0])
        assert types == ["router", "prefill", "decode"]
        assert all(httpx.get(root + "/health", timeout=10).status_code == 200 for root in ep.roots)
    assert ep.proc.returncode is not None


def test_each_half_is_its_own_process_and_a_dead_half_stops_the_deployment(tmp_path):
    ep = start_engine(["--pd", "--num-pages", "1024"], log_dir=tmp_path)
    try:
        halves = _children(ep.proc.pid)
        assert sorted(role for role, _ in halves) == ["decode", "prefill"], halves
        assert len({pid for _, pid in halves} | {ep.proc.pid}) == 3
        info = httpx.get(f"{ep.roots[1]}/server_info", timeout=5).json()
        assert info["disaggregation_mode"] == "prefill"
        os.kill(dict(halves)["decode"], signal.SIGKILL)  # as an OOM killer would
        ep.proc.wait(30)
        assert ep.proc.returncode != 0
        assert "the decode process exited with code -9; the deployment stopped" in ep.log_path.read_text()
        deadline = time.monotonic() + 15
        while _alive(dict(halves)["prefill"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(dict(halves)["prefill"])  # nothing is left holding memory or a port
    finally:
        ep.stop()


def _children(pid: int) -> list[tuple[str, int]]:
    """(PD role, pid) of each child process of `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"--pd-role" in cmdline:
            found.append((cmdline[cmdline.index(b"--pd-role") + 1].decode(), int(entry.name)))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--fault", "abort-leak"], "fault abort-leak needs PD mode (--pd)"),
        (["--fault", "bootstrap-stall"], "fault bootstrap-stall needs PD mode (--pd)"),
        (["--prefill-port", "30001"], "need --pd"),
        (["--pd", "--port", "30000"], "the router and prefill ports must differ"),
        (["--pd", "--prefill-port", "9", "--decode-port", "9"], "the prefill and decode ports must differ"),
        (
            ["--pd", "--router", "sglang", "--router-metrics-port", "8000"],
            "the router and router metrics ports must differ",
        ),
    ],
)
def test_bad_pd_flags_are_one_line_errors(args, needle):
    r = run_cli("engine", "serve", *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_few_kill_all_storms_leave_nothing_behind():
    r = subprocess.run(
        [sys.executable, "scripts/abort_soak.py", "--storms", "4", "--clients", "12", "--tiny"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "abort soak: 4 storms x 12 clients" in r.stdout
    summary = r.stdout.strip().splitlines()[-1]
    assert summary.startswith("storms leaving anything behind (") and summary.endswith("): 0"), r.stdout
