"""The composition root of `dsv4bench engine serve`: tokenizer, model, pools, scheduler, loop,
front end and HTTP server, built from one EngineConfig and one ServerConfig.

Bind or fail: the listening sockets are bound before the engine is built, "serving on" is
logged only once they are, and whatever stops the server from listening (a busy port, a host
that does not resolve, a port out of range) is one `ServeError` with a one-line message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import uvicorn

from .config import EngineConfig
from .cpu_threads import on_passing_thread
from .unified_engine import AsyncEngine, UnifiedEngine
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


class ServeError(EngineSetupError):
    """The server cannot listen where it was asked to (busy port, bad host, port out of
    range); one line for the user."""


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket on `host`:`port`, so that a server fails here, before the
    engine is built and while the message can still name the address; ServeError if not."""
    if type(port) is not int or not 1 <= port <= 65535:
        raise ServeError(f"cannot serve on port {port}: a port is 1..65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError) as e:
        raise ServeError(
            f"cannot serve on {host}:{port}: host {host!r} does not resolve ({getattr(e, 'strerror', None) or e})"
        ) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None
    return sock


class _SharedLoopServer(uvicorn.Server):
    """One of several uvicorn servers in one asyncio loop: signals are handled once, for all."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_together(
    apps: list[tuple[Any, socket.socket]], log_level: str = "warning", stop: asyncio.Event | None = None
) -> None:
    """Serve each app on its bound socket in this asyncio loop until SIGINT or SIGTERM, or
    until `stop` is set when given (then signals are left alone)."""
    servers = [
        _SharedLoopServer(uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5))
        for app, _ in apps
    ]

    def stop_all() -> None:
        for server in servers:
            server.should_exit = True

    async def run(server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            stop_all()  # one down, all down

    async def stop_when_set(event: asyncio.Event) -> None:
        await event.wait()
        stop_all()

    if stop is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop_all)
    watcher = asyncio.create_task(stop_when_set(stop)) if stop is not None else None
    try:
        await asyncio.gather(*(run(server, sock) for server, (_, sock) in zip(servers, apps)))
    finally:
        if watcher is not None:
            watcher.cancel()


@dataclass
class Engine:
    """Everything a running engine is made of, for serving and for tests."""

    cfg: EngineConfig
    engine: AsyncEngine
    loop: UnifiedEngine
    frontend: Frontend

    def stop(self) -> None:
        self.loop.stop()


def load_model(
    cfg: EngineConfig, weights: Path | None = None, random_weights: bool = False, init_seed: int = 0
) -> tuple[DSV4Tokenizer, DSV4Mini]:
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


def load_runner(
    cfg: EngineConfig, weights: Path | None = None, random_weights: bool = False, init_seed: int = 0
) -> tuple[DSV4Tokenizer, ModelRunner]:
    """load_model, and the model runner (with its pools) over the model."""
    tok, model = load_model(cfg, weights, random_weights, init_seed)
    return tok, ModelRunner(cfg, model)


def build_engine(
    cfg: EngineConfig,
    model_name: str = "dsv4-mini",
    weights: Path | None = None,
    random_weights: bool = False,
    init_seed: int = 0,
) -> Engine:
    """Build and start the engine loop with the shipped weights (or `weights`, or a seeded
    random initialisation when `random_weights`)."""

    def build() -> tuple[DSV4Tokenizer, ModelRunner, PageAllocator, RadixCache]:
        tok, runner = load_runner(cfg, weights, random_weights, init_seed)
        allocator = PageAllocator(cfg.num_pages)
        # NOTE: the host tier installs itself as the pools' per-layer read gate.
        cache = (
            HiRadixCache(cfg.page_size, allocator, HostTier(runner.pools, cfg))
            if cfg.hicache
            else RadixCache(cfg.page_size, allocator)
        )
        return tok, runner, allocator, cache

    tok, runner, allocator, cache = on_passing_thread(build)  # the loop's CPU threads alone (cpu_threads.py)
    scheduler = Scheduler(cfg, allocator, cache, eos_token_id=tok.eos_token_id)
    loop = UnifiedEngine(cfg, scheduler, runner)
    loop.start()
    engine = AsyncEngine(cfg, loop, eos_token_id=tok.eos_token_id)
    frontend = Frontend(
        tok,
        model_name=model_name,
        max_context=min(cfg.model.max_context, scheduler.max_seq_len),
        tool_call_parser=cfg.tool_call_parser,
    )
    return Engine(cfg, engine, loop, frontend)


def serve(
    cfg: EngineConfig,
    server_cfg: ServerConfig,
    weights: Path | None = None,
    random_weights: bool = False,
    init_seed: int = 0,
    log_level: str = "warning",
) -> None:
    """Run the server in the foreground until interrupted. ServeError when it cannot listen,
    EngineSetupError when the engine cannot be built."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = listen(server_cfg.host, server_cfg.port)
    try:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        built = build_engine(cfg, server_cfg.model_name, weights, random_weights, init_seed)
    except BaseException:
        sock.close()
        raise
    app = build_app(built.engine, built.frontend, server_cfg)
    log.warning(
        "DSV4-mini serving on http://%s:%d (device %s, %d pages of %d tokens)",
        server_cfg.host,
        server_cfg.port,
        cfg.device,
        cfg.num_pages,
        cfg.page_size,
    )
    try:
        asyncio.run(serve_together([(app, sock)], log_level))
    finally:
        built.stop()
