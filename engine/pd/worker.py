"""The prefill and the decode server of a PD deployment whose halves are separate processes,
each a `ServingEngine` (engine/serving_engine.py) that engine/server.py serves with the OpenAI
endpoints, as SGLang's PD servers do.

A PD router (ours, or SGLang's) sends the same request to both halves with the bootstrap
fields (`PreparedRequest.bootstrap`): the prefill server opens the request's room on its
bootstrap port (bootstrap_server.py) and computes the prompt; the decode server reaches that
room (bootstrap_client.py), receives the KV and streams the answer. The prefill server's own
answer is its one token once the KV has left, or an abort. A client that leaves either half
aborts the request there, in whatever queue it is; the room tells the other half.

Health (engine/server.py's handler): a one-token generation through the half, as SGLang's
`/health_generate` on a PD server runs one with a fake bootstrap. The probe comes with no
room: on the prefill it gets a room of its own at this half's bootstrap worker, and its KV is
computed and handed to the transfer worker, which sends it nowhere; on the decode its KV is
taken as arrived and one step decodes a token. So the probe runs every part of the half but
the network, and a stalled bootstrap worker stalls it as it stalls every request. `alive()`
(the engine answers 503 at once when it is false) is the liveness of every thread the half
needs; with the planted `health-lies` fault it is its engine loop's alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence

from ..config import EngineConfig
from ..faults import Fault
from ..prepared_request import Bootstrap
from ..request import FinishReason, Request, SamplingParams, is_health_probe
from ..server_loop import AsyncSink, EngineStats, TokenEvent
from .bootstrap import Room
from .bootstrap_client import BootstrapClient
from .bootstrap_server import BootstrapServer, room_rid
from .decode import DecodeEngine
from .prefill import PrefillEngine
from .transfer import KVTransfer


class DiscardedKVTransfer(KVTransfer):
    """The KV of a prefill health probe: the transfer worker sends its pages nowhere (a probe
    has no decode half behind it), so it ends as a real transfer does, without a connection."""

    def send_pages(self, offset: int, data: bytes) -> None:
        pass


class _Half:
    """What both halves share: the ServingEngine face over one engine loop and its helpers."""

    def __init__(
        self,
        cfg: EngineConfig,
        engine: PrefillEngine | DecodeEngine,
        needs: Sequence[Callable[[], bool]],
        eos_token_id: int,
        max_context: int,
    ) -> None:
        self.cfg, self.engine, self.needs = cfg, engine, needs
        self.eos_token_id, self.max_context = eos_token_id, max_context
        self.health_lies = Fault.HEALTH_LIES in cfg.faults
        self.engine_rids: dict[str, str] = {}  # the response's rid -> the engine's

    def alive(self) -> bool:
        return self.engine.alive() and (self.health_lies or all(alive() for alive in self.needs))

    def stats(self) -> EngineStats:
        return self.engine.stats

    def abort(self, rid: str) -> bool:
        engine_rid = self.engine_rids.get(rid)
        if engine_rid is None:
            return False
        self.engine.abort(engine_rid)
        return True

    def _params(self, params: SamplingParams) -> SamplingParams:
        eos = () if params.ignore_eos or self.eos_token_id in params.stop_token_ids else (self.eos_token_id,)
        return dataclasses.replace(params, stop_token_ids=tuple(params.stop_token_ids) + eos)

    async def _events(self, rid: str, engine_rid: str, sink: AsyncSink) -> AsyncIterator[TokenEvent]:
        """The request's events until its finish; leaving early aborts it in the engine."""
        self.engine_rids[rid] = engine_rid
        finished = False
        try:
            while True:
                event = await sink.queue.get()
                finished = event.finish_reason is not None
                yield event
                if finished:
                    return
        finally:
            self.engine_rids.pop(rid, None)
            if not finished:
                self.engine.abort(engine_rid)


