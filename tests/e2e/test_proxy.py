"""`dsv4bench proxy` as a user runs it, a process of its own in front of the known-bad replay
server and of the bundled engine: the openai SDK and raw httpx get the same bytes through it
as straight from the server, the proxy's history of an `agents` run played through it holds
what that run recorded itself, and Ctrl-C writes the report."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from dsv4bench.engine.launcher import start_engine
from dsv4bench.history.run_folder import EVENTS_FILE, read_history

from .conftest import ROOT, free_port, only_run_dir, run_cli

# What differs between two answers to one request: the server's ids and clock.
PER_REQUEST = re.compile(rb'"(id|created)":\s*("[^"]*"|\d+)')


@dataclass
class ProxyProcess:
    url: str  # the OpenAI base URL clients are pointed at
    proc: subprocess.Popen
    out: Path

    def interrupt(self) -> tuple[int, str, str]:
        """Ctrl-C, as a user ends it: the exit code and what it printed."""
        self.proc.send_signal(signal.SIGINT)
        stdout, stderr = self.proc.communicate(timeout=60)
        return self.proc.returncode, stdout, stderr


def start_proxy_cli(upstream: str, out: Path, *args: str) -> ProxyProcess:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "proxy",
            "--upstream",
            upstream,
            "--port",
            str(port),
            "--out",
            str(out),
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    proxy = ProxyProcess(f"http://127.0.0.1:{port}/v1", proc, out)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(f"{proxy.url}/models", timeout=2).status_code == 200:
                return proxy
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the proxy did not start: {proc.communicate()}")


def tagged(session: str, turn: int = 0) -> dict[str, str]:
    """The headers the replay server plays the expert's step by."""
    return {
        "X-Dsv4bench-Session": session,
        "X-Dsv4bench-Turn": str(turn),
        "X-Dsv4bench-Scenario": "coding",
        "X-Dsv4bench-Seed": "7",
    }


def sdk_stream_bytes(base_url: str, headers: dict[str, str], **request) -> bytes:
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30) as client:
        with client.chat.completions.with_streaming_response.create(
            stream=True, extra_headers=headers, **request
        ) as resp:
            return b"".join(resp.iter_bytes())


def raw_stream_bytes(base_url: str, headers: dict[str, str], **request) -> bytes:
    with httpx.Client(timeout=30, trust_env=False) as c:
        return c.post(f"{base_url}/chat/completions", json={**request, "stream": True}, headers=headers).content


def turn_view(t) -> tuple:
    """What two histories of the same traffic must agree on, turn by turn."""
    r = t.response
    answer = (r.content, r.finish_reason, [(c.name, c.arguments) for c in r.tool_calls]) if r else None
    return t.status.value, str(t.error_kind) if t.error_kind else None, sorted({v.code for v in t.verdicts}), answer


