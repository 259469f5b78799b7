"""The composition root of `dsv4bench engine serve --pd-role prefill|decode`: one half of a PD
deployment in its own process, as SGLang serves `--disaggregation-mode prefill|decode`.

A prefill half: its engine and pools, the bootstrap worker and its TCP face on
`--bootstrap-port` (SGLang's default 8998), the transfer worker sending KV to decode processes.
A decode half: its engine and pools, and the client that reaches each request's room. Both
serve the OpenAI endpoints for a PD router's requests (worker.py) and SGLang's informational
ones; any PD router speaking SGLang's protocol fronts them: ours (http_router.py) or SGLang's
(`python -m sglang_router.launch_router --pd-disaggregation --prefill URL BOOTSTRAP_PORT
--decode URL`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from starlette.applications import Starlette

from ..config import DeploymentConfig, EngineConfig
from ..cpu_threads import on_passing_thread
from ..faults import Fault
from ..frontend import Frontend
from ..serve import listen, load_runner, serve_together
from ..server import ServerConfig, build_app
from .bootstrap import BootstrapWorker
from .bootstrap_client import BootstrapClient
from .bootstrap_server import BootstrapServer
from .decode import DecodeEngine
from .prefill import PrefillEngine
from .transfer import TransferWorker
from .worker import DecodeServing, PrefillServing

log = logging.getLogger("dsv4bench.engine")

ROLES = ("prefill", "decode")


@dataclass
class Half:
    """One half: its engine, its parts (started and stopped in order, the engine among them),
    its app, and on the prefill side the bootstrap worker and its bound port."""

    role: str
    app: Starlette
    engine: PrefillEngine | DecodeEngine
    parts: list = field(default_factory=list)
    bootstrap: BootstrapWorker | None = None
    transfers: TransferWorker | None = None
    bootstrap_port: int | None = None

    def start(self) -> None:
        for part in self.parts:
            part.start()

    def stop(self) -> None:
        for part in reversed(self.parts):
            part.stop()


def build_half(
    role: str,
    cfg: EngineConfig,
    server_cfg: ServerConfig,
    bootstrap_host: str = "127.0.0.1",
    bootstrap_port: int = DeploymentConfig.bootstrap_port,
    link_gbps: float = 0.0,
    weights: Path | None = None,
    random_weights: bool = False,
    init_seed: int = 0,
) -> Half:
    """Build (not start) the `role` half; the prefill's bootstrap port is bound here."""
    if role not in ROLES:
        raise ValueError(f"a PD half is prefill or decode, not {role!r}")
    tok, runner = on_passing_thread(lambda: load_runner(cfg, weights, random_weights, init_seed))
    server_cfg = dataclasses.replace(server_cfg, engine_type=role)
    worker = server = transfers = None
    if role == "prefill":
        worker = BootstrapWorker(stall_on_unexpected_abort=Fault.BOOTSTRAP_STALL in cfg.faults)
        server = BootstrapServer(worker, bootstrap_host, bootstrap_port)
        transfers = TransferWorker(runner.pools, None, link_gbps * 1e9)
        engine: PrefillEngine | DecodeEngine = PrefillEngine(cfg, runner, worker, transfers, tok.eos_token_id)
        ctx = min(cfg.model.max_context, engine.scheduler.max_seq_len)
        needs: tuple[Callable[[], bool], ...] = (worker.alive, transfers.alive, server.alive)
        serving: PrefillServing | DecodeServing = PrefillServing(cfg, engine, server, needs, tok.eos_token_id, ctx)
        parts: list = [worker, server, transfers, engine]
    else:
        client = BootstrapClient(runner.pools)
        engine = DecodeEngine(cfg, runner, client, tok.eos_token_id)  # type: ignore[arg-type]  # the worker's calls, over the network
        ctx = min(cfg.model.max_context, engine.scheduler.max_seq_len)
        serving = DecodeServing(cfg, engine, client, (), tok.eos_token_id, ctx)
        parts = [client, engine]
    app = build_app(
        serving,
        Frontend(tok, model_name=server_cfg.model_name, max_context=ctx, tool_call_parser=cfg.tool_call_parser),
        server_cfg,
    )
    return Half(role, app, engine, parts, worker, transfers, server.port if server is not None else None)


def serve_half(
    role: str,
    cfg: EngineConfig,
    server_cfg: ServerConfig,
    bootstrap_port: int = DeploymentConfig.bootstrap_port,
    link_gbps: float = 0.0,
    weights: Path | None = None,
    random_weights: bool = False,
    init_seed: int = 0,
    log_level: str = "warning",
) -> None:
    """Serve one half in the foreground until interrupted. ServeError when it cannot listen,
    EngineSetupError when it cannot be built."""
    # NOTE: the role in every line: a deployment's processes share one terminal (deployment.py).
    logging.basicConfig(level=log_level.upper(), format=f"%(asctime)s %(levelname)s %(name)s [{role}]: %(message)s")
    sock = listen(server_cfg.host, server_cfg.port)
    try:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        half = build_half(
            role, cfg, server_cfg, server_cfg.host, bootstrap_port, link_gbps, weights, random_weights, init_seed
        )
    except BaseException:
        sock.close()
        raise
    half.start()
    where = f", bootstrap port {half.bootstrap_port}" if half.bootstrap_port is not None else ""
    log.warning(
        "DSV4-mini PD %s half serving on http://%s:%d%s (device %s, %d pages of %d tokens)",
        role,
        server_cfg.host,
        server_cfg.port,
        where,
        cfg.device,
        cfg.num_pages,
        cfg.page_size,
    )
    try:
        asyncio.run(serve_together([(half.app, sock)], log_level))
    finally:
        half.stop()
