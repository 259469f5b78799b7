"""The composition root of a deployment of several processes, laid out as SGLang's are:
`engine serve --pd` (a prefill and a decode half, each its own process, the KV between them
over the prefill's bootstrap port, behind a router on --port) and `engine serve --router sglang`
(SGLang's router in front: of the two halves with --pd, else of one unified engine process).

This process supervises them as an orchestrator would. It checks that every port is free
before anything starts (bind or fail, engine/serve.py), starts the workers side by side (they
load their weights at once), waits for their /health, then runs the router: ours
(pd/http_router.py) in this process, or SGLang's as a child. When any part dies the deployment
stops, naming that part (one down, all down); SIGINT or SIGTERM stops every part.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from .config import DeploymentConfig, EngineConfig
from .launcher import answers_healthy, spawn_child, stop_child
from .serve import EngineSetupError, ServeError, listen, serve_together
from .server import ServerConfig

log = logging.getLogger("dsv4bench.engine")


@dataclass
class Part:
    """One worker process of the deployment."""

    name: str  # "prefill", "decode" or "engine"
    port: int
    args: list[str]  # its `engine serve` flags
    proc: subprocess.Popen | None = None

    def root(self, host: str) -> str:
        return f"http://{host}:{self.port}"


def parts_of(cfg: EngineConfig, dcfg: DeploymentConfig, host: str, engine_args: Sequence[str]) -> list[Part]:
    """The worker processes: the two halves with PD, else one unified engine."""
    base = [*engine_args, "--host", host]
    if not cfg.pd:
        return [Part("engine", dcfg.worker_port, [*base, "--port", str(dcfg.worker_port)])]
    link = ["--pd-link-gbps", repr(dcfg.link_gbps)]
    return [
        Part(
            "prefill",
            dcfg.prefill_port,
            [
                *base,
                "--port",
                str(dcfg.prefill_port),
                "--pd-role",
                "prefill",
                "--bootstrap-port",
                str(dcfg.bootstrap_port),
                *link,
            ],
        ),
        Part("decode", dcfg.decode_port, [*base, "--port", str(dcfg.decode_port), "--pd-role", "decode", *link]),
    ]


def ports_of(cfg: EngineConfig, dcfg: DeploymentConfig, router_port: int) -> dict[str, int]:
    """Every port the deployment listens on, by what listens there."""
    ports = {"router": router_port}
    if dcfg.router == "sglang":
        ports["router metrics"] = dcfg.router_metrics_port
    if cfg.pd:
        ports.update({"prefill": dcfg.prefill_port, "decode": dcfg.decode_port, "bootstrap": dcfg.bootstrap_port})
    else:
        ports["engine"] = dcfg.worker_port
    return ports


def check_ports(host: str, ports: dict[str, int]) -> None:
    """ServeError, in one line, when two parts share a port or one is not free."""
    seen: dict[int, str] = {}
    for what, port in ports.items():
        if port in seen:
            raise ServeError(f"the {seen[port]} and {what} ports must differ (both {port})")
        seen[port] = what
    for what, port in ports.items():
        sock = listen(host, port)  # ServeError naming the address when busy
        sock.close()


def serve_deployment(
    cfg: EngineConfig,
    server_cfg: ServerConfig,
    dcfg: DeploymentConfig,
    engine_args: Sequence[str],
    log_level: str = "warning",
) -> None:
    """Run the deployment in the foreground until interrupted or until a part dies (then
    EngineSetupError naming it). ServeError when a port is taken."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host = server_cfg.host
    check_ports(host, ports_of(cfg, dcfg, server_cfg.port))
    if dcfg.router == "sglang":
        from . import sglang_router

        if not sglang_router.installed():
            raise EngineSetupError(sglang_router.MISSING)
    # NOTE: our router's socket is bound now, before the workers load, so the port is ours.
    sock = listen(host, server_cfg.port) if dcfg.router == "bundled" else None
    parts = parts_of(cfg, dcfg, host, engine_args)
    stopping = _Stopping()
    try:
        for part in parts:
            part.proc = spawn_child([sys.executable, "-m", "dsv4bench", "engine", "serve", *part.args])
        _wait_healthy(parts, host, dcfg.startup_timeout_s, stopping)
        if dcfg.router == "bundled":
            assert sock is not None
            _serve_our_router(cfg, server_cfg, dcfg, parts, sock, stopping, log_level)
        else:
            _run_sglang_router(server_cfg, dcfg, parts, stopping, log_level)
    finally:
        if sock is not None:
            sock.close()
        for part in parts:
            if part.proc is not None:
                stop_child(part.proc, None)
    if stopping.died is not None:
        raise EngineSetupError(stopping.died)


