"""Shared pieces of the PD tests: a tiny model, the in-process PD rig driven by hand (no
threads, every step chosen by the test; in_process.py), the halves served as a deployment
serves them (`ServedPD`: two HTTP servers joined by the loopback bootstrap port, our PD
router in front), and the cleanliness check every abort test ends with."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from dsv4bench.engine.config import DeploymentConfig, EngineConfig, ModelConfig
from dsv4bench.engine.launcher import free_port
from dsv4bench.engine.pd.bootstrap import BootstrapWorker
from dsv4bench.engine.pd.decode import DecodeEngine
from dsv4bench.engine.pd.halves import build_half
from dsv4bench.engine.pd.http_router import Halves, build_router_app
from dsv4bench.engine.pd.prefill import PrefillEngine
from dsv4bench.engine.pd.transfer import TransferWorker
from dsv4bench.engine.request import FinishReason, SamplingParams
from dsv4bench.engine.server import ServerConfig
from dsv4bench.engine.server_loop import TokenEvent
from dsv4bench.engine.tokenizer import load_tokenizer
from dsv4bench.servers.monitor import parse_metrics

from .in_process import PDEngine, build_pd_engine

# Small enough that a step takes milliseconds; windows, blocks and pages still matter at ~100 tokens.
TINY = ModelConfig(
    d_model=64,
    n_layers=2,
    n_heads=2,
    head_dim=32,
    rope_dim=16,
    window=32,
    csa_rate=2,
    hca_rate=8,
    index_heads=2,
    index_dim=16,
    index_topk=4,
    n_experts=4,
    experts_per_token=2,
    expert_dim=64,
    shared_expert_dim=64,
    max_context=4096,
)


def tiny_cfg(**overrides) -> EngineConfig:
    settings = {"model": TINY, "page_size": 16, "num_pages": 256, "pd": True, **overrides}
    return EngineConfig(**settings)


def build_tiny(start: bool = False, link_gbps: float = 0.0, **overrides) -> PDEngine:
    """The in-process rig over the tiny model (random weights, seed 0)."""
    return build_pd_engine(tiny_cfg(**overrides), link_gbps, start=start)


def prompt(n: int, seed: int) -> list[int]:
    """`n` ordinary token ids (no special tokens, no EOS)."""
    rng = random.Random(seed)
    return [rng.randrange(300, 8000) for _ in range(n)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


class ListSink:
    """Collects a request's TokenEvents (the router's sink, without an event loop)."""

    def __init__(self) -> None:
        self.events: list[TokenEvent] = []

    def push(self, event: TokenEvent) -> None:
        self.events.append(event)

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events for t in e.token_ids]

    @property
    def finish(self) -> FinishReason | None:
        return self.events[-1].finish_reason if self.events else None


class Pump:
    """Drives a PD engine built with start=False: each call runs one part once, on this thread."""

    def __init__(self, pd: PDEngine) -> None:
        self.pd = pd

    def bootstrap(self) -> None:
        self.pd.bootstrap.drain()

    def decode(self) -> None:
        self.pd.bootstrap.drain()
        self.pd.decode.run_once(block=False)

    def prefill(self) -> None:
        self.pd.bootstrap.drain()
        self.pd.prefill.run_once(block=False)

    def transfer(self) -> None:
        self.pd.transfers.drain()

    def round(self) -> None:
        self.decode()
        self.prefill()
        self.transfer()
        self.decode()

    def until(self, done: Callable[[], bool], step: Callable[[], None] | None = None, rounds: int = 500) -> None:
        """Repeat `step` (a whole round by default) until `done()`."""
        for _ in range(rounds):
            if done():
                return
            (step or self.round)()
        raise AssertionError("the engine did not get there")

    def until_quiet(self, rounds: int = 500) -> None:
        self.until(lambda: quiet(self.pd), rounds=rounds)


def quiet(pd: PDEngine | LivePD) -> bool:
    """Nothing in any queue, message box or room of the PD engine."""
    p, d = pd.prefill, pd.decode
    return not (
        p.bootstrap_queue
        or p.prefilling
        or p.inflight_queue
        or p.scheduler.has_work
        or not p.inbox.empty()
        or d.prealloc_queue
        or d.transfer_queue
        or d.decoding
        or d.scheduler.has_work
        or not d.inbox.empty()
        or pd.bootstrap.rooms
        or not pd.bootstrap.inbox.empty()
        or not pd.transfers.inbox.empty()
    )


def assert_clean(pd: PDEngine | LivePD) -> None:
    """No request anywhere, no page held but the prefill's prefix cache, refcounts exact."""
    assert quiet(pd)
    for engine in (pd.prefill, pd.decode):
        engine.scheduler.check_integrity()  # every page's refcount equals its holders
        assert engine.stats.in_flight == 0, engine.stats
        assert engine.stats.leaked_pages == 0, engine.stats
    assert pd.prefill.allocator.num_used == pd.prefill.cache.num_cached_pages
    assert pd.decode.allocator.num_used == 0


