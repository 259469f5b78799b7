"""The prefill server's engine: bootstrap queue -> prefill -> inflight queue (SGLang's names).

1. `submit` puts a request in the bootstrap queue; it waits there until its room is
   BOOTSTRAPPED (the decode server reserved pages for it).
2. It enters the Scheduler as a one-token request: chunked prefill, prefix cache and all. The
   token sampled from the prompt's last logits is the request's first output token.
3. Before the Scheduler releases the finished request, its pages get one more reference each,
   held for the transfer worker; the KV, the first token and the cached-token count go out as
   the room's KVTransfer, and the request waits in the inflight queue.
4. When the transfer is settled, the held references are dropped: full pages stay in the
   prefix cache for later turns, the rest are free. The request's sink hears how it ended:
   its one token when the KV arrived, ABORT otherwise (the prefill server's HTTP answer in a
   PD deployment; in the in-process test rig nobody listens but the decode side's).

A request whose prefill step fails on its own (server_loop.run_batch) leaves the Scheduler,
its transfer records why and its room is aborted, so the decode side ends it with that error.

Aborts, in every queue: in the bootstrap queue the room is aborted through the bootstrap
worker (the request leaves once the worker confirms); in prefill the Scheduler aborts it and
the room tells the decode side; in the inflight queue the transfer is aborted and the queue
lets go once the transfer worker has stopped writing. A room the decode side aborted stops
the prefill of its request.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..config import EngineConfig
from ..faults import Fault
from ..memory import PageAllocator
from ..model_runner import ModelRunner
from ..radix_cache import RadixCache
from ..request import FinishReason, Request
from ..scheduler import ScheduledBatch, Scheduler
from ..server_loop import IDLE_WAIT_S, POLL_S, EventSink, ServerLoop, StepOutput, TokenEvent, count_users, failure_text
from .bootstrap import BootstrapWorker, Room, RoomState
from .stats import PDStats
from .transfer import KVTransfer, TransferStatus, TransferWorker, is_settled

log = logging.getLogger("dsv4bench.engine.pd")


class NullSink:
    """Where a prefill request's events go when nobody awaits them (the in-process test rig)."""

    def push(self, event: TokenEvent) -> None:
        pass


@dataclass(eq=False)
class PrefillEntry:
    req: Request  # the prefill's copy: max_tokens 1 (the first token travels with the KV)
    room: Room
    sink: EventSink = field(default_factory=NullSink)
    abort_requested: bool = False
    held_pages: list[int] = field(default_factory=list)  # references kept for the transfer worker

    @property
    def transfer(self) -> KVTransfer:
        assert self.room.transfer is not None, f"room {self.req.rid} has no transfer yet"
        return self.room.transfer


