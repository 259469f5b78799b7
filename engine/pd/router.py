"""The PD router's engine: a `ServingEngine` (engine/serving_engine.py, what engine/server.py
serves), over a prefill and a decode engine.

`generate` opens the request's bootstrap room, sends the request to both servers (the prefill
gets a one-token copy: its token is the first output token and travels with the KV) and
yields the decode server's TokenEvents. When the consumer leaves before the end (a client
disconnect, a health probe's deadline), both servers abort it, in whatever queue it is.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator

from ..config import EngineConfig
from ..prepared_request import Bootstrap
from ..request import FinishReason, Request, SamplingParams, is_health_probe
from ..server_loop import AsyncSink, EngineStats, EventSink, TokenEvent, count_users
from .bootstrap import BootstrapWorker, Room
from .decode import DecodeEngine
from .prefill import PrefillEngine


class PDRouter:
    """Routes each request through the prefill and then the decode engine (module docstring)."""

    def __init__(self, cfg: EngineConfig, prefill: PrefillEngine, decode: DecodeEngine, bootstrap: BootstrapWorker,
                 eos_token_id: int) -> None:
        self.cfg = cfg
        self.prefill, self.decode, self.bootstrap = prefill, decode, bootstrap
        self.eos_token_id = eos_token_id
        self.max_context = min(cfg.model.max_context, prefill.scheduler.max_seq_len, decode.scheduler.max_seq_len)
        self.active: set[str] = set()  # rids whose generate() is running
        self.counts: Counter[str] = Counter()

    def alive(self) -> bool:
        """The liveness flag: both engine threads run (the workers between them are not asked)."""
        return self.prefill.alive() and self.decode.alive()

    def stats(self) -> EngineStats:
        return EngineStats(num_running=count_users(self.active), num_requests_total=self.counts["requests"],
                           num_aborted_total=self.counts["aborted"], gen_tokens_total=self.counts["gen"],
                           prompt_tokens_total=self.counts["prompt"])

    async def generate(self, rid: str, prompt_ids: list[int], params: SamplingParams,
                       bootstrap: Bootstrap | None = None) -> AsyncIterator[TokenEvent]:
        """Yield the request's output as the decode server produces it; closing the generator
        before the end aborts the request on both servers."""
        if not self.alive():
            raise RuntimeError("the PD engine is not running")
        sink = AsyncSink(asyncio.get_running_loop())
        self.dispatch(rid, prompt_ids, params, sink)
        user = not is_health_probe(rid)
        self.active.add(rid)
        if user:
            self.counts["requests"] += 1
            self.counts["prompt"] += len(prompt_ids)
        completed = False
        try:
            while True:
                event = await sink.queue.get()
                if user:
                    self.counts["gen"] += len(event.token_ids)
                completed = event.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
                yield event
                if event.finish_reason is not None:
                    return
        finally:
            self.active.discard(rid)
            if not completed:
                self.prefill.abort(rid)
                self.decode.abort(rid)
                if user:
                    self.counts["aborted"] += 1

    def dispatch(self, rid: str, prompt_ids: list[int], params: SamplingParams, sink: EventSink) -> None:
        """Send a request to both servers; its TokenEvents will come to `sink` (any thread)."""
        stop_ids = params.stop_token_ids + (() if self.eos_token_id in params.stop_token_ids else (self.eos_token_id,))
        params = dataclasses.replace(params, stop_token_ids=stop_ids)
        room = Room(rid)
        self.bootstrap.open(room)  # NOTE: first: both servers' handshake messages refer to it
        self.decode.submit(Request(rid, list(prompt_ids), params), sink)
        self.prefill.submit(Request(rid, list(prompt_ids), dataclasses.replace(params, max_tokens=1)), room)

    def abort(self, rid: str) -> bool:
        """Abort `rid` on both servers from any thread, without waiting; True when it is in flight."""
        known = rid in self.active
        self.prefill.abort(rid)
        self.decode.abort(rid)
        return known

    def flush_cache(self) -> bool:
        """Drop the prefill server's prefix cache when nothing is there (decode keeps none)."""
        try:
            return self.prefill.flush_cache().result(timeout=5)
        except TimeoutError:  # the prefill thread is not answering
            return False
