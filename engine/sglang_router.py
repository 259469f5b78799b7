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

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .launcher import EngineStartError, free_ports, lists_healthy, spawn_child, stop_child

HOST = "127.0.0.1"
MISSING = "SGLang's router is not installed: pip install 'dsv4bench[sglang]'"


@dataclass
class SGLangRouter:
    """A running SGLang router child process."""

    proc: subprocess.Popen
    port: int
    prometheus_port: int
    log_path: Path | None
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


def label() -> str:
    """ "SGLang" and the installed router's version, as tables name it."""
    try:
        return f"SGLang {importlib.metadata.version('sglang-router')}"
    except importlib.metadata.PackageNotFoundError:
        return "SGLang (not installed)"


def router_command(
    port: int,
    prometheus_port: int,
    workers: Sequence[str] = (),
    prefill: Sequence[tuple[str, int | None]] = (),
    decode: Sequence[str] = (),
    log_level: str = "info",
) -> list[str]:
    """The launch command: regular mode over `workers`, or PD mode over `prefill` (URL and
    bootstrap port) and `decode` servers."""
    cmd = [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        HOST,
        "--port",
        str(port),
        "--prometheus-host",
        HOST,
        "--prometheus-port",
        str(prometheus_port),
        "--log-level",
        {"warning": "warn"}.get(log_level, log_level),
    ]
    if prefill or decode:
        cmd.append("--pd-disaggregation")
        for url, bootstrap_port in prefill:
            cmd += ["--prefill", url, *([str(bootstrap_port)] if bootstrap_port is not None else [])]
        for url in decode:
            cmd += ["--decode", url]
    else:
        cmd += ["--worker-urls", *workers]
    return cmd


def start_sglang_router(
    workers: Sequence[str] = (),
    prefill: Sequence[tuple[str, int | None]] = (),
    decode: Sequence[str] = (),
    log_dir: Path | None = None,
    startup_timeout: float = 60.0,
    port: int | None = None,
    prometheus_port: int | None = None,
    log_to_stdout: bool = False,
    log_level: str = "info",
) -> SGLangRouter:
    """Start the router in front of these servers (roots, no /v1) on `port` (else a free one)
    and wait until it lists them all healthy. Its output goes to `log_dir`/sglang-router.log, or
    to ours with `log_to_stdout`. EngineStartError, in one line, when it is missing or does not
    come up."""
    if not installed():
        raise EngineStartError(MISSING)
    expected = len(workers) + len(prefill) + len(decode)
    if expected == 0:
        raise EngineStartError("the SGLang router needs at least one server to route to")
    free = iter(free_ports(2, HOST))
    port = next(free) if port is None else port
    prometheus_port = next(free) if prometheus_port is None else prometheus_port
    log = None
    log_path = None
    if not log_to_stdout:
        log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / "sglang-router.log"
        log = open(log_path, "w", encoding="utf-8")
    proc = spawn_child(router_command(port, prometheus_port, workers, prefill, decode, log_level), log)
    router = SGLangRouter(proc, port, prometheus_port, log_path, log)
    where = f" (log: {log_path})" if log_path is not None else ""
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            router.stop()
            raise EngineStartError(f"SGLang's router exited with code {proc.returncode}{where}")
        if lists_healthy(router.root, expected):
            return router
        time.sleep(0.25)
    router.stop()
    raise EngineStartError(
        f"SGLang's router did not list its {expected} server(s) healthy within {startup_timeout:.0f} s{where}"
    )
