"""The engine loop: one thread owns the model and the scheduler; the server talks to it through
thread-safe queues. `step()` is three calls, as in nano-vllm: schedule, run, postprocess.

`AsyncEngine` is the asyncio face the server uses: `generate()` yields TokenEvents and aborts
the request when its consumer goes away (a client disconnect), freeing everything at once.

A request that fails on its own inside the step (its sampling raises: the runner names it) is
ended with an error event (`TokenEvent.error`) and aborted; the step goes on for the others
and the loop keeps serving (`run_batch`). Any other failure is the engine's own (the model
raising for a whole batch, a broken invariant): the loop stops, every request hears ABORT,
and /health says 503.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from .config import EngineConfig
from .hiradix_cache import HiCacheStats, HiRadixCache
from .request import FinishReason, Request, RequestFailure, SamplingParams, is_health_probe

log = logging.getLogger("dsv4bench.engine")


@dataclass
class TokenEvent:
    """New output of one request since its last event."""

    token_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None  # the engine failed this request (finish_reason ABORT): why


def failure_text(err: BaseException) -> str:
    """What a client hears of an error that ended its request in the loop."""
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= 200 else text[:200] + "..."


def run_batch(runner: Callable[[Any], dict[str, int]], batch: Any) -> tuple[dict[str, int], dict[str, BaseException]]:
    """Run one step's batch: (tokens of the requests served, errors of the requests that failed
    on their own). A runner names such requests in a `RequestFailure` (model_runner.py: a
    request's sampling raised); any other exception is the engine's and propagates."""
    try:
        return runner(batch), {}
    except RequestFailure as f:
        return f.sampled, f.failed


@dataclass
class EngineStats:
    """A snapshot the loop publishes after every step; read by /metrics without locking."""

    num_running: int = 0
    num_queued: int = 0
    num_prefill: int = 0
    pages_used: int = 0
    pages_total: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0
    num_requests_total: int = 0
    num_aborted_total: int = 0
    gen_tokens_total: int = 0
    prompt_tokens_total: int = 0
    last_step_ms: float = 0.0
    hicache: HiCacheStats | None = None  # host-tier counters when serving with --hicache


class _Sink:
    """Hands events from the loop thread to the asyncio consumer of one request."""

    def __init__(self, req: Request, loop: asyncio.AbstractEventLoop) -> None:
        self.req = req
        self.loop = loop
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

    def push(self, ev: TokenEvent) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)


class EngineLoop:
    """The thread that owns the model. `runner(batch) -> {rid: token}` is the only device call."""

    def __init__(self, cfg: EngineConfig, scheduler: Any, runner: Callable[[Any], dict[str, int]]) -> None:
        self.cfg = cfg
        self.scheduler = scheduler
        self.runner = runner
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.sinks: dict[str, _Sink] = {}
        self.stats = EngineStats()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="dsv4-engine", daemon=True)
        self._counts = {"requests": 0, "aborted": 0, "gen": 0, "prompt": 0}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("wake", None))
        self._thread.join(timeout=10)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # -- the loop thread ------------------------------------------------------------------
    def _main(self) -> None:
        try:
            while not self._stop.is_set():
                idle = not self._has_work()
                self._drain(block=idle)
                if self._has_work():
                    self.step()
                elif idle:
                    self.scheduler.check_integrity()
        except BaseException as e:  # the loop must never die silently: fail every request
            self.error = e
            log.exception("engine loop died")
            for sink in list(self.sinks.values()):
                sink.push(TokenEvent([], FinishReason.ABORT, len(sink.req.prompt_ids), sink.req.num_cached))
            self.sinks.clear()

    def _has_work(self) -> bool:
        return bool(self.scheduler.has_work)

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "add":
            sink: _Sink = payload
            try:
                self.scheduler.add(sink.req)
            except ValueError as e:  # refused (duplicate rid, too long): fail this request only
                log.warning("request %s refused: %s", sink.req.rid, e)
                sink.push(TokenEvent([], FinishReason.ABORT, len(sink.req.prompt_ids), 0))
                return
            self.sinks[sink.req.rid] = sink
            if not is_health_probe(sink.req.rid):
                self._counts["requests"] += 1
                self._counts["prompt"] += len(sink.req.prompt_ids)
        elif kind == "abort":
            rid, done = payload
            ok = self.scheduler.abort(rid)
            self._forget(rid)
            sink = self.sinks.pop(rid, None)
            if (ok or sink is not None) and not is_health_probe(rid):
                self._counts["aborted"] += 1
            if sink is not None:
                sink.push(TokenEvent([], FinishReason.ABORT, len(sink.req.prompt_ids), sink.req.num_cached))
            if done is not None:
                done(ok)
        elif kind == "call":  # run a function on the loop thread (flush_cache)
            fn, done = payload
            done(fn())
        self._publish()

    def step(self) -> None:
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if batch is None:
            return
        sampled, failed = run_batch(self.runner, batch)
        for rid, err in failed.items():
            self._fail(rid, err)
        events = self.scheduler.postprocess(batch, sampled)
        out: dict[str, list[int]] = {}
        finished: dict[str, FinishReason] = {}
        for ev in events:
            if ev.token_id is not None:
                out.setdefault(ev.rid, []).append(ev.token_id)
            if ev.finish_reason is not None:
                finished[ev.rid] = FinishReason(ev.finish_reason)
        for rid in set(out) | set(finished):
            sink = self.sinks.get(rid)
            if sink is None:
                continue
            ids = out.get(rid, [])
            if not is_health_probe(rid):
                self._counts["gen"] += len(ids)
            sink.push(TokenEvent(ids, finished.get(rid), len(sink.req.prompt_ids), sink.req.num_cached))
            if rid in finished:
                del self.sinks[rid]
                self._forget(rid)
        self.stats.last_step_ms = (time.perf_counter() - t0) * 1e3
        self._publish()

    def _fail(self, rid: str, err: BaseException) -> None:
        """End a request the step failed on: aborted in the scheduler, its client told why."""
        log.error("request %s failed in the engine loop: %s", rid, failure_text(err), exc_info=err)
        self.scheduler.abort(rid)
        self._forget(rid)
        sink = self.sinks.pop(rid, None)
        if not is_health_probe(rid):
            self._counts["aborted"] += 1
        if sink is not None:
            sink.push(TokenEvent([], FinishReason.ABORT, len(sink.req.prompt_ids), sink.req.num_cached,
                                 failure_text(err)))

    def _forget(self, rid: str) -> None:
        forget = getattr(self.runner, "forget", None)
        if forget is not None:
            forget(rid)

    def _publish(self) -> None:
        s = self.scheduler.stats()
        self.stats = EngineStats(
            num_running=s.num_running, num_queued=s.num_waiting, num_prefill=s.num_prefill,
            pages_used=s.pages_used, pages_total=s.pages_total, token_usage=s.token_usage,
            cache_hit_rate=s.cache_hit_rate, num_requests_total=self._counts["requests"],
            num_aborted_total=self._counts["aborted"], gen_tokens_total=self._counts["gen"],
            prompt_tokens_total=self._counts["prompt"], last_step_ms=self.stats.last_step_ms,
            hicache=self.scheduler.cache.stats() if isinstance(self.scheduler.cache, HiRadixCache) else None,
        )


class AsyncEngine:
    """The server's view of the engine: a `ServingEngine` (engine/serving_engine.py)."""

    def __init__(self, cfg: EngineConfig, loop: EngineLoop, eos_token_id: int) -> None:
        self.cfg = cfg
        self.loop = loop
        self.eos_token_id = eos_token_id
        self.max_context = cfg.model.max_context

    def alive(self) -> bool:
        return self.loop.alive()

    def stats(self) -> EngineStats:
        return self.loop.stats

    async def generate(self, rid: str, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        """Yield the request's output as it is produced; closing the generator aborts it."""
        if not self.loop.alive():
            raise RuntimeError("the engine loop is not running")
        eos = () if params.ignore_eos or self.eos_token_id in params.stop_token_ids else (self.eos_token_id,)
        req = Request(rid=rid, prompt_ids=list(prompt_ids),
                      params=dataclasses.replace(params, stop_token_ids=tuple(params.stop_token_ids) + eos))
        sink = _Sink(req, asyncio.get_running_loop())
        self.loop.inbox.put(("add", sink))
        finished = False
        try:
            while True:
                ev = await sink.queue.get()
                if ev.finish_reason is not None:
                    finished = True
                yield ev
                if finished:
                    return
        finally:
            if not finished:
                # NOTE: a consumer that stops early (client disconnect, cancellation) aborts the
                # request so everything it holds is freed at once, in whatever state it is.
                self.loop.inbox.put(("abort", (rid, None)))

    def abort(self, rid: str) -> bool:
        """Abort a request by id from any thread, without waiting; True when it is in flight."""
        known = rid in self.loop.sinks  # a dict read is atomic; the loop thread owns the writes
        self.loop.inbox.put(("abort", (rid, None)))
        return known

    def flush_cache(self) -> bool:
        """Drop the prefix cache when nothing is running; False otherwise."""
        done = threading.Event()
        result: list[bool] = []

        def flush() -> bool:
            if self.loop.scheduler.has_work:
                return False
            self.loop.scheduler.cache.reset()
            return True

        self.loop.inbox.put(("call", (flush, lambda ok: (result.append(ok), done.set()))))
        done.wait(timeout=5)
        return bool(result and result[0])