class PrefillEngine(ServerLoop[PrefillEntry]):
    """Owns the prefill pools' pages, its Scheduler and its three queues (module docstring)."""

    stats_type = PDStats

    def __init__(
        self,
        cfg: EngineConfig,
        runner: ModelRunner,
        bootstrap: BootstrapWorker,
        transfers: TransferWorker,
        eos_token_id: int,
    ) -> None:
        self.cfg = cfg
        self.allocator = PageAllocator(cfg.num_pages)
        self.cache = RadixCache(cfg.page_size, self.allocator)
        super().__init__("pd-prefill", Scheduler(cfg, self.allocator, self.cache, eos_token_id), runner)
        self.bootstrap, self.transfers = bootstrap, transfers
        # Insertion-ordered dicts: FIFO queues with O(1) lookup by rid.
        self.bootstrap_queue: dict[str, PrefillEntry] = {}
        self.prefilling: dict[str, PrefillEntry] = {}  # in the Scheduler
        self.inflight_queue: dict[str, PrefillEntry] = {}
        self.leak_aborted_transfers = Fault.ABORT_LEAK in cfg.faults
        self._held: dict[str, list[int]] = {}  # this step's finished requests' pages, held for transfer

    # ---- any thread -----------------------------------------------------------------------

    def submit(self, req: Request, room: Room, sink: EventSink | None = None) -> None:
        """A request (the prefill's own copy) whose room is open; `sink` hears how it ended."""
        self.submit_entry(PrefillEntry(req, room, sink or NullSink()))

    def flush_cache(self) -> Future[bool]:
        """Drop the prefix cache when no request is here; False otherwise."""

        def flush() -> bool:
            if self.bootstrap_queue or self.prefilling or self.inflight_queue:
                return False
            self.cache.reset()
            return True

        return self.call(flush)

    # ---- the engine thread ----------------------------------------------------------------

    def rids(self) -> list[str]:
        return [*self.bootstrap_queue, *self.prefilling, *self.inflight_queue]

    def add(self, entry: PrefillEntry) -> None:
        self.bootstrap_queue[entry.req.rid] = entry
        self.count("requests", entry.req.rid)
        self.count("prompt", entry.req.rid, len(entry.req.prompt_ids))

    def abort_request(self, rid: str) -> bool:
        if (e := self.bootstrap_queue.get(rid)) is not None:
            if e.abort_requested:
                return False
            e.abort_requested = True
            self.bootstrap.abort(rid)
        elif (e := self.prefilling.pop(rid, None)) is not None:
            self.scheduler.abort(rid)
            self._forget(rid)
            self.bootstrap.abort(rid)  # the room tells the decode side to free its reservation
            self._end(e, None)
        elif (e := self.inflight_queue.get(rid)) is not None:
            if e.abort_requested:
                return False
            e.abort_requested = True
            e.transfer.abort()
        else:
            return False
        self.count("aborted", rid)
        return True

    def work(self) -> None:
        self._pop_bootstrapped()
        self._drop_abandoned()
        if self.scheduler.has_work:
            self.step()
        self._poll_inflight()
        if not (self.bootstrap_queue or self.prefilling or self.inflight_queue):
            self.scheduler.check_integrity()  # idle: every page is free or held by the cache

    def wait_s(self) -> float:
        if self.scheduler.has_work:
            return 0.0
        return POLL_S if self.bootstrap_queue or self.inflight_queue else IDLE_WAIT_S

    def _pop_bootstrapped(self) -> None:
        for rid, e in list(self.bootstrap_queue.items()):
            state = e.room.state
            if state is RoomState.ABORTED:
                del self.bootstrap_queue[rid]
                self._end(e, None)
            elif state is RoomState.BOOTSTRAPPED and not e.abort_requested:
                del self.bootstrap_queue[rid]
                try:
                    self.scheduler.add(e.req)
                except ValueError as err:  # refused (too long for this pool)
                    log.warning("prefill refused %s: %s", rid, err)
                    self.bootstrap.abort(rid)
                    self._end(e, None, f"refused: {err}")
                    continue
                self.prefilling[rid] = e

    def _drop_abandoned(self) -> None:
        """Requests whose decode side aborted (their transfer is ABORTED) are not worth computing."""
        for rid, e in list(self.prefilling.items()):
            if e.transfer.status is TransferStatus.ABORTED:
                del self.prefilling[rid]
                self.scheduler.abort(rid)
                self._forget(rid)
                self._end(e, None)

    def fail(self, rid: str, err: BaseException) -> None:
        """Its transfer carries the error to the decode side, whose client hears it."""
        e = self.prefilling.pop(rid)
        e.transfer.error = failure_text(err)
        self.bootstrap.abort(rid)
        self._end(e, None, e.transfer.error)

    def before_postprocess(self, batch: ScheduledBatch, failed: dict[str, BaseException]) -> None:
        # NOTE: postprocess finishes every request whose prompt completes here and releases its
        # pages; the transfer worker still has to read them, so they get one more reference.
        assert batch.num_decode == 0, "a prefill request finishes at its first token"
        self._held = {e.req.rid: list(e.req.pages) for e in batch.entries if e.sample and e.req.rid not in failed}
        for pages in self._held.values():
            self.allocator.incref(pages)

    def postprocess(self, outputs: dict[str, StepOutput]) -> None:
        for rid, out in outputs.items():
            assert out.finish_reason is not None and len(out.token_ids) == 1
            e = self.prefilling.pop(rid)
            self._forget(rid)
            # NOTE: counted here, where the prefix cache served them; the decode server only
            # reports the count it is sent, so its counter stays 0 and a sum over servers is right.
            self.count("cached", rid, e.req.num_cached)
            e.held_pages = self._held.pop(rid)
            if e.transfer.begin(e.held_pages, out.token_ids[0], e.req.num_cached):
                self.transfers.submit(e.transfer)
                self.inflight_queue[rid] = e
            else:  # the decode side gave up while the prompt was computed
                self.allocator.decref(e.held_pages)
                self._end(e, None)

    def _poll_inflight(self) -> None:
        for rid, e in list(self.inflight_queue.items()):
            if is_settled(e.transfer.status, self.leak_aborted_transfers):
                del self.inflight_queue[rid]
                self.allocator.decref(e.held_pages)
                ok = e.transfer.status is TransferStatus.SUCCESS and not e.abort_requested
                self._end(e, e.transfer.first_token if ok else None, e.transfer.error)

    @staticmethod
    def _end(e: PrefillEntry, first_token: int | None, error: str | None = None) -> None:
        """Tell the request's sink how it ended: its token once the KV is there, else ABORT."""
        if first_token is not None:
            e.sink.push(TokenEvent.of(e.req, [first_token], FinishReason.LENGTH))
        else:
            e.sink.push(TokenEvent.of(e.req, [], FinishReason.ABORT, error))

    def snapshot(self) -> PDStats:
        s = self.scheduler.stats()
        return PDStats(
            num_running=s.num_prefill + s.num_running,
            num_queued=s.num_waiting,
            num_prefill_bootstrap_queue=count_users(self.bootstrap_queue),
            num_prefill_inflight_queue=count_users(self.inflight_queue),
            pages_used=s.pages_used,
            pages_total=s.pages_total,
            num_cached_pages=s.num_cached_pages,
            token_usage=s.token_usage,
            cache_hit_rate=s.cache_hit_rate,
            num_requests_total=self.counts["requests"],
            num_aborted_total=self.counts["aborted"],
            prompt_tokens_total=self.counts["prompt"],
            cached_tokens_total=self.counts["cached"],
            last_step_ms=self.last_step_ms,
            kv=s.kv,
        )

    def fail_all(self) -> None:
        """This thread died: abort every transfer it owes, so the decode side frees its pages
        and tells the clients."""
        for e in [*self.bootstrap_queue.values(), *self.prefilling.values(), *self.inflight_queue.values()]:
            if e.room.transfer is not None:
                e.room.transfer.abort()
            self._end(e, None)
