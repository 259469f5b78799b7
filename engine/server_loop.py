"""The one server loop of the unified, the prefill and the decode engine: a thread that owns a
Scheduler and its model runner, applies the messages of its inbox, then does one round of work,
over and over.

Other threads talk to it only through the inbox, in small typed messages: `Submit` (a request
and where its output goes), `Abort`, `Call` (run a function on the loop thread, which owns the
state; its result comes back in a Future) and `Wake` (stop blocking). `run_once()` is one round,
so tests can drive an engine by hand, deterministically, with no thread started; the thread is
`while not stopped: run_once()`.

`step()` is one scheduler step, read as nano-vllm's `LLMEngine.step`: schedule, run,
postprocess. A request that fails on its own inside the run (its sampling raises: the runner
names it in a `RequestFailure`) is ended alone (`fail`) and the step goes on for the others.
Any other failure is the engine's own (the model raising for a whole batch, a broken
invariant): the thread stops, `fail_all` tells every client, and /health says 503.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from .hiradix_cache import HiCacheStats
from .request import FinishReason, Request, RequestFailure, is_health_probe
from .scheduler import KVPoolStats, OutputEvent, ScheduledBatch, Scheduler

log = logging.getLogger("dsv4bench.engine")

SLOW_STEP_MS = 250.0  # a step this long stalls every stream: logged (at info) with its size
T = TypeVar("T")
E = TypeVar("E")

IDLE_WAIT_S = 0.5  # nothing to do: block on the inbox this long
POLL_S = 0.002  # waiting on another thread (a handshake, a transfer): look again this soon


# ---- what the loop hands out ------------------------------------------------------------------


@dataclass
class TokenEvent:
    """New output of one request since its last event."""

    token_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None  # the engine failed this request (finish_reason ABORT): why
    # Of `cached_tokens`, those loaded back from the host tier for this request (HiCache); the
    # rest were on the device. SGLang's cached_tokens_details (outputs.cached_tokens_details).
    cached_tokens_host: int = 0

    @classmethod
    def of(
        cls,
        req: Request,
        token_ids: list[int],
        reason: FinishReason | None,
        error: str | None = None,
        cached_tokens_host: int = 0,
    ) -> TokenEvent:
        return cls(token_ids, reason, len(req.prompt_ids), req.num_cached, error, cached_tokens_host)


@dataclass
class EngineStats:
    """A snapshot the loop publishes after every round; read by /metrics without locking."""

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
    cached_tokens_total: int = 0  # prompt tokens served from the prefix cache, counted as requests end
    last_step_ms: float = 0.0
    kv: KVPoolStats = KVPoolStats()  # the device pool in tokens (all zero on a router)
    hicache: HiCacheStats | None = None  # host-tier counters when serving with --hicache


class EventSink(Protocol):
    """Where one request's TokenEvents go (called on the loop thread)."""

    def push(self, event: TokenEvent) -> None: ...


