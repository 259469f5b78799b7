"""Start the bundled engine as a child process on free loopback ports, and stop it again.

Used by `dsv4bench agents` when no --url is given: the run then targets the engine, wires its
/metrics into the run, and the engine goes away with the run (also on Ctrl-C). With `--pd` in
the engine's flags the child is a deployment (engine/deployment.py): a router on the API port
and a prefill and a decode process behind it, each scraped; with `--router sglang` the router
is SGLang's, whose own metrics are on a Prometheus port of their own.

The engine binds its ports before it loads anything and says so in one line when it cannot
(engine/serve.py); a port taken by someone else between choosing it here and binding it there
is chosen again, a few times.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


class EngineStartError(Exception):
    """The engine did not come up; the message says why in one line."""


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct free ports (all held open while choosing, so none is handed out twice)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]


@dataclass
class EngineProcess:
    """A running engine child process and where to reach it."""

    proc: subprocess.Popen
    host: str
    port: int  # the OpenAI API's: the engine's, or the router's in front of the workers
    log_path: Path
    _log: object = field(repr=False, default=None)
    server_ports: tuple[int, ...] = ()  # the workers behind the router: prefill and decode, or one unified
    router_metrics_port: int | None = None  # SGLang's router: its Prometheus port (its API port has no /metrics)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def roots(self) -> list[str]:
        """Every server's root: the engine's, or the router's and then each worker's."""
        return [f"http://{self.host}:{p}" for p in (self.port, *self.server_ports)]

    @property
    def metrics_url(self) -> str:
        """The /metrics of the server behind `url` (SGLang's router: its Prometheus port's)."""
        return self.metrics_urls[0]

    @property
    def metrics_urls(self) -> list[str]:
        """Every server's /metrics, for the run to scrape."""
        own = [f"{root}/metrics" for root in self.roots]
        if self.router_metrics_port is None:
            return own
        return [f"http://{self.host}:{self.router_metrics_port}/metrics", *own[1:]]

    def stop(self, timeout: float = 10.0) -> None:
        stop_child(self.proc, self._log, timeout)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn_child(cmd: list[str], log: Any = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a child that dies with the calling thread (and so with us, even when we are
    SIGKILLed); its output goes to `log`, or to ours; `env`: its environment (default: ours)."""
    # NOTE: PR_SET_PDEATHSIG fires when the spawning *thread* exits, so this must be called from
    # a thread that lives as long as the child should: the caller's main one, never a pool's.
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        stdin=subprocess.DEVNULL,
        env=env if env is not None else os.environ.copy(),
        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
    )


def stop_child(proc: subprocess.Popen, log: object, timeout: float = 10.0) -> None:
    """Stop a child process we started (SIGTERM, then SIGKILL after `timeout`) and close its log."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    if log is not None:
        log.close()  # type: ignore[attr-defined]  # `log` is the file Popen wrote to, typed as object


def die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it when the harness dies, even by
    SIGKILL, so a killed run never leaves an engine holding memory and a port."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PORT_ATTEMPTS = 3  # tries with fresh ports when a chosen one was taken before the engine bound it
_PORT_TAKEN = "Address already in use"


def start_engine(
    extra_args: list[str] | None = None, startup_timeout: float = 180.0, log_dir: Path | None = None
) -> EngineProcess:
    """Spawn `dsv4bench engine serve` on free ports and wait until every server's /health
    answers 200. EngineStartError, in one line, when it does not come up."""
    return start_engines([extra_args or []], startup_timeout, log_dir)[0]


def start_engines(
    args_each: list[list[str]], startup_timeout: float = 180.0, log_dir: Path | None = None
) -> list[EngineProcess]:
    """Several engine processes at once (they load their weights side by side): spawned from
    this thread, which they die with, then waited for. All or none come up."""
    attempt = 1
    while True:
        started = [_spawn(args, log_dir, i) for i, args in enumerate(args_each)]
        try:
            for ep in started:
                _wait_ready(ep, startup_timeout)
            return started
        except EngineStartError as e:
            for ep in started:
                ep.stop()
            if not isinstance(e, _PortTaken) or attempt == PORT_ATTEMPTS:
                raise
            attempt += 1


class _PortTaken(EngineStartError):
    """A port chosen as free was taken before the engine could bind it."""


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in an argument list (`--flag V` or `--flag=V`; the last one wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def _spawn(extra_args: list[str], log_dir: Path | None, index: int = 0) -> EngineProcess:
    host = "127.0.0.1"
    pd, sglang = "--pd" in extra_args, flag_value(extra_args, "--router") == "sglang"
    port, *ports = free_ports(1 + (3 if pd else 1 if sglang else 0) + (1 if sglang else 0), host)
    flags: list[str] = []
    if pd:
        flags += ["--prefill-port", str(ports[0]), "--decode-port", str(ports[1]), "--bootstrap-port", str(ports[2])]
        server_ports = ports[:2]
    elif sglang:
        flags += ["--worker-port", str(ports[0])]
        server_ports = ports[:1]
    else:
        server_ports = []
    router_metrics_port = ports[-1] if sglang else None
    if router_metrics_port is not None:
        flags += ["--router-metrics-port", str(router_metrics_port)]
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="dsv4bench-engine-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / ("engine.log" if index == 0 else f"engine-{index}.log")
    log = open(log_path, "w", encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "dsv4bench",
        "engine",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        *flags,
        *extra_args,
    ]
    return EngineProcess(spawn_child(cmd, log), host, port, log_path, log, tuple(server_ports), router_metrics_port)


def _wait_ready(ep: EngineProcess, startup_timeout: float) -> None:
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if ep.proc.poll() is not None:
            ep.stop()
            lines = ep.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            tail = lines[-1:] or ["(no output)"]
            message = f"the bundled engine exited with code {ep.proc.returncode}: {tail[0]} (log: {ep.log_path})"
            raise (_PortTaken if _PORT_TAKEN in tail[0] else EngineStartError)(message)
        if _ready(ep):
            return
        time.sleep(0.25)
    ep.stop()
    raise EngineStartError(
        f"the bundled engine did not answer /health within {startup_timeout:.0f} s (log: {ep.log_path})"
    )


def _ready(ep: EngineProcess) -> bool:
    """Every server answers /health 200, and a router lists every worker healthy (SGLang's
    answers its own /health before it has registered them)."""
    if not all(answers_healthy(root) for root in ep.roots):
        return False
    return not ep.server_ports or lists_healthy(ep.roots[0], len(ep.server_ports))


# NOTE: trust_env=False in both: these servers are ours on loopback, and a proxy named in the
# environment (HTTP_PROXY without a NO_PROXY for 127.0.0.1) must not stand between.
def answers_healthy(root: str) -> bool:
    """The server at `root` answers /health 200."""
    try:
        return httpx.get(f"{root}/health", timeout=5.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def lists_healthy(router_root: str, expected: int) -> bool:
    """The router at `router_root` lists `expected` workers, all healthy (its `/workers`, in the
    shape SGLang's router and ours answer)."""
    try:
        listed = httpx.get(f"{router_root}/workers", timeout=5.0, trust_env=False).json().get("workers", [])
        return len(listed) == expected and all(w.get("is_healthy") for w in listed)
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
