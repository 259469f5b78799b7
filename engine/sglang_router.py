"""SGLang's own router (`sglang-router` on PyPI, the model gateway: a Rust binary) in front of
the bundled engine's servers, as our users deploy it.

`start_sglang_router` runs `python -m sglang_router.launch_router` on loopback, its Prometheus
port included (the router binds that one to 0.0.0.0 unless told otherwise), and waits until its
`/workers` lists every worker healthy. The router registers a worker by reading its
`/server_info` and `/model_info` and loads the tokenizer from `model_path`, which the bundled
servers give as a local folder (engine/server_facts.py), so nothing reaches for a model hub.

The router is an optional extra: `pip install 'dsv4bench[sglang]'`, pinned to the version the
tests run. Without it, starting one is a one-line `EngineStartError`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .launcher import EngineProcess, EngineStartError, die_with_parent, free_ports, start_engine, start_engines, stop_child

HOST = "127.0.0.1"
MISSING = "SGLang's router is not installed: pip install 'dsv4bench[sglang]'"


@dataclass
class SGLangRouter:
    """A running SGLang router child process."""

    proc: subprocess.Popen
    port: int
    prometheus_port: int
    log_path: Path
    _log: object = field(repr=False, default=None)

    @property
    def root(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    @property
    def metrics_url(self) -> str:
        """The router's own `smg_*` metrics, on its Prometheus port."""
        return f"http://{HOST}:{self.prometheus_port}/metrics"

    def stop(self, timeout: float = 10.0) -> None:
        stop_child(self.proc, self._log, timeout)


def installed() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


def router_command(port: int, prometheus_port: int, workers: Sequence[str] = (),
                   prefill: Sequence[tuple[str, int | None]] = (), decode: Sequence[str] = ()) -> list[str]:
    """The launch command: regular mode over `workers`, or PD mode over `prefill` (URL and
    bootstrap port) and `decode` servers."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", HOST, "--port", str(port),
           "--prometheus-host", HOST, "--prometheus-port", str(prometheus_port), "--log-level", "info"]
    if prefill or decode:
        cmd.append("--pd-disaggregation")
        for url, bootstrap_port in prefill:
            cmd += ["--prefill", url, *([str(bootstrap_port)] if bootstrap_port is not None else [])]
        for url in decode:
            cmd += ["--decode", url]
    else:
        cmd += ["--worker-urls", *workers]
    return cmd


def start_sglang_router(workers: Sequence[str] = (), prefill: Sequence[tuple[str, int | None]] = (),
                        decode: Sequence[str] = (), log_dir: Path | None = None,
                        startup_timeout: float = 60.0) -> SGLangRouter:
    """Start the router in front of these servers (roots, no /v1) and wait until it lists them
    all healthy. EngineStartError, in one line, when it is missing or does not come up."""
    if not installed():
        raise EngineStartError(MISSING)
    expected = len(workers) + len(prefill) + len(decode)
    if expected == 0:
        raise EngineStartError("the SGLang router needs at least one server to route to")
    port, prometheus_port = free_ports(2, HOST)
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "sglang-router.log"
    log = open(log_path, "w", encoding="utf-8")
    proc = subprocess.Popen(router_command(port, prometheus_port, workers, prefill, decode),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
    router = SGLangRouter(proc, port, prometheus_port, log_path, log)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            router.stop()
            raise EngineStartError(f"SGLang's router exited with code {proc.returncode} (log: {log_path})")
        try:
            listed = httpx.get(f"{router.root}/workers", timeout=5.0).json().get("workers", [])
            if len(listed) == expected and all(w.get("is_healthy") for w in listed):
                return router
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        time.sleep(0.25)
    router.stop()
    raise EngineStartError(f"SGLang's router did not list its {expected} server(s) healthy within "
                           f"{startup_timeout:.0f} s (log: {log_path})")


@dataclass
class RoutedEngine:
    """Bundled engine processes behind SGLang's router: the run talks to the router and scrapes
    the router and every process."""

    engines: list[EngineProcess]
    router: SGLangRouter

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def metrics_url(self) -> str:
        """The first engine process's own /metrics (the router's: `router.metrics_url`)."""
        return self.engines[0].metrics_url

    @property
    def metrics_urls(self) -> list[str]:
        return [self.router.metrics_url, *(url for e in self.engines for url in e.metrics_urls)]

    @property
    def log_path(self) -> Path:
        return self.engines[0].log_path

    def stop(self) -> None:
        self.router.stop()
        for engine in self.engines:
            engine.stop()


def start_routed_engine(engine_args: list[str], startup_timeout: float = 60.0) -> RoutedEngine:
    """The bundled engine behind SGLang's router: with `--pd` in `engine_args`, a prefill and a
    decode process (`engine serve --pd-role`, KV between them over loopback) behind the router
    in PD mode; else one unified engine behind it in regular mode. Whatever started is stopped
    again when a part fails."""
    if not installed():  # before the engine's minute of loading
        raise EngineStartError(MISSING)
    args = [a for a in engine_args if a != "--pd"]
    started: list[EngineProcess] = []
    try:
        if len(args) == len(engine_args):
            started.append(start_engine(args))
            router = start_sglang_router(workers=[started[0].roots[0]], log_dir=started[0].log_path.parent,
                                         startup_timeout=startup_timeout)
        else:
            (bootstrap_port,) = free_ports(1, HOST)
            halves = [[*args, "--pd-role", "prefill", "--bootstrap-port", str(bootstrap_port)], [*args, "--pd-role", "decode"]]
            started += start_engines(halves, log_dir=Path(tempfile.mkdtemp(prefix="dsv4bench-engine-")))
            prefill, decode = started
            router = start_sglang_router(prefill=[(prefill.roots[0], bootstrap_port)], decode=[decode.roots[0]],
                                         log_dir=prefill.log_path.parent, startup_timeout=startup_timeout)
    except BaseException:
        for engine in started:
            engine.stop()
        raise
    return RoutedEngine(started, router)