class _Outbox:
    """One event loop's TokenEvents on their way from engine threads, handed over in batches.

    A decode step ends with one event per request in it; one `call_soon_threadsafe` each would
    wake the loop and write to its self-pipe 80 times a step at batch 80, while the step's
    OpenMP threads want the same two cores. Events pushed before the loop has drained the
    outbox ride on the hand-over already scheduled: one wake-up per step, order kept.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[TokenEvent], TokenEvent]] = []

    def push(self, into: asyncio.Queue[TokenEvent], event: TokenEvent) -> None:
        with self._lock:
            self._pending.append((into, event))
            if len(self._pending) > 1:
                return  # the hand-over of the first is scheduled and has not run yet
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for into, event in pending:
            into.put_nowait(event)


_outboxes: dict[asyncio.AbstractEventLoop, _Outbox] = {}
_outboxes_lock = threading.Lock()


def _outbox(loop: asyncio.AbstractEventLoop) -> _Outbox:
    with _outboxes_lock:
        box = _outboxes.get(loop)
        if box is None or box.loop.is_closed():
            for old in [k for k in _outboxes if k.is_closed()]:
                del _outboxes[old]
            box = _outboxes[loop] = _Outbox(loop)
        return box


class AsyncSink:
    """Hands TokenEvents from an engine thread to one asyncio consumer (through its loop's outbox)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._outbox = _outbox(loop)

    def push(self, event: TokenEvent) -> None:
        self._outbox.push(self.queue, event)


def failure_text(err: BaseException) -> str:
    """What a client hears of an error that ended its request in the loop."""
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= 200 else text[:200] + "..."


def count_users(rids: Iterable[str]) -> int:
    """How many of these request ids are users' (health probes are left out of the gauges)."""
    return sum(not is_health_probe(rid) for rid in rids)


# ---- one step's output, per request -----------------------------------------------------------


@dataclass
class StepOutput:
    """What one step produced for one request: its new tokens, and why it ended if it did."""

    token_ids: list[int]
    finish_reason: FinishReason | None = None


def outputs_by_request(events: Iterable[OutputEvent]) -> dict[str, StepOutput]:
    """The scheduler's postprocess events, gathered per request (in the order they came)."""
    out: dict[str, StepOutput] = {}
    for ev in events:
        o = out.setdefault(ev.rid, StepOutput([]))
        if ev.new_token_id is not None:
            o.token_ids.append(ev.new_token_id)
        if ev.finish_reason is not None:
            o.finish_reason = FinishReason(ev.finish_reason)
    return out


def run_batch(
    runner: Callable[[ScheduledBatch], dict[str, int]], batch: ScheduledBatch
) -> tuple[dict[str, int], dict[str, BaseException]]:
    """Run one step's batch: (tokens of the requests served, errors of the requests that failed
    on their own). A runner names such requests in a `RequestFailure` (model_runner.py: a
    request's sampling raised); any other exception is the engine's and propagates."""
    try:
        return runner(batch), {}
    except RequestFailure as f:
        return f.sampled, f.failed


# ---- the inbox's messages ---------------------------------------------------------------------


@dataclass(frozen=True)
class Submit(Generic[E]):
    """A new request: the engine's entry for it (the request, and where its output goes)."""

    entry: E


@dataclass(frozen=True)
class Abort:
    """Abort a request wherever it is; `done` hears whether it was known."""

    rid: str
    done: Future[bool] | None = None


@dataclass(frozen=True)
class Call:
    """Run `fn` on the loop thread between rounds; `done` gets its result or its exception."""

    fn: Callable[[], Any]
    done: Future[Any]


@dataclass(frozen=True)
class Wake:
    """Stop blocking on the inbox (the loop is being stopped)."""


Message = Submit[Any] | Abort | Call | Wake


class ServerLoop(ABC, Generic[E]):
    """The thread, its inbox, its step and its stats; the unified, prefill and decode engines
    are subclasses that keep their own queues of entries (`E`) and publish `stats_type`.

    Subclasses implement `add(entry)` (a Submit), `abort_request(rid)`, `rids()`, `work()` (one
    round after the inbox), `wait_s()` (how long to block on the inbox before the next round),
    `fail(rid, err)` and `postprocess(outputs)` (the step's two outcomes), `snapshot()` (stats)
    and `fail_all()` (the thread died: tell every client).
    """

    stats_type: type[EngineStats] = EngineStats

    def __init__(self, name: str, scheduler: Scheduler, runner: Callable[[ScheduledBatch], dict[str, int]]) -> None:
        self.scheduler, self.runner = scheduler, runner
        # NOTE: a model runner keeps per-request state (its sampling generators) to be dropped
        # when a request leaves; a scripted test runner keeps none.
        self._forget: Callable[[str], None] = getattr(runner, "forget", lambda rid: None)
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.counts: Counter[str] = Counter()  # requests, aborted, gen, prompt, cached: users' only
        self.last_step_ms = 0.0
        self.stats = self.stats_type()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # ---- any thread -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(Wake())
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)

    def alive(self) -> bool:
        """The liveness flag: the thread runs and has not died."""
        return self._thread.is_alive() and self.error is None

    def submit_entry(self, entry: E) -> None:
        self.inbox.put(Submit(entry))

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the engine thread between rounds (it owns the state); a Future of its result."""
        done: Future[T] = Future()
        self.inbox.put(Call(fn, done))
        return done

    def abort(self, rid: str) -> Future[bool]:
        """Abort `rid` wherever it is here; the Future says whether it was known."""
        done: Future[bool] = Future()
        self.inbox.put(Abort(rid, done))
        return done

    def abort_all(self) -> Future[list[str]]:
        """Abort every request here, in whatever queue; the Future lists the ones aborted."""
        return self.call(lambda: [rid for rid in self.rids() if self.abort_request(rid)])

    # ---- the engine thread ----------------------------------------------------------------

    def run_once(self, block: bool = True) -> None:
        """One round: apply inbox messages (blocking up to `wait_s()` for the first when
        `block`), then work."""
        try:
            msg: Message | None = self.inbox.get(timeout=self.wait_s()) if block else self.inbox.get_nowait()
        except queue.Empty:
            msg = None
        while msg is not None:
            self._apply(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                msg = None
        self.work()
        self.stats = self.snapshot()

    def _apply(self, msg: Message) -> None:
        if isinstance(msg, Submit):
            self.add(msg.entry)
        elif isinstance(msg, Abort):
            known = self.abort_request(msg.rid)
            if msg.done is not None:
                msg.done.set_result(known)
        elif isinstance(msg, Call):
            try:
                msg.done.set_result(msg.fn())
            except Exception as e:  # noqa: BLE001 - handed to the caller, whose call it was
                msg.done.set_exception(e)
        # Wake: nothing to do, the round goes on and the loop sees `_stop`

    def step(self) -> None:
        """One scheduler step: schedule, run, postprocess."""
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if batch is None:
            return
        sampled, failed = run_batch(self.runner, batch)
        for rid, err in failed.items():
            log.error("request %s failed in the %s loop: %s", rid, self._thread.name, failure_text(err), exc_info=err)
            self.scheduler.abort(rid)
            self._forget(rid)
            self.count("aborted", rid)
            self.fail(rid, err)
        self.before_postprocess(batch, failed)
        self.postprocess(outputs_by_request(self.scheduler.postprocess(batch, sampled)))
        self.last_step_ms = (time.perf_counter() - t0) * 1e3
        if self.last_step_ms > SLOW_STEP_MS:
            log.info(
                "slow step: %.0f ms for %d tokens (%d of prefill) of %d requests",
                self.last_step_ms,
                batch.num_tokens,
                batch.num_prefill_tokens,
                len(batch.entries),
            )

    def count(self, what: str, rid: str, n: int = 1) -> None:
        """Count toward the `*_total` counters, users' requests only."""
        if not is_health_probe(rid):
            self.counts[what] += n

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
    def add(self, entry: E) -> None:
        """A submitted request enters this engine's first queue (engine thread)."""

    @abstractmethod
    def abort_request(self, rid: str) -> bool:
        """Abort `rid` in whatever queue holds it; False when it is not here (engine thread)."""

    @abstractmethod
    def rids(self) -> list[str]:
        """Every request here, queue by queue (engine thread)."""

    @abstractmethod
    def work(self) -> None:
        """One round's work after the inbox: at least `step()` when the scheduler has work."""

    @abstractmethod
    def wait_s(self) -> float: ...

    @abstractmethod
    def fail(self, rid: str, err: BaseException) -> None:
        """The step failed `rid` alone; it is out of the scheduler and counted: tell its client."""

    def before_postprocess(self, batch: ScheduledBatch, failed: dict[str, BaseException]) -> None:
        """Between run and postprocess, which releases finished requests' pages (prefill holds
        them for the transfer)."""

    @abstractmethod
    def postprocess(self, outputs: dict[str, StepOutput]) -> None:
        """Hand the step's output to its requests."""

    @abstractmethod
    def snapshot(self) -> EngineStats: ...

    @abstractmethod
    def fail_all(self) -> None: ...
