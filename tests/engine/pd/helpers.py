"""Shared pieces of the PD tests: a tiny model, a PD engine driven by hand (no threads, every
step chosen by the test), and the cleanliness check every abort test ends with."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn

from dsv4bench.engine.config import EngineConfig, ModelConfig
from dsv4bench.engine.server_loop import TokenEvent
from dsv4bench.engine.pd import PDConfig, PDEngine, build_pd_engine
from dsv4bench.engine.launcher import free_port
from dsv4bench.engine.request import FinishReason, SamplingParams
from dsv4bench.engine.server import ServerConfig
from dsv4bench.monitor import parse_metrics

# Small enough that a step takes milliseconds; windows, blocks and pages still matter at ~100 tokens.
TINY = ModelConfig(d_model=64, n_layers=2, n_heads=2, head_dim=32, rope_dim=16, window=32, csa_rate=2, hca_rate=8,
                   index_heads=2, index_dim=16, index_topk=4, n_experts=4, experts_per_token=2, expert_dim=64,
                   shared_expert_dim=64, max_context=4096)


def tiny_cfg(**overrides) -> EngineConfig:
    settings = {"model": TINY, "page_size": 16, "num_pages": 256, "pd": True, **overrides}
    return EngineConfig(**settings)


def build_tiny(start: bool = False, pd_cfg: PDConfig = PDConfig(link_gbps=0), **overrides) -> PDEngine:
    return build_pd_engine(tiny_cfg(**overrides), pd_cfg, random_weights=True, start=start)


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


def quiet(pd: PDEngine) -> bool:
    """Nothing in any queue, message box or room of the PD engine."""
    p, d = pd.prefill, pd.decode
    return not (p.bootstrap_queue or p.prefilling or p.inflight_queue or p.scheduler.has_work or not p.inbox.empty()
                or d.prealloc_queue or d.transfer_queue or d.decoding or d.scheduler.has_work or not d.inbox.empty()
                or pd.bootstrap.rooms or not pd.bootstrap.inbox.empty() or not pd.transfers.inbox.empty())


def assert_clean(pd: PDEngine) -> None:
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


class ServedPD:
    """A started PD engine with its router, prefill and decode servers on loopback."""

    def __init__(self, pd: PDEngine, model_name: str = "dsv4-mini") -> None:
        self.pd = pd
        apps = pd.apps(ServerConfig(model_name=model_name))
        self.servers = {name: ServerThread(app) for name, app in apps.items()}
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
        self.pd.stop()
