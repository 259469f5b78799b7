"""Test servers on loopback, each started as its own process for the end-to-end tests: the
known-bad replay server and the wedge server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


from dsv4bench.engine.launcher import free_port

__all__ = ["ROOT", "free_port", "only_run_dir", "run_cli", "start_fixture_server"]


@dataclass
class FixtureServer:
    """A tests/fixtures server running as a child process."""

    root: str
    proc: subprocess.Popen
    log: object

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


def start_fixture_server(script: str, tmp: Path, ready_path: str, *args: str, timeout: float = 30.0) -> FixtureServer:
    """Run tests/fixtures/SCRIPT --port P ARGS and wait until GET ready_path answers 200."""
    port = free_port()
    log_path = tmp / f"{Path(script).stem}-{port}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "fixtures" / script), "--port", str(port), *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    srv = FixtureServer(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(srv.root + ready_path, timeout=1).status_code == 200:
                return srv
        except httpx.HTTPError:
            time.sleep(0.1)
    srv.stop()
    raise RuntimeError(f"{script} did not start: {log_path.read_text()[-2000:]}")


@dataclass
class ReplayServer:
    url: str
    ledger: Path
    server: FixtureServer

    def stop(self) -> None:
        self.server.stop()

    def planted(self) -> dict[tuple[str, int], frozenset[str]]:
        """(session, turn) -> verdict codes the harness must report, from the server's ledger."""
        out = {}
        for line in self.ledger.read_text().splitlines():
            d = json.loads(line)
            out[(d["session"], d["turn"])] = frozenset(d["codes"])
        return out


def start_replay(
    tmp: Path, fault_rate: int = 12, stall: float = 15.0, family: str | None = None, latency: float = 0.0
) -> ReplayServer:
    """The replay server; `family`: the model family its answers are written in (its --family);
    `latency`: seconds every chat request waits before its first byte."""
    ledger = tmp / f"ledger-{len(list(tmp.glob('ledger-*')))}.jsonl"
    ledger.touch()
    srv = start_fixture_server(
        "replay_server.py",
        tmp,
        "/v1/models",
        "--fault-rate",
        str(fault_rate),
        "--ledger",
        str(ledger),
        "--stall",
        str(stall),
        *(("--family", family) if family else ()),
        *(("--latency", str(latency)) if latency else ()),
    )
    return ReplayServer(f"{srv.root}/v1", ledger, srv)


@pytest.fixture
def replay(tmp_path):
    srv = start_replay(tmp_path)
    yield srv
    srv.stop()


@pytest.fixture
def wedge_server(tmp_path):
    """The wedge test server's root URL; its state is set through POST /control."""
    srv = start_fixture_server("wedge_server.py", tmp_path, "/health")
    yield srv.root
    srv.stop()


@pytest.fixture
def fast_replay(tmp_path):
    """The replay server with a short stall, for tests that need not wait out a timeout."""
    srv = start_replay(tmp_path, stall=1.0)
    yield srv
    srv.stop()


@pytest.fixture
def clean_replay(tmp_path):
    srv = start_replay(tmp_path, fault_rate=0)
    yield srv
    srv.stop()


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dsv4bench", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def only_run_dir(out: Path) -> Path:
    dirs = [d for d in out.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]
