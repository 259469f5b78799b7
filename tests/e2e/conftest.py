"""A real replay server on loopback, started as its own process for the end-to-end tests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ReplayServer:
    url: str
    ledger: Path
    proc: subprocess.Popen
    log: object

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()

    def planted(self) -> dict[tuple[str, int], frozenset[str]]:
        """(session, turn) -> verdict codes the harness must report, from the server's ledger."""
        out = {}
        for line in self.ledger.read_text().splitlines():
            d = json.loads(line)
            out[(d["session"], d["turn"])] = frozenset(d["codes"])
        return out


def start_replay(tmp: Path, fault_rate: int = 12, stall: float = 15.0) -> ReplayServer:
    port = free_port()
    ledger = tmp / f"ledger-{port}.jsonl"
    ledger.touch()
    log = open(tmp / f"replay-{port}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "fixtures" / "replay_server.py"), "--port", str(port),
         "--fault-rate", str(fault_rate), "--ledger", str(ledger), "--stall", str(stall)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                return ReplayServer(url, ledger, proc, log)
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    log.close()
    raise RuntimeError(f"replay server did not start: {(tmp / f'replay-{port}.log').read_text()[-2000:]}")


@pytest.fixture
def replay(tmp_path):
    srv = start_replay(tmp_path)
    yield srv
    srv.stop()


@pytest.fixture
def clean_replay(tmp_path):
    srv = start_replay(tmp_path, fault_rate=0)
    yield srv
    srv.stop()


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4bench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def only_run_dir(out: Path) -> Path:
    dirs = [d for d in out.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]