class PrefillServing(_Half):
    def __init__(
        self,
        cfg: EngineConfig,
        engine: PrefillEngine,
        server: BootstrapServer,
        needs: Sequence[Callable[[], bool]],
        eos_token_id: int,
        max_context: int,
    ) -> None:
        super().__init__(cfg, engine, needs, eos_token_id, max_context)
        self.prefill, self.server = engine, server

    @property
    def bootstrap_port(self) -> int:
        """Where decode servers reach this server's rooms (SGLang's disaggregation_bootstrap_port)."""
        return self.server.port

    async def generate(
        self, rid: str, prompt_ids: list[int], params: SamplingParams, bootstrap: Bootstrap | None = None
    ) -> AsyncIterator[TokenEvent]:
        if bootstrap is None:
            assert is_health_probe(rid), "the server refuses a PD half's request without its room"
            async for event in self._probe(rid, prompt_ids, params):
                yield event
            return
        room = Room(room_rid(bootstrap.room, is_health_probe(rid)))
        if not self.server.open(bootstrap.room, room):
            yield TokenEvent([], FinishReason.ABORT, len(prompt_ids), 0, f"bootstrap room {bootstrap.room} is in use")
            return
        try:
            sink = AsyncSink(asyncio.get_running_loop())
            self.prefill.submit(
                Request(room.rid, list(prompt_ids), dataclasses.replace(self._params(params), max_tokens=1)), room, sink
            )
            async for event in self._events(rid, room.rid, sink):
                yield event
        finally:
            self.server.release(bootstrap.room)

    async def _probe(self, rid: str, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        """A health probe's room, opened and preallocated at this half's own bootstrap worker."""
        worker, room = self.server.worker, Room(rid)
        worker.open(room)
        worker.prealloc(rid, DiscardedKVTransfer(rid, list(range(-(-len(prompt_ids) // self.cfg.page_size)))))
        try:
            sink = AsyncSink(asyncio.get_running_loop())
            self.prefill.submit(
                Request(rid, list(prompt_ids), dataclasses.replace(self._params(params), max_tokens=1)), room, sink
            )
            async for event in self._events(rid, rid, sink):
                yield event
        finally:
            worker.close(rid)

    def flush_cache(self) -> bool:
        try:
            return self.prefill.flush_cache().result(timeout=5)
        except TimeoutError:
            return False


class DecodeServing(_Half):
    def __init__(
        self,
        cfg: EngineConfig,
        engine: DecodeEngine,
        client: BootstrapClient,
        needs: Sequence[Callable[[], bool]],
        eos_token_id: int,
        max_context: int,
    ) -> None:
        super().__init__(cfg, engine, needs, eos_token_id, max_context)
        self.decode, self.client = engine, client

    async def generate(
        self, rid: str, prompt_ids: list[int], params: SamplingParams, bootstrap: Bootstrap | None = None
    ) -> AsyncIterator[TokenEvent]:
        probe = bootstrap is None
        engine_rid = rid
        if probe:
            assert is_health_probe(rid), "the server refuses a PD half's request without its room"
            self.client.open_probe(rid, prompt_ids[-1])
            # NOTE: its first token is a stand-in that came with the KV, not generated here: the
            # probe asks for one more, and its answer is that token, from a decode step.
            params = dataclasses.replace(params, max_tokens=params.max_tokens + 1)
        else:
            # NOTE: known here by its room too: a client's own rid (/generate) may come back, a
            # retry, while the aborted request it named still waits in the transfer queue for
            # its room's answer.
            engine_rid = f"{rid}@{room_rid(bootstrap.room)}"
            self.client.open(engine_rid, bootstrap)
        sink = AsyncSink(asyncio.get_running_loop())
        self.decode.submit(Request(engine_rid, list(prompt_ids), self._params(params)), sink)
        async for event in self._events(rid, engine_rid, sink):
            if probe and event.token_ids:
                probe = False
                event = dataclasses.replace(event, token_ids=event.token_ids[1:])
            yield event

    def flush_cache(self) -> bool:
        return True  # no prefix cache on the decode side: every prompt's KV arrives by transfer
