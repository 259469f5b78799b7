"""The decode server's engine: prealloc queue -> transfer queue -> running (SGLang's names).

1. `submit` puts a request in the prealloc queue. When a running slot and pages for its whole
   prompt are free, the pages are reserved as the destination of a new KVTransfer, which goes
   to the request's room (the bootstrap handshake); the request moves to the transfer queue.
2. It waits there while the prefill server computes the prompt and the transfer worker copies
   the KV. The wait covers the prefill's whole compute, so under load most requests in flight
   sit here.
3. On SUCCESS it enters the Scheduler straight into RUNNING (`Scheduler.add_prefilled`) with
   the prefill's first token, which is the client's first token; each step then decodes one
   token for it. Preempted requests are recomputed here from their tokens.

Aborts, in every queue, and the room hears of each: the prealloc queue lets go at once; in
the transfer queue the room aborts the transfer and the queue lets go once it is settled (the
transfer worker may still be writing); running requests are aborted by the Scheduler. The
client hears ABORT at once in every case. The room is closed when the request leaves.

No prefix cache here: every prompt's KV arrives by transfer, so a finished request's pages are
simply free again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import EngineConfig
from ..faults import Fault
from ..memory import PageAllocator
from ..model_runner import ModelRunner
from ..radix_cache import RadixCache
from ..request import FinishReason, Request
from ..scheduler import Scheduler
from ..server_loop import IDLE_WAIT_S, POLL_S, EventSink, ServerLoop, StepOutput, TokenEvent, count_users, failure_text
from .bootstrap import BootstrapWorker
from .stats import PDStats
from .transfer import KVTransfer, TransferStatus, is_settled


@dataclass(eq=False)
class DecodeEntry:
    req: Request
    sink: EventSink
    transfer: KVTransfer | None = None  # set when its pages are reserved
    aborted: bool = False


class DecodeEngine(ServerLoop[DecodeEntry]):
    """Owns the decode pools' pages, its Scheduler and its two queues (module docstring)."""

    stats_type = PDStats

    def __init__(self, cfg: EngineConfig, runner: ModelRunner, bootstrap: BootstrapWorker, eos_token_id: int) -> None:
        self.cfg = dataclasses.replace(cfg, enable_prefix_cache=False)
        self.allocator = PageAllocator(cfg.num_pages)
        super().__init__(
            "pd-decode",
            Scheduler(self.cfg, self.allocator, RadixCache(cfg.page_size, self.allocator), eos_token_id),
            runner,
        )
        self.bootstrap = bootstrap
        self.prealloc_queue: dict[str, DecodeEntry] = {}
        self.transfer_queue: dict[str, DecodeEntry] = {}
        self.decoding: dict[str, DecodeEntry] = {}  # in the Scheduler (running, or preempted)
        self.leak_aborted_transfers = Fault.ABORT_LEAK in cfg.faults

    # ---- any thread -----------------------------------------------------------------------

    def submit(self, req: Request, sink: EventSink) -> None:
        """A request whose room the router has opened; its TokenEvents go to `sink`."""
        self.submit_entry(DecodeEntry(req, sink))

    # ---- the engine thread ----------------------------------------------------------------

    def rids(self) -> list[str]:
        return [*self.prealloc_queue, *self.transfer_queue, *self.decoding]

    def add(self, entry: DecodeEntry) -> None:
        rid = entry.req.rid
        if len(entry.req.prompt_ids) >= self.scheduler.max_seq_len:  # could never be reserved
            entry.sink.push(TokenEvent.of(entry.req, [], FinishReason.ABORT))
            self.bootstrap.abort(rid)
            self.bootstrap.close(rid)
            return
        self.prealloc_queue[rid] = entry
        self.count("requests", rid)

    def abort_request(self, rid: str) -> bool:
        if (e := self.prealloc_queue.pop(rid, None)) is not None:
            self.bootstrap.abort(rid)  # the prefill side may wait on the room
            self.bootstrap.close(rid)
        elif (e := self.transfer_queue.get(rid)) is not None:
            if e.aborted:
                return False
            e.aborted = True
            # NOTE: through the room, which owns the transfer until the KV moves; the queue
            # lets go once the transfer is settled (the worker may still be writing).
            self.bootstrap.abort(rid)
        elif (e := self.decoding.pop(rid, None)) is not None:
            self.scheduler.abort(rid)
            self._forget(rid)
            self.bootstrap.abort(rid)  # the room learns of every abort here, whatever its state
            self.bootstrap.close(rid)
        else:
            return False
        e.sink.push(TokenEvent.of(e.req, [], FinishReason.ABORT))
        self.count("aborted", rid)
        return True

    def work(self) -> None:
        self._preallocate()
        self._poll_transfers()
        if self.scheduler.has_work:
            self.step()
        if not (self.prealloc_queue or self.transfer_queue or self.scheduler.has_work):
            self.scheduler.check_integrity()  # idle, and no cache: every page is free

    def wait_s(self) -> float:
        if self.scheduler.has_work:
            return 0.0
        return POLL_S if self.prealloc_queue or self.transfer_queue else IDLE_WAIT_S

    def _preallocate(self) -> None:
        for rid, e in list(self.prealloc_queue.items()):
            n = -(-len(e.req.prompt_ids) // self.cfg.page_size)
            busy = len(self.scheduler.admitted) + len(self.scheduler.waiting) + len(self.transfer_queue)
            # NOTE: leave each running request a page to grow into, so reservations for
            # requests still being prefilled never starve the ones decoding.
            if busy >= self.cfg.max_running_requests or not self.allocator.can_alloc(n + len(self.scheduler.admitted)):
                return  # FIFO: the head waits for room, and so does everything behind it
            del self.prealloc_queue[rid]
            e.transfer = KVTransfer(rid, self.allocator.alloc(n))
            self.transfer_queue[rid] = e
            self.bootstrap.prealloc(rid, e.transfer)

    def _poll_transfers(self) -> None:
        for rid, e in list(self.transfer_queue.items()):
            t = e.transfer
            assert t is not None
            if not is_settled(t.status, self.leak_aborted_transfers):
                continue
            del self.transfer_queue[rid]
            if t.status is TransferStatus.SUCCESS and not e.aborted:
                self._admit(e, t)
                continue
            self.bootstrap.close(rid)
            self.allocator.decref(t.dst_pages)
            if not e.aborted:  # failed, or aborted from the prefill side: the client learns now
                e.sink.push(TokenEvent.of(e.req, [], FinishReason.ABORT, t.error))
                self.count("aborted", rid)

    def _admit(self, e: DecodeEntry, t: KVTransfer) -> None:
        req = e.req
        assert t.first_token is not None
        req.pages, req.num_computed, req.num_cached = list(t.dst_pages), len(req.prompt_ids), t.cached_tokens
        req.output_ids.append(t.first_token)
        try:
            reason = self.scheduler.add_prefilled(req)
        except ValueError:  # a duplicate live rid: fail this request only
            self.allocator.decref(t.dst_pages)
            e.sink.push(TokenEvent.of(req, [], FinishReason.ABORT))
            self.bootstrap.close(req.rid)
            return
        self._emit(e, [t.first_token], reason)
        if reason is None:
            self.decoding[req.rid] = e
            self.bootstrap.decoding(req.rid)
        else:
            self._forget(req.rid)
            self.bootstrap.close(req.rid)

    def fail(self, rid: str, err: BaseException) -> None:
        e = self.decoding.pop(rid)
        self.bootstrap.abort(rid)
        self.bootstrap.close(rid)
        e.sink.push(TokenEvent.of(e.req, [], FinishReason.ABORT, failure_text(err)))

    def postprocess(self, outputs: dict[str, StepOutput]) -> None:
        for rid, out in outputs.items():
            self._emit(self.decoding[rid], out.token_ids, out.finish_reason)
            if out.finish_reason is not None:
                del self.decoding[rid]
                self._forget(rid)
                self.bootstrap.close(rid)

    def _emit(self, e: DecodeEntry, token_ids: list[int], reason: FinishReason | None) -> None:
        self.count("gen", e.req.rid, len(token_ids))
        e.sink.push(TokenEvent.of(e.req, token_ids, reason))

    def snapshot(self) -> PDStats:
        s = self.scheduler.stats()
        return PDStats(
            num_running=s.num_running,
            num_queued=s.num_waiting + s.num_prefill,
            num_decode_prealloc_queue=count_users(self.prealloc_queue),
            num_decode_transfer_queue=count_users(self.transfer_queue),
            pages_used=s.pages_used,
            pages_total=s.pages_total,
            token_usage=s.token_usage,
            num_requests_total=self.counts["requests"],
            num_aborted_total=self.counts["aborted"],
            gen_tokens_total=self.counts["gen"],
            last_step_ms=self.last_step_ms,
            kv=s.kv,
        )

    def fail_all(self) -> None:
        """This thread died: every client hears ABORT."""
        for e in [*self.prealloc_queue.values(), *self.transfer_queue.values(), *self.decoding.values()]:
            if not e.aborted:
                e.sink.push(TokenEvent.of(e.req, [], FinishReason.ABORT))
