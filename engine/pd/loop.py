"""What the prefill and the decode engine share: a thread that applies inbox messages and then
does one round of work, over and over; the stats it publishes; the sink its output goes to.

`run_once()` is one round, so tests can drive an engine by hand, deterministically, with no
thread started. The thread is `while not stopped: run_once()`.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TypeVar

from ..engine_loop import EngineStats, TokenEvent
from ..request import is_health_probe

log = logging.getLogger("dsv4bench.engine.pd")
T = TypeVar("T")

IDLE_WAIT_S = 0.5  # nothing to do: block on the inbox this long
POLL_S = 0.002  # waiting on another thread (a handshake, a transfer): look again this soon


@dataclass
class PDStats(EngineStats):
    """EngineStats plus the PD queues (metrics.py exports them under SGLang's names)."""

    num_prefill_bootstrap_queue: int = 0
    num_prefill_inflight_queue: int = 0
    num_decode_prealloc_queue: int = 0
    num_decode_transfer_queue: int = 0
    num_cached_pages: int = 0

    @property
    def in_flight(self) -> int:
        """User requests anywhere in this server."""
        return (self.num_running + self.num_queued + self.num_prefill + self.num_prefill_bootstrap_queue
                + self.num_prefill_inflight_queue + self.num_decode_prealloc_queue + self.num_decode_transfer_queue)

    @property
    def leaked_pages(self) -> int:
        """Pages in use beyond the prefix cache: a leak when nothing is in flight."""
        return self.pages_used - self.num_cached_pages


def count_users(rids: Any) -> int:
    """How many of these request ids are users' (health probes are left out of the gauges)."""
    return sum(not is_health_probe(rid) for rid in rids)


class EventSink(Protocol):
    def push(self, event: TokenEvent) -> None: ...


class AsyncSink:
    """Hands TokenEvents from an engine thread to one asyncio consumer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

    def push(self, event: TokenEvent) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass


class ServerLoop(ABC):
    """Base of PrefillEngine and DecodeEngine: the thread, its inbox and its stats.

    Subclasses implement `handle(kind, payload)` for their own messages, `work()` (one round
    after the inbox), `wait_s()` (how long to block on the inbox before the next round),
    `snapshot()` (stats) and `fail_all()` (the thread died: tell every client).
    """

    def __init__(self, name: str) -> None:
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stats = PDStats()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("wake", None))
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)

    def alive(self) -> bool:
        """The liveness flag: the thread runs and has not died."""
        return self._thread.is_alive() and self.error is None

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the engine thread between rounds (it owns the state); a Future of its result."""
        done: Future[T] = Future()
        self.inbox.put(("call", (fn, done)))
        return done

    def abort(self, rid: str) -> Future[bool]:
        """Abort `rid` wherever it is here; the Future says whether it was known."""
        return self.call(lambda: self._abort(rid))

    def abort_all(self) -> Future[list[str]]:
        """Abort every request here, in whatever queue; the Future lists the ones aborted."""
        return self.call(lambda: [rid for rid in self.rids() if self._abort(rid)])

    def run_once(self, block: bool = True) -> None:
        """One round: apply inbox messages (blocking up to `wait_s()` for the first when
        `block`), then work."""
        try:
            item = self.inbox.get(timeout=self.wait_s()) if block else self.inbox.get_nowait()
        except queue.Empty:
            item = None
        while item is not None:
            self._apply(*item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                item = None
        self.work()
        self.stats = self.snapshot()

    def _apply(self, kind: str, payload: Any) -> None:
        if kind == "call":
            fn, done = payload
            try:
                done.set_result(fn())
            except Exception as e:
                done.set_exception(e)
        elif kind != "wake":
            self.handle(kind, payload)

    def _main(self) -> None:
        try:
            while not self._stop.is_set():
                self.run_once()
        except BaseException as e:  # the loop must never die silently
            self.error = e
            log.exception("%s died", self._thread.name)
            self.fail_all()

    # ---- subclass hooks -------------------------------------------------------------------

    @abstractmethod
    def handle(self, kind: str, payload: Any) -> None: ...

    @abstractmethod
    def work(self) -> None: ...

    @abstractmethod
    def wait_s(self) -> float: ...

    @abstractmethod
    def snapshot(self) -> PDStats: ...

    @abstractmethod
    def fail_all(self) -> None: ...

    @abstractmethod
    def rids(self) -> list[str]:
        """Every request here, queue by queue (engine thread)."""

    @abstractmethod
    def _abort(self, rid: str) -> bool:
        """Abort `rid` in whatever queue holds it; False when it is not here (engine thread)."""