class _Stopping:
    """SIGINT/SIGTERM, or a part that died, end the deployment."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.died: str | None = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.event.set())

    def watch(self, procs: dict[str, subprocess.Popen]) -> bool:
        """True when the deployment must stop (a signal came, or a part exited: then named)."""
        for name, proc in procs.items():
            if proc.poll() is not None and self.died is None and not self.event.is_set():
                self.died = f"the {name} exited with code {proc.returncode}; the deployment stopped"
                self.event.set()
        return self.event.is_set()


def _procs(parts: list[Part]) -> dict[str, subprocess.Popen]:
    return {f"{p.name} process": p.proc for p in parts if p.proc is not None}


def _wait_healthy(parts: list[Part], host: str, timeout_s: float, stopping: _Stopping) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(parts)
    while waiting:
        if stopping.watch(_procs(parts)):
            return
        if time.monotonic() > deadline:
            names = ", ".join(p.name for p in waiting)
            stopping.died = f"the {names} did not answer /health within {timeout_s:.0f} s"
            stopping.event.set()
            return
        waiting = [p for p in waiting if not answers_healthy(p.root(host))]
        stopping.event.wait(0.25)


def _context_length(root: str) -> int | None:
    try:
        value = httpx.get(f"{root}/server_info", timeout=5.0, trust_env=False).json().get("context_length")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return value if type(value) is int and value > 0 else None


def _serve_our_router(
    cfg: EngineConfig,
    server_cfg: ServerConfig,
    dcfg: DeploymentConfig,
    parts: list[Part],
    sock,
    stopping: _Stopping,
    log_level: str,
) -> None:
    from .pd.http_router import Halves, build_router_app
    from .tokenizer import load_tokenizer

    if stopping.event.is_set():
        return
    prefill, decode = (p.root(server_cfg.host) for p in parts)
    # The router admits what both halves can hold: the context they report (as SGLang's router
    # learns it from its workers).
    contexts = [c for c in (_context_length(prefill), _context_length(decode)) if c is not None]
    max_context = min(contexts) if contexts else cfg.model.max_context
    app = build_router_app(
        Halves(prefill, decode, dcfg.bootstrap_port),
        cfg,
        load_tokenizer(),
        max_context,
        dataclasses.replace(server_cfg, engine_type="router"),
        dcfg.health_timeout_s,
    )
    log.warning(
        "DSV4-mini PD serving: router http://%s:%d, prefill :%d (bootstrap :%d), decode :%d, each its own process",
        server_cfg.host,
        server_cfg.port,
        dcfg.prefill_port,
        dcfg.bootstrap_port,
        dcfg.decode_port,
    )

    async def run() -> None:
        stop = asyncio.Event()

        async def watch() -> None:
            while not stopping.watch(_procs(parts)):
                await asyncio.sleep(0.25)
            stop.set()

        watcher = asyncio.create_task(watch())
        try:
            await serve_together([(app, sock)], log_level, stop=stop)
        finally:
            stopping.event.set()
            await watcher

    asyncio.run(run())


def _run_sglang_router(
    server_cfg: ServerConfig, dcfg: DeploymentConfig, parts: list[Part], stopping: _Stopping, log_level: str
) -> None:
    from . import sglang_router

    if stopping.event.is_set():
        return
    host = server_cfg.host
    if len(parts) == 2:
        kinds = {"prefill": [(parts[0].root(host), dcfg.bootstrap_port)], "decode": [parts[1].root(host)]}
    else:
        kinds = {"workers": [parts[0].root(host)]}
    router = sglang_router.start_sglang_router(
        **kinds, port=server_cfg.port, prometheus_port=dcfg.router_metrics_port, log_to_stdout=True, log_level=log_level
    )
    try:
        log.warning(
            "DSV4-mini behind SGLang's router: http://%s:%d (its metrics :%d), %s",
            host,
            server_cfg.port,
            dcfg.router_metrics_port,
            ", ".join(f"{p.name} :{p.port}" for p in parts),
        )
        while not stopping.watch({**_procs(parts), "SGLang router": router.proc}):
            stopping.event.wait(0.25)
    finally:
        router.stop()
