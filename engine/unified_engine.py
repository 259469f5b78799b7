"""The unified engine: prefill and decode on one Scheduler, as a plain (not disaggregated)
SGLang server runs. It is a `ServerLoop` (server_loop.py): the thread that owns the model.

`AsyncEngine` is the asyncio face the server uses: `generate()` yields TokenEvents and aborts
the request when its consumer goes away (a client disconnect), freeing everything at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from .config import EngineConfig
from .hiradix_cache import HiRadixCache
from .prepared_request import Bootstrap
from .request import FinishReason, Request, SamplingParams
from .scheduler import ScheduledBatch, Scheduler
from .server_loop import (
    IDLE_WAIT_S,
    AsyncSink,
    EngineStats,
    EventSink,
    ServerLoop,
    StepOutput,
    TokenEvent,
    failure_text,
)

log = logging.getLogger("dsv4bench.engine")


@dataclass(eq=False)
class UnifiedEntry:
    req: Request
    sink: EventSink
    cached_tokens_host: int = 0  # of req.num_cached, loaded back from the host tier at its admission

    def event(self, token_ids: list[int], reason: FinishReason | None, error: str | None = None) -> TokenEvent:
        return TokenEvent.of(self.req, token_ids, reason, error, self.cached_tokens_host)


class UnifiedEngine(ServerLoop[UnifiedEntry]):
    """One Scheduler, one queue: a request is in the Scheduler from its Submit to its end."""

    def __init__(
        self, cfg: EngineConfig, scheduler: Scheduler, runner: Callable[[ScheduledBatch], dict[str, int]]
    ) -> None:
        super().__init__("dsv4-engine", scheduler, runner)
        self.cfg = cfg
        self.live: dict[str, UnifiedEntry] = {}  # in the Scheduler

    # ---- any thread -----------------------------------------------------------------------

    def submit(self, req: Request, sink: EventSink) -> None:
        """A new request; its TokenEvents go to `sink`."""
        self.submit_entry(UnifiedEntry(req, sink))

    # ---- the engine thread ----------------------------------------------------------------

    def rids(self) -> list[str]:
        return list(self.live)

    def add(self, entry: UnifiedEntry) -> None:
        req = entry.req
        try:
            self.scheduler.add(req)
        except ValueError as e:  # refused (duplicate rid, too long): fail this request only
            log.warning("request %s refused: %s", req.rid, e)
            entry.sink.push(TokenEvent.of(req, [], FinishReason.ABORT))
            return
        self.live[req.rid] = entry
        self.count("requests", req.rid)
        self.count("prompt", req.rid, len(req.prompt_ids))

    def abort_request(self, rid: str) -> bool:
        in_scheduler = self.scheduler.abort(rid)
        self._forget(rid)
        entry = self.live.pop(rid, None)
        if not (in_scheduler or entry is not None):
            return False
        self.count("aborted", rid)
        if entry is not None:
            self.count("cached", rid, entry.req.num_cached)
            entry.sink.push(entry.event([], FinishReason.ABORT))
        return True

    def work(self) -> None:
        if self.scheduler.has_work:
            self.step()
        else:
            self.scheduler.check_integrity()  # idle: every page is free or held by the cache

    def wait_s(self) -> float:
        return 0.0 if self.scheduler.has_work else IDLE_WAIT_S

    def fail(self, rid: str, err: BaseException) -> None:
        if (entry := self.live.pop(rid, None)) is not None:
            self.count("cached", rid, entry.req.num_cached)
            entry.sink.push(entry.event([], FinishReason.ABORT, failure_text(err)))

    def before_postprocess(self, batch: ScheduledBatch, failed: dict[str, BaseException]) -> None:
        # NOTE: read here, while the Scheduler still knows them: its postprocess forgets the
        # requests it finishes, and the split of a prefill admitted this step rides on every
        # event from now on.
        for e in batch.entries[batch.num_decode :]:
            if (entry := self.live.get(e.req.rid)) is not None:
                entry.cached_tokens_host = self.scheduler.cache_hit(e.req.rid).host

    def postprocess(self, outputs: dict[str, StepOutput]) -> None:
        for rid, out in outputs.items():
            entry = self.live.get(rid)
            if entry is None:
                continue
            self.count("gen", rid, len(out.token_ids))
            entry.sink.push(entry.event(out.token_ids, out.finish_reason))
            if out.finish_reason is not None:
                self.count("cached", rid, entry.req.num_cached)
                del self.live[rid]
                self._forget(rid)

    def snapshot(self) -> EngineStats:
        s = self.scheduler.stats()
        cache = self.scheduler.cache
        return EngineStats(
            num_running=s.num_running,
            num_queued=s.num_waiting,
            num_prefill=s.num_prefill,
            pages_used=s.pages_used,
            pages_total=s.pages_total,
            token_usage=s.token_usage,
            cache_hit_rate=s.cache_hit_rate,
            num_requests_total=self.counts["requests"],
            num_aborted_total=self.counts["aborted"],
            gen_tokens_total=self.counts["gen"],
            prompt_tokens_total=self.counts["prompt"],
            cached_tokens_total=self.counts["cached"],
            last_step_ms=self.last_step_ms,
            kv=s.kv,
            hicache=cache.stats() if isinstance(cache, HiRadixCache) else None,
        )

    def fail_all(self) -> None:
        """This thread died: every client hears ABORT."""
        for entry in self.live.values():
            entry.sink.push(entry.event([], FinishReason.ABORT))
        self.live.clear()


class AsyncEngine:
    """The server's view of the engine: a `ServingEngine` (engine/serving_engine.py)."""

    def __init__(self, cfg: EngineConfig, loop: UnifiedEngine, eos_token_id: int) -> None:
        self.cfg = cfg
        self.loop = loop
        self.eos_token_id = eos_token_id
        self.max_context = cfg.model.max_context

    def alive(self) -> bool:
        return self.loop.alive()

    def stats(self) -> EngineStats:
        return self.loop.stats

    async def generate(
        self, rid: str, prompt_ids: list[int], params: SamplingParams, bootstrap: Bootstrap | None = None
    ) -> AsyncIterator[TokenEvent]:
        """Yield the request's output as it is produced; closing the generator aborts it."""
        if not self.loop.alive():
            raise RuntimeError("the engine loop is not running")
        eos = () if params.ignore_eos or self.eos_token_id in params.stop_token_ids else (self.eos_token_id,)
        req = Request(
            rid=rid,
            prompt_ids=list(prompt_ids),
            params=dataclasses.replace(params, stop_token_ids=tuple(params.stop_token_ids) + eos),
        )
        sink = AsyncSink(asyncio.get_running_loop())
        self.loop.submit(req, sink)
        finished = False
        try:
            while True:
                ev = await sink.queue.get()
                finished = ev.finish_reason is not None
                yield ev
                if finished:
                    return
        finally:
            if not finished:
                # NOTE: a consumer that stops early (client disconnect, cancellation) aborts the
                # request so everything it holds is freed at once, in whatever state it is.
                self.loop.abort(rid)

    def abort(self, rid: str) -> bool:
        """Abort a request by id from any thread, without waiting; True when it is in flight."""
        known = rid in self.loop.live  # a dict read is atomic; the loop thread owns the writes
        self.loop.abort(rid)
        return known

    def flush_cache(self) -> bool:
        """Drop the prefix cache when nothing is running; False otherwise."""

        def flush() -> bool:
            if self.loop.scheduler.has_work:
                return False
            self.loop.scheduler.cache.reset()
            return True

        try:
            return self.loop.call(flush).result(timeout=5)
        except TimeoutError:  # the engine thread is not answering
            return False
