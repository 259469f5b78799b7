"""Bind or fail: `engine serve` binds its sockets before it builds anything, logs "serving on"
only once bound, and a busy port, a host that does not resolve or a port out of range is one
`ServeError` (the CLI prints it as one line, exit 2)."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bench.engine.config import DeploymentConfig, EngineConfig
from dsv4bench.engine.deployment import serve_deployment
from dsv4bench.engine.serve import EngineSetupError, ServeError, listen, serve
from dsv4bench.engine.server import ServerConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_listen_binds_or_says_why_in_one_line(busy_port):
    sock = listen("127.0.0.1", _free())
    sock.close()
    for host, port, needle in (
        ("127.0.0.1", busy_port, "Address already in use"),
        ("no-such-host.invalid", 8000, "does not resolve"),
        ("127.0.0.1", 70000, "1..65535"),
        ("127.0.0.1", 0, "1..65535"),
        ("256.1.1.1", 8000, "does not resolve"),
    ):
        with pytest.raises(ServeError) as e:
            listen(host, port)
        assert needle in str(e.value) and "\n" not in str(e.value)
    assert issubclass(ServeError, EngineSetupError)  # what the CLI already prints as one line


def test_serve_fails_before_building_or_logging_anything(busy_port, caplog):
    with caplog.at_level(logging.WARNING, logger="dsv4bench.engine"):
        with pytest.raises(ServeError):
            serve(EngineConfig(), ServerConfig(port=busy_port))
        with pytest.raises(ServeError):
            # a deployment checks every part's port before it starts any process
            serve_deployment(
                EngineConfig(pd=True),
                ServerConfig(port=_free()),
                DeploymentConfig(prefill_port=busy_port, decode_port=_free(), bootstrap_port=_free()),
                [],
            )
    assert "serving" not in caplog.text


def test_the_cli_says_it_in_one_line(busy_port):
    r = subprocess.run(
        [sys.executable, "-m", "dsv4bench", "engine", "serve", "--port", str(busy_port)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "Address already in use" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "serving" not in r.stderr + r.stdout


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_launcher_chooses_ports_again_when_one_was_taken(monkeypatch):
    from dsv4bench.engine import launcher

    class Spawned:
        def stop(self) -> None:
            pass

    def taken_until(n: int):
        tries: list[object] = []

        def wait_ready(ep: object, timeout: float) -> None:
            tries.append(ep)
            if len(tries) < n:
                raise launcher._PortTaken("the bundled engine exited with code 2: error: ... Address already in use")

        return wait_ready, tries

    monkeypatch.setattr(launcher, "_spawn", lambda *args: Spawned())
    wait_ready, tries = taken_until(launcher.PORT_ATTEMPTS)
    monkeypatch.setattr(launcher, "_wait_ready", wait_ready)
    assert isinstance(launcher.start_engine(["--pd"]), Spawned) and len(tries) == launcher.PORT_ATTEMPTS
    wait_ready, tries = taken_until(launcher.PORT_ATTEMPTS + 1)
    monkeypatch.setattr(launcher, "_wait_ready", wait_ready)
    with pytest.raises(launcher.EngineStartError, match="Address already in use"):
        launcher.start_engine([])
    assert len(tries) == launcher.PORT_ATTEMPTS
