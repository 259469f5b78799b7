"""KV transfer between the prefill and the decode pools: one `KVTransfer` per request, moved
page by page by the `TransferWorker` thread.

A transfer is created by the decode server when it reserves pages for a request (its
destination), handed to the prefill server by the bootstrap handshake, started by the prefill
server once the prompt's KV and first token exist, and concluded by the worker. Both sides
poll its status, as SGLang's queues poll `KVPoll`:

    WAITING_FOR_INPUT --begin()--> TRANSFERRING --worker--> SUCCESS | FAILED | ABORTED
            \\--abort()--> ABORTED

Every pooled tensor moves (window KV, compressed KV, index keys and their scales), so the
decode server continues exactly where a unified engine would.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from ..model.kv_pools import KVPools
from .kv_wire import PageCodec

log = logging.getLogger("dsv4bench.engine.pd")


class TransferStatus(enum.Enum):
    WAITING_FOR_INPUT = "waiting_for_input"  # decode pages reserved; the prefill has not finished
    TRANSFERRING = "transferring"  # queued at or being copied by the worker
    SUCCESS = "success"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def done(self) -> bool:
        return self in (TransferStatus.SUCCESS, TransferStatus.FAILED, TransferStatus.ABORTED)


def is_settled(status: TransferStatus, leak_aborted: bool) -> bool:
    """Whether a queue holding a transfer in `status` may let it go (and free its pages).

    `leak_aborted` is the planted `abort-leak` fault: the check written when a transfer could
    only succeed or fail. An ABORTED transfer then looks as if it were still under way, so the
    decode transfer queue and the prefill inflight queue keep it, and its pages, for ever.
    """
    if leak_aborted:
        return status in (TransferStatus.SUCCESS, TransferStatus.FAILED)
    return status.done


@dataclass(eq=False)
class KVTransfer:
    """One request's KV on its way from prefill pages to reserved decode pages.

    Thread-safe: the decode loop creates and may abort it, the prefill loop begins and may
    abort it, the worker concludes it. `status` is read without the lock (one attribute read).
    """

    rid: str
    dst_pages: list[int]
    status: TransferStatus = TransferStatus.WAITING_FOR_INPUT
    src_pages: list[int] = field(default_factory=list)
    first_token: int | None = None  # sampled by the prefill from the prompt's last logits
    cached_tokens: int = 0  # prompt tokens the prefill served from its prefix cache
    error: str | None = None  # the prefill failed the request: why (the decode side's client hears it)
    _abort_requested: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def begin(self, src_pages: list[int], first_token: int, cached_tokens: int) -> bool:
        """The prefill computed the KV: hand it to the worker. False when already aborted."""
        with self._lock:
            if self.status is not TransferStatus.WAITING_FOR_INPUT:
                return False
            self.src_pages, self.first_token, self.cached_tokens = list(src_pages), first_token, cached_tokens
            self.status = TransferStatus.TRANSFERRING
            return True

    def abort(self) -> None:
        """Stop this transfer. Before `begin` it is ABORTED at once; while the worker holds it,
        the worker concludes ABORTED at its next chunk, so nobody frees pages it still writes."""
        with self._lock:
            if self.status is TransferStatus.WAITING_FOR_INPUT:
                self.status = TransferStatus.ABORTED
            elif self.status is TransferStatus.TRANSFERRING:
                self._abort_requested = True

    def keep_going(self) -> bool:
        """The worker, before each chunk: False (and ABORTED) when an abort came in."""
        with self._lock:
            if self._abort_requested:
                self.status = TransferStatus.ABORTED
            return self.status is TransferStatus.TRANSFERRING

    def conclude(self, ok: bool) -> None:
        with self._lock:
            if self.status is TransferStatus.TRANSFERRING:
                self.status = TransferStatus.SUCCESS if ok else TransferStatus.FAILED


class TransferWorker:
    """The thread that moves pages from the prefill pools to the decode pools, one transfer at
    a time in submission order, paced to a link of `link_bytes_per_s` (0: as fast as memory).

    With `dst` the decode pools are in this process and pages are copied; with no `dst` they
    are in a decode process, and each transfer (bootstrap_server.RemoteKVTransfer) sends its
    pages down its own connection as bytes (kv_wire.PageCodec)."""

    def __init__(self, src: KVPools, dst: KVPools | None, link_bytes_per_s: float = 0.0, chunk_pages: int = 8) -> None:
        assert dst is None or (src.page_size == dst.page_size and len(src.page_tensors()) == len(dst.page_tensors()))
        assert link_bytes_per_s >= 0 and chunk_pages >= 1
        self.src, self.dst = src, dst
        self.codec = PageCodec(src) if dst is None else None
        self.link_bytes_per_s = link_bytes_per_s
        self.chunk_pages = chunk_pages
        self.bytes_per_page = src.bytes_per_page()
        self.inbox: queue.Queue[KVTransfer | None] = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="pd-transfer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.inbox.put(None)
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, transfer: KVTransfer) -> None:
        assert transfer.status is TransferStatus.TRANSFERRING
        self.inbox.put(transfer)

    def drain(self) -> int:
        """Run every queued transfer on the calling thread (tests drive the worker this way).
        Returns how many ran."""
        n = 0
        while True:
            try:
                transfer = self.inbox.get_nowait()
            except queue.Empty:
                return n
            if transfer is not None:
                self.run(transfer)
                n += 1

    def _main(self) -> None:
        try:
            while (transfer := self.inbox.get()) is not None:
                self.run(transfer)
        except BaseException as e:  # never silently: /health reports a dead worker
            self.error = e
            log.exception("transfer worker died")

    def run(self, transfer: KVTransfer) -> None:
        """Copy one transfer's pages chunk by chunk, checking for an abort before each chunk."""
        if len(transfer.src_pages) != len(transfer.dst_pages):
            log.error(
                "transfer %s: %d source pages for %d reserved",
                transfer.rid,
                len(transfer.src_pages),
                len(transfer.dst_pages),
            )
            transfer.conclude(ok=False)
            return
        start = time.monotonic()
        try:
            for i in range(0, len(transfer.src_pages), self.chunk_pages):
                if not transfer.keep_going():
                    return
                src = transfer.src_pages[i : i + self.chunk_pages]
                if self.codec is not None:
                    transfer.send_pages(i, self.codec.pack(src))  # type: ignore[attr-defined]  # a codec: a network transfer, which has it
                else:
                    self._copy(src, transfer.dst_pages[i : i + self.chunk_pages])
                if self.link_bytes_per_s:
                    sent = (i + len(src)) * self.bytes_per_page
                    time.sleep(max(0.0, start + sent / self.link_bytes_per_s - time.monotonic()))
        except Exception:
            log.exception("transfer %s failed", transfer.rid)
            transfer.conclude(ok=False)
            return
        if transfer.keep_going():
            transfer.conclude(ok=True)

    def _copy(self, src_pages: list[int], dst_pages: list[int]) -> None:
        assert self.dst is not None
        src_idx = torch.tensor(src_pages, dtype=torch.long, device=self.src.kv[0].device)
        dst_idx = torch.tensor(dst_pages, dtype=torch.long, device=self.dst.kv[0].device)
        for s, d in zip(self.src.page_tensors(), self.dst.page_tensors()):
            # NOTE: as bytes: index_copy_ has no fp8 kernel on CPU, and a byte copy is exact
            d.view(torch.uint8).index_copy_(0, dst_idx, s.view(torch.uint8).index_select(0, src_idx).to(d.device))
