"""A scripted stand-in for the engine loop's AsyncEngine, with the same shape.

Every request "generates" the same script of token ids, `chunk` ids per event, the first at
once and the others `delay` seconds apart, then EOS (finish STOP), or stops at `max_tokens` (finish LENGTH). It records
what it was asked and what happened, so tests can see aborts and closed generators from
another thread (the server runs in its own thread and event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from dsv4bench.engine.config import EngineConfig
from dsv4bench.engine.server_loop import EngineStats, TokenEvent
from dsv4bench.engine.request import FinishReason, SamplingParams


@dataclass
class Seen:
    """One request as the fake saw it."""

    prompt_ids: list[int]
    params: SamplingParams
    outcome: str = "running"  # running | finished | aborted (abort()) | closed (consumer left)


class FakeEngine:
    """The ServingEngine interface (engine/serving_engine.py) over a fixed script."""

    def __init__(
        self,
        script: list[int],
        eos_token_id: int,
        max_context: int = 16384,
        *,
        chunk: int = 3,
        delay: float = 0.0,
        cached_tokens: int = 0,
    ) -> None:
        self.script, self.eos_token_id, self.max_context = list(script), eos_token_id, max_context
        self.chunk, self.delay, self.cached_tokens = chunk, delay, cached_tokens
        self.cfg = EngineConfig()
        self.is_alive = True
        self.seen: dict[str, Seen] = {}
        self._abort_flags: set[str] = set()
        self._lock = threading.Lock()
        self._stats = EngineStats(pages_total=1024)

    def alive(self) -> bool:
        return self.is_alive

    async def generate(
        self, rid: str, prompt_ids: list[int], params: SamplingParams, bootstrap: object = None
    ) -> AsyncIterator[TokenEvent]:
        seen = self.seen[rid] = Seen(list(prompt_ids), params)
        with self._lock:
            self._stats.num_requests_total += 1
            self._stats.prompt_tokens_total += len(prompt_ids)
        n_prompt, script = len(prompt_ids), self.script[: params.max_tokens]
        truncated = len(self.script) > params.max_tokens
        try:
            for i in range(0, len(script), self.chunk):
                await asyncio.sleep(self.delay if i else 0)  # the first event comes at once
                if rid in self._abort_flags:
                    seen.outcome = "aborted"
                    yield TokenEvent([], FinishReason.ABORT, n_prompt, self.cached_tokens)
                    return
                piece, last = script[i : i + self.chunk], i + self.chunk >= len(script)
                reason = None
                if last:
                    reason = FinishReason.LENGTH if truncated else FinishReason.STOP
                    piece = piece if truncated else piece + [self.eos_token_id]
                    seen.outcome = "finished"
                with self._lock:
                    self._stats.gen_tokens_total += len(piece)
                yield TokenEvent(piece, reason, n_prompt, self.cached_tokens)
        finally:
            if seen.outcome == "running":  # the consumer stopped iterating: abort and free
                seen.outcome = "closed"
                with self._lock:
                    self._stats.num_aborted_total += 1
            elif seen.outcome == "aborted":
                with self._lock:
                    self._stats.num_aborted_total += 1

    def abort(self, rid: str) -> bool:
        seen = self.seen.get(rid)
        if seen is None or seen.outcome != "running":
            return False
        self._abort_flags.add(rid)
        return True

    def stats(self) -> EngineStats:
        with self._lock:
            running = sum(1 for s in self.seen.values() if s.outcome == "running")
            return EngineStats(
                **{
                    **self._stats.__dict__,
                    "num_running": running,
                    "pages_used": running,
                    "token_usage": running / self._stats.pages_total,
                }
            )

    def flush_cache(self) -> bool:
        return not any(s.outcome == "running" for s in self.seen.values())

    def wait_outcome(self, rid: str, outcomes: set[str], timeout: float = 1.0) -> str | None:
        """Poll (from any thread) until request `rid` reaches one of `outcomes`; None on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.seen.get(rid)
            if seen is not None and seen.outcome in outcomes:
                return seen.outcome
            time.sleep(0.01)
        return None

    @contextlib.contextmanager
    def scripted(self, script: list[int], *, delay: float = 0.0, chunk: int = 3) -> Iterator[None]:
        """Generate `script` (at `delay` s per event) instead of the default, inside the block."""
        saved = self.script, self.delay, self.chunk
        self.script, self.delay, self.chunk = list(script), delay, chunk
        try:
            yield
        finally:
            self.script, self.delay, self.chunk = saved
