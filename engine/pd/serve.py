"""The composition root of `dsv4bench engine serve --pd`: one model's weights, two engines with
their own pools (prefill and decode), the bootstrap and transfer workers between them, the
router, and three HTTP servers in one asyncio loop (router, prefill, decode), each on its own
port like an SGLang PD deployment."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from starlette.applications import Starlette

from ..config import EngineConfig
from ..faults import Fault
from ..frontend import Frontend
from ..model_runner import ModelRunner
from ..serve import ServeError, listen, load_model, serve_together
from ..server import ServerConfig, build_app
from .bootstrap import BootstrapWorker
from .decode import DecodeEngine
from .http import build_worker_app
from .prefill import PrefillEngine
from .router import PDRouter
from .transfer import TransferWorker

log = logging.getLogger("dsv4bench.engine")

ROUTER_PORT = 8000  # the router's port when --port is not given (SGLang's PD examples use it)


@dataclass(frozen=True)
class PDConfig:
    """Where the prefill and decode servers listen (the router: ServerConfig.port), the KV
    link between their pools, and the router's /health deadline."""

    prefill_port: int = 30000
    decode_port: int = 30002
    # NOTE: KV transfer bandwidth (0 = memory speed), scaled to this engine: a prompt's KV
    # takes a fraction of a decode step to move, as over RDMA between real PD servers.
    link_gbps: float = 0.1
    # NOTE: under the 5 s a probing client (the harness) waits, so it hears the 503.
    health_timeout_s: float = 4.0

    def __post_init__(self) -> None:
        for name, port in (("prefill port", self.prefill_port), ("decode port", self.decode_port)):
            if not 1 <= port <= 65535:
                raise ValueError(f"{name} must be in 1..65535")
        if self.prefill_port == self.decode_port:
            raise ValueError("the prefill and decode ports must differ")
        if self.link_gbps < 0:
            raise ValueError("the link bandwidth must be >= 0")
        if self.health_timeout_s <= 0:
            raise ValueError("the health timeout must be > 0")


@dataclass
class PDEngine:
    """Everything a running PD engine is made of, for serving and for tests."""

    cfg: EngineConfig
    pd: PDConfig
    bootstrap: BootstrapWorker
    transfers: TransferWorker
    prefill: PrefillEngine
    decode: DecodeEngine
    router: PDRouter
    frontend: Frontend

    def start(self) -> None:
        for part in (self.bootstrap, self.transfers, self.prefill, self.decode):
            part.start()

    def stop(self) -> None:
        for part in (self.prefill, self.decode, self.transfers, self.bootstrap):
            part.stop()

    def apps(self, server_cfg: ServerConfig) -> dict[str, Starlette]:
        """The router, prefill and decode apps (`server_cfg` is the router's; its API key
        guards all three)."""
        lies = Fault.HEALTH_LIES in self.cfg.faults
        name = server_cfg.model_name
        tok, ctx = self.frontend.tokenizer, self.router.max_context
        return {
            "router": build_app(self.router, self.frontend,
                                replace(server_cfg, engine_type="router",
                                        health_generate_timeout_s=self.pd.health_timeout_s)),
            "prefill": build_worker_app(self.prefill, "prefill", name, tok, ctx, (self.bootstrap.alive,
                                        self.transfers.alive), lies, replace(server_cfg, engine_type="prefill")),
            "decode": build_worker_app(self.decode, "decode", name, tok, ctx, (self.transfers.alive,), lies,
                                       replace(server_cfg, engine_type="decode")),
        }


def build_pd_engine(cfg: EngineConfig, pd_cfg: PDConfig = PDConfig(), model_name: str = "dsv4-mini",
                    weights: Path | None = None, random_weights: bool = False, init_seed: int = 0,
                    start: bool = True) -> PDEngine:
    """Build the PD engine (and start its threads unless `start` is False: tests then drive
    each part by hand)."""
    if not cfg.pd:
        raise ValueError("the PD engine serves an EngineConfig with pd=True")
    tok, model = load_model(cfg, weights, random_weights, init_seed)
    # NOTE: one model, two runners: each server has its own pools, the weights are shared.
    prefill_runner, decode_runner = ModelRunner(cfg, model), ModelRunner(cfg, model)
    bootstrap = BootstrapWorker(stall_on_unexpected_abort=Fault.BOOTSTRAP_STALL in cfg.faults)
    transfers = TransferWorker(prefill_runner.pools, decode_runner.pools, pd_cfg.link_gbps * 1e9)
    prefill = PrefillEngine(cfg, prefill_runner, bootstrap, transfers, tok.eos_token_id)
    decode = DecodeEngine(cfg, decode_runner, bootstrap, tok.eos_token_id)
    router = PDRouter(cfg, prefill, decode, bootstrap, tok.eos_token_id)
    built = PDEngine(cfg, pd_cfg, bootstrap, transfers, prefill, decode, router,
                     Frontend(tok, model_name=model_name, max_context=router.max_context,
                              tool_call_parser=cfg.tool_call_parser))
    if start:
        built.start()
    return built


def serve_pd(cfg: EngineConfig, server_cfg: ServerConfig, pd_cfg: PDConfig, weights: Path | None = None,
             random_weights: bool = False, init_seed: int = 0, log_level: str = "warning") -> None:
    """Run the router, prefill and decode servers in the foreground until interrupted.
    ServeError when one of the three cannot listen (engine/serve.py, "bind or fail")."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ports = (server_cfg.port, pd_cfg.prefill_port, pd_cfg.decode_port)
    if len(set(ports)) < len(ports):
        raise ServeError("the router, prefill and decode ports must differ")
    sockets = []
    try:
        for port in ports:
            sockets.append(listen(server_cfg.host, port))
        torch.set_num_threads(max(1, torch.get_num_threads()))
        built = build_pd_engine(cfg, pd_cfg, server_cfg.model_name, weights, random_weights, init_seed)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    apps = built.apps(server_cfg)
    log.warning("DSV4-mini PD serving: router http://%s:%d, prefill :%d, decode :%d (device %s, %d pages of %d "
                "tokens per server)", server_cfg.host, *ports, cfg.device, cfg.num_pages, cfg.page_size)
    try:
        asyncio.run(serve_together([(apps[k], s) for k, s in zip(("router", "prefill", "decode"), sockets)],
                                   log_level))
    finally:
        built.stop()