def wait_until(done: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class ServerThread:
    """uvicorn serving `app` from a daemon thread on a free loopback port."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, what="uvicorn to start")
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)


@dataclass
class LivePD:
    """The parts of a served PD deployment a test looks into: the prefill half's engine, its
    bootstrap worker and transfer worker, the decode half's engine, and our router."""

    prefill: PrefillEngine
    decode: DecodeEngine
    bootstrap: BootstrapWorker
    transfers: TransferWorker
    router: Any  # http_router._Router: `active` counts the requests it is routing


class ServedPD:
    """A PD deployment as `engine serve --pd` lays it out, in threads of this process: the
    prefill and the decode half, each an HTTP server with its own engine and pools, joined
    only by the prefill's bootstrap port on loopback, and our PD router in front."""

    def __init__(
        self,
        link_gbps: float = 0.0,
        health_timeout_s: float = DeploymentConfig.health_timeout_s,
        server_cfg: ServerConfig = ServerConfig(),
        start: bool = True,
        **overrides: Any,
    ) -> None:
        cfg = tiny_cfg(**overrides)
        self.halves = {
            role: build_half(role, cfg, server_cfg, bootstrap_port=0, link_gbps=link_gbps, random_weights=True)
            for role in ("prefill", "decode")
        }
        prefill, decode = self.halves["prefill"], self.halves["decode"]
        if start:
            for half in self.halves.values():
                half.start()
        self.servers = {role: ServerThread(half.app) for role, half in self.halves.items()}
        assert prefill.bootstrap_port is not None
        app = build_router_app(
            Halves(self.servers["prefill"].url, self.servers["decode"].url, prefill.bootstrap_port),
            cfg,
            load_tokenizer(),
            min(cfg.model.max_context, prefill.engine.scheduler.max_seq_len, decode.engine.scheduler.max_seq_len),
            dataclasses.replace(server_cfg, engine_type="router"),
            health_timeout_s,
        )
        self.servers = {"router": ServerThread(app), **self.servers}
        self.pd = LivePD(
            prefill.engine,
            decode.engine,
            prefill.bootstrap,
            prefill.transfers,  # type: ignore[arg-type]  # a prefill half has its transfer worker
            app.state.router,
        )
        self.router, self.prefill, self.decode = (self.servers[k].url for k in ("router", "prefill", "decode"))
        self.api = f"{self.router}/v1"

    def metrics(self, name: str) -> dict[str, float]:
        """One server's /metrics as the harness's monitor parses it."""
        return parse_metrics(httpx.get(f"{self.servers[name].url}/metrics", timeout=5).text)

    def gauge(self, name: str, metric: str) -> float:
        return self.metrics(name)[f'{metric}{{engine_type="{name}",model_name="dsv4-mini"}}']

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        for half in self.halves.values():
            half.stop()