def wait_event(run_dir: Path, kind: str, timeout: float) -> dict:
    """The first event of `kind` in a running proxy's history, waited for up to `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        events = run_dir / EVENTS_FILE
        for line in events.read_text().splitlines() if events.exists() else []:
            if (event := json.loads(line))["kind"] == kind:
                return event
        assert time.monotonic() < deadline, f"no {kind} event within {timeout} s"
        time.sleep(0.1)


def test_agents_through_the_proxy_and_the_sdk_get_the_servers_bytes_and_the_same_history(fast_replay, tmp_path):
    proxy = start_proxy_cli(fast_replay.url, tmp_path / "proxy", "--quiet")
    try:
        request = {"model": "replay-dsv4", "messages": [{"role": "user", "content": "fix the bug"}]}
        for i in range(3):
            direct = raw_stream_bytes(fast_replay.url, tagged(f"sdk-{i}"), **request)
            through_sdk = sdk_stream_bytes(proxy.url, tagged(f"sdk-{i}"), **request)
            through_raw = raw_stream_bytes(proxy.url, tagged(f"sdk-{i}"), **request)
            # The replay server stamps `created` with its clock: all else is the same bytes.
            assert (
                PER_REQUEST.sub(b"", through_sdk) == PER_REQUEST.sub(b"", direct) == PER_REQUEST.sub(b"", through_raw)
            )
            assert direct.endswith(b"data: [DONE]\n\n")
        agents = run_cli(
            "agents",
            "--url",
            proxy.url,
            "--sessions",
            "24",
            "--concurrency",
            "8",
            "--max-turns",
            "6",
            "--seed",
            "3",
            "--out",
            str(tmp_path / "agents"),
            "--quiet",
            # the requests agents sends again after the load (triage, persistence) would be turns
            # of the proxy's history and none of agents': this compares the load's turns
            "--triage",
            "off",
            "--persist-sessions",
            "0",
        )
        assert agents.returncode == 0, agents.stderr
        # Beside the traffic the proxy has timed how long the upstream (uvicorn, 5 s) keeps an
        # idle connection, and holds its own a second under that.
        learned = wait_event(only_run_dir(tmp_path / "proxy"), "upstream_keepalive", timeout=15)
        assert learned["how"] == "closed" and learned["applied"] is True, learned
        assert learned["server_idle_s"] == pytest.approx(5.0, abs=0.5) and learned["keepalive_s"] == pytest.approx(
            learned["server_idle_s"] - 1.0
        )
    finally:
        rc, stdout, stderr = proxy.interrupt()
    assert rc == 0, stderr
    run_dir = only_run_dir(tmp_path / "proxy")
    assert "report:" in stdout and (run_dir / "report.md").exists()
    mine = {(t.session, t.turn): turn_view(t) for t in read_history(run_dir).turns if not t.session.startswith("sdk-")}
    theirs = {(t.session, t.turn): turn_view(t) for t in read_history(only_run_dir(tmp_path / "agents")).turns}
    # agents' canaries after the load (one streamed, one not) are no turns of their own; the proxy
    # sees them as the client address's.
    assert sorted(key for key in mine if key not in theirs) == [("127.0.0.1", 0), ("127.0.0.1", 1)]
    assert len(theirs) > 48 and {key: mine[key] for key in theirs} == theirs
    assert any(codes for _, _, codes, _ in theirs.values()), "the replay server planted no fault: nothing compared"
    events = read_history(run_dir).events
    assert [e["reason"] for e in events if e["kind"] == "run_end"] == ["interrupted"]


def test_the_bundled_engine_streams_the_same_bytes_through_the_proxy(tmp_path):
    engine = start_engine([], log_dir=tmp_path)
    try:
        proxy = start_proxy_cli(engine.url, tmp_path / "proxy", "--duration", "600", "--quiet")
        request = {
            "model": "dsv4-mini",
            "temperature": 0,
            "max_tokens": 48,
            "messages": [{"role": "user", "content": "List the files under src/ and read main.py."}],
        }
        try:
            direct = raw_stream_bytes(engine.url, {}, **request)
            through = sdk_stream_bytes(proxy.url, {}, **request)
            with openai.OpenAI(base_url=proxy.url, api_key="unused", max_retries=0, timeout=30) as client:
                chunks = list(client.chat.completions.create(stream=True, **request))
        finally:
            rc, _, stderr = proxy.interrupt()
    finally:
        engine.stop()
    assert rc == 0, stderr
    assert direct.count(b"data: ") > 3 and PER_REQUEST.sub(b"", through) == PER_REQUEST.sub(b"", direct)
    turns = read_history(only_run_dir(tmp_path / "proxy")).turns
    assert [t.status.value for t in turns] == ["ok", "ok"]
    content = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert turns[1].response.content == content and turns[0].response.content == content
    data = [json.loads(line[6:]) for line in direct.split(b"\n") if line.startswith(b"data: {")]
    assert "".join((c["choices"][0]["delta"].get("content") or "") for c in data if c["choices"]) == content


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--upstream", "ftp://x"], "--upstream must be an http(s) URL"),
        (["--upstream", "http://127.0.0.1:9/v1", "--port", "70000"], "--port must be a port number"),
        (["--upstream", "http://127.0.0.1:9/v1", "--duration", "-1"], "--duration must be a positive"),
        (["--upstream", "http://127.0.0.1:9/v1", "--fail-on", "nope"], "--fail-on takes"),
        (["--upstream", f"http://127.0.0.1:{free_port()}/v1"], "cannot reach it"),
        (["--upstream", "http://127.0.0.1:9/v1", "--max-body", "lots"], "--max-body must be a size in bytes"),
        (["--upstream", "http://127.0.0.1:9/v1", "--read-timeout", "0"], "--read-timeout must be a positive"),
        (["--upstream", "http://127.0.0.1:9/v1", "--max-connections", "0"], "--max-connections must be at least 1"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args, needle, tmp_path):
    r = run_cli("proxy", *args, "--out", str(tmp_path), timeout=60)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_busy_port_is_one_line(fast_replay, tmp_path):
    proxy = start_proxy_cli(fast_replay.url, tmp_path / "first", "--quiet")
    try:
        port = proxy.url.rsplit(":", 1)[1].split("/")[0]
        r = run_cli(
            "proxy", "--upstream", fast_replay.url, "--port", port, "--out", str(tmp_path / "second"), timeout=60
        )
    finally:
        proxy.interrupt()
    assert r.returncode == 2 and f"--port {port}: cannot listen" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_duration_ends_the_run_and_the_key_is_written_nowhere(fast_replay, tmp_path):
    key = "sk-bench-secret-0451"
    proxy = start_proxy_cli(
        fast_replay.url, tmp_path / "proxy", "--duration", "4", "--api-key", key, "--fail-on", "corruption,errors"
    )
    raw_stream_bytes(proxy.url, tagged("d-0"), model="replay-dsv4", messages=[{"role": "user", "content": "hi"}])
    stdout, stderr = proxy.proc.communicate(timeout=60)
    run_dir = only_run_dir(tmp_path / "proxy")
    history = read_history(run_dir)
    # The expert's tool call answers a request that offered no tools: unknown_tool, so --fail-on exits 1.
    assert proxy.proc.returncode == 1 and "CORRUPTION" in stdout and "unknown_tool" in stderr, stderr
    assert [e["reason"] for e in history.events if e["kind"] == "run_end"] == ["duration"]
    assert len(history.turns) == 1 and '"$DSV4BENCH_API_KEY"' in history.run["command"]
    assert all(key not in f.read_text() for f in run_dir.rglob("*") if f.suffix in (".json", ".jsonl", ".md"))


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_oversized_bodies_are_refused_with_flat_memory_and_noted(fast_replay, tmp_path):
    proxy = start_proxy_cli(fast_replay.url, tmp_path / "proxy", "--quiet", "--max-body", "1MiB")
    try:
        before = peak_rss_mb(proxy.proc.pid)

        def fifty_mb():
            piece = b"x" * (1 << 20)
            for _ in range(50):
                yield piece

        with httpx.Client(timeout=30, trust_env=False) as c:
            for _ in range(4):
                start = time.monotonic()
                r = c.post(f"{proxy.url}/chat/completions", content=fifty_mb())
                assert r.status_code == 413 and time.monotonic() - start < 5
            # A body under the cap is still served.
            ok = c.post(
                f"{proxy.url}/chat/completions",
                json={"model": "replay-dsv4", "messages": [{"role": "user", "content": "hi " * 100_000}]},
                headers=tagged("big-0"),
            )
            assert ok.status_code == 200
        grown = peak_rss_mb(proxy.proc.pid) - before
    finally:
        rc, _, stderr = proxy.interrupt()
    assert rc == 0, stderr
    assert grown < 40, f"the proxy's peak memory grew {grown:.0f} MB reading four 50 MB bodies"
    run_dir = only_run_dir(tmp_path / "proxy")
    refused = [e for e in read_history(run_dir).events if e["kind"] == "request_too_large"]
    assert len(refused) == 4 and all((1 << 20) < e["bytes_seen"] < (4 << 20) for e in refused)
    assert (run_dir / "turns.jsonl").stat().st_size < 1 << 20
