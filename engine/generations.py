"""The server's in-flight generations: each `Generation` reads one engine request, times it for
the latency histograms, and closes it; `Generations` starts them and keeps them by rid for
`abort_all`.

Closing a generation closes the engine's generator, which aborts the request if it is still running.
A client that leaves cancels the handler reading the generation; the cancellation passes into the
engine's generator and aborts the request there and then.

The `ghost-decode` fault lives here. Under it the server, not the engine, ends a turn: the
engine request ignores EOS, the event carrying EOS is passed on as the finish, and closing the
generation aborts the request (as a stop string does in the clean server). Reads of the engine are
shielded, so a client that leaves mid-read cannot cancel them, and the close of a generation whose
client left skips the generator such a read still holds. Nothing aborts that request: it keeps
its running slot and decodes to max_tokens for nobody, its output piling up unread. Only
`abort_all` (or `/abort_request` with its rid) still reaches it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .prepared_request import PreparedRequest
from .outputs import TokenEventLike
from .metrics import ServerMetrics
from .request import FinishReason
from .serving_engine import ServingEngine

log = logging.getLogger("dsv4bench.engine.server")
T = TypeVar("T")


class Generations:
    """Starts generations on one engine and keeps the unclosed ones by rid."""

    def __init__(self, engine: ServingEngine, metrics: ServerMetrics, ghost_decode: bool = False) -> None:
        self.engine, self.metrics, self.ghost_decode = engine, metrics, ghost_decode
        self.active: dict[str, Generation] = {}

    def start(self, req: PreparedRequest, arrival: float) -> Generation:
        gen = Generation(self, req, arrival)
        self.active[req.rid] = gen
        return gen


class Generation:
    """One engine generation: its generator, timing for the metrics, and cleanup."""

    def __init__(self, gens: Generations, req: PreparedRequest, arrival: float) -> None:
        self.gens, self.req, self.arrival = gens, req, arrival
        params = dataclasses.replace(req.params, ignore_eos=True) if gens.ghost_decode else req.params
        self.gen = gens.engine.generate(req.rid, req.prompt_ids, params, req.bootstrap)
        self.first_token_at: float | None = None
        self.finished = False  # a finish was read (stop, length or abort)
        self.closed = False

    @property
    def events(self) -> AsyncIterator[TokenEventLike]:
        return _Timed(self)

    async def next_event(self) -> TokenEventLike:
        if not self.gens.ghost_decode:
            return await self.gen.__anext__()  # a cancelled handler cancels (aborts) the request with it
        event = await asyncio.shield(asyncio.ensure_future(self.gen.__anext__()))
        eos = self.gens.engine.eos_token_id
        if event.finish_reason is None and eos in event.token_ids:  # the server's own end of the turn
            ids = event.token_ids[: event.token_ids.index(eos) + 1]
            event = dataclasses.replace(event, token_ids=ids, finish_reason=FinishReason.STOP)  # type: ignore[type-var]  # a Protocol, met by dataclasses
        return event

    async def close(self, completed: bool) -> None:
        """Close the engine generator (aborts the request if still running); record latency.
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.gens.ghost_decode and not completed and not self.finished:
            log.info("request %s: client gone, request left running", self.req.rid)  # the fault
            return
        with anyio.CancelScope(shield=True):
            await self.gen.aclose()
        self.gens.active.pop(self.req.rid, None)
        if completed:
            self.gens.metrics.observe_request(time.monotonic() - self.arrival)


class _Timed:
    """Iterates a generation's events and notes the first token for the TTFT histogram."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation

    def __aiter__(self) -> _Timed:
        return self

    async def __anext__(self) -> TokenEventLike:
        event = await self.generation.next_event()
        self.generation.finished = self.generation.finished or event.finish_reason is not None
        if self.generation.first_token_at is None and event.token_ids:
            self.generation.first_token_at = time.monotonic()
            self.generation.gens.metrics.observe_first_token(self.generation.first_token_at - self.generation.arrival)
        return event


class SSEResponse(StreamingResponse):
    """A StreamingResponse that always closes its body iterator and its generation, even when the
    client left while the body was suspended at a `yield` or had not started (Starlette then
    cancels without closing anything)."""

    def __init__(self, content: AsyncIterator[str], generation: Generation) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self.generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]  # starlette types it as any async iterable
                await self.generation.close(completed=False)  # a no-op when the body closed it


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """`work()`'s result, or None when the client disconnects first (work is then cancelled)."""
    result: T | None = None
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            nonlocal result
            result = await work()
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            log.info("%s %s: client disconnected", request.method, request.url.path)
            tg.cancel_scope.cancel()

        tg.start_soon(run)
        tg.start_soon(watch)
    return result
