"""The composition root of `dsv4bench engine serve`: tokenizer, model, pools, scheduler, loop,
front end and HTTP server, built from one EngineConfig and one ServerConfig."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import EngineConfig
from .engine_loop import AsyncEngine, EngineLoop
from .frontend import Frontend
from .hiradix_cache import HiRadixCache
from .host_tier import HostTier
from .memory import PageAllocator
from .model.model import DSV4Mini
from .model_runner import ModelRunner
from .radix_cache import RadixCache
from .scheduler import Scheduler
from .server import ServerConfig, build_app
from .tokenizer import DSV4Tokenizer, load_tokenizer
from .weights import WeightsError, load_weights

log = logging.getLogger("dsv4bench.engine")


class EngineSetupError(Exception):
    """The engine cannot start with these settings; one line for the user."""


@dataclass
class Engine:
    """Everything a running engine is made of, for serving and for tests."""

    cfg: EngineConfig
    engine: AsyncEngine
    loop: EngineLoop
    frontend: Frontend

    def stop(self) -> None:
        self.loop.stop()


def load_model(cfg: EngineConfig, weights: Path | None = None, random_weights: bool = False,
               init_seed: int = 0) -> tuple[DSV4Tokenizer, DSV4Mini]:
    """The tokenizer and the model with the shipped weights (or `weights`, or a seeded random
    initialisation when `random_weights`); EngineSetupError when they cannot serve `cfg`."""
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineSetupError("--device cuda asked for, but torch sees no CUDA device")
    tok = load_tokenizer()
    if tok.vocab_size != cfg.model.vocab_size:
        raise EngineSetupError(f"tokenizer has {tok.vocab_size} tokens but the model expects {cfg.model.vocab_size}")
    torch.manual_seed(init_seed)
    if random_weights:
        return tok, DSV4Mini(cfg.model)
    try:
        return tok, load_weights(cfg.model, weights)
    except WeightsError as e:
        raise EngineSetupError(str(e)) from None


def build_engine(cfg: EngineConfig, model_name: str = "dsv4-mini", weights: Path | None = None,
                 random_weights: bool = False, init_seed: int = 0) -> Engine:
    """Build and start the engine loop with the shipped weights (or `weights`, or a seeded
    random initialisation when `random_weights`)."""
    tok, model = load_model(cfg, weights, random_weights, init_seed)
    runner = ModelRunner(cfg, model)
    allocator = PageAllocator(cfg.num_pages)
    # NOTE: the host tier installs itself as the pools' per-layer read gate.
    cache = (HiRadixCache(cfg.page_size, allocator, HostTier(runner.pools, cfg)) if cfg.hicache
             else RadixCache(cfg.page_size, allocator))
    scheduler = Scheduler(cfg, allocator, cache, eos_token_id=tok.eos_token_id)
    loop = EngineLoop(cfg, scheduler, runner)
    loop.start()
    engine = AsyncEngine(cfg, loop, eos_token_id=tok.eos_token_id)
    frontend = Frontend(tok, model_name=model_name, max_context=min(cfg.model.max_context, scheduler.max_seq_len))
    return Engine(cfg, engine, loop, frontend)


def serve(cfg: EngineConfig, server_cfg: ServerConfig, weights: Path | None = None, random_weights: bool = False,
          init_seed: int = 0, log_level: str = "warning") -> None:
    """Run the server in the foreground until interrupted."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    built = build_engine(cfg, server_cfg.model_name, weights, random_weights, init_seed)
    app = build_app(built.engine, built.frontend, server_cfg)
    log.warning("DSV4-mini serving on http://%s:%d (device %s, %d pages of %d tokens)", server_cfg.host,
                server_cfg.port, cfg.device, cfg.num_pages, cfg.page_size)
    try:
        uvicorn.run(app, host=server_cfg.host, port=server_cfg.port, log_level=log_level, access_log=False)
    finally:
        built.stop()
