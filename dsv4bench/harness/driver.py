"""The async driver: the thin, impure interpreter between sessions and the server.

A run has three phases, as a Jepsen test does:
1. Load: a closed pool of `concurrency` sessions, or an open Poisson arrival of `rate`
   sessions per second, over one shared httpx client, every turn recorded into the history as
   it happens; the nemesis kills on its schedule, and the ServerWatch (server_watch.py) scrapes
   the --metrics endpoints and polls /health throughout.
2. Drain: the load has stopped; the watch keeps scraping until the queues empty or
   --drain-timeout passes.
3. Final checks: each server by its role (/health, /health_generate, a canary), and a last
   scrape. run.py judges what the watch saw.

Everything the driver decides is delegated: the session says what to send, the checkers say
what is wrong, the nemesis says whom to kill and when. Each in-flight turn runs in its own
cancel scope; a nemesis kill cancels it, which closes the HTTP stream (the connection drops as
a killed agent's would), and the turn is recorded `killed` with its timings and partial response.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import anyio
import httpx

from dsv4bench.agents import family_for_session
from dsv4bench.checks import run_checks
from dsv4bench.checks.parser_view import kept_oracles
from dsv4bench.wire.client import chat_turn
from dsv4bench.harness.config import RunConfig, triage_limit
from dsv4bench.history.run_folder import HistoryWriter
from dsv4bench.loop.lag_clock import LoopWatch
from dsv4bench.harness.nemesis import Nemesis, Slot, parse_kill_spec
from dsv4bench.harness.server_watch import RawNotOffered, ServerWatch, raw_completion
from dsv4bench.loop.paced_collector import paced_collection
from dsv4bench.harness.progress import LiveStats
from dsv4bench.history.records import Timings, TurnStatus, Verdict
from dsv4bench.harness.recheck import RecheckKeep
from dsv4bench.harness.reference_run import ReferenceAnswers
from dsv4bench.harness.triage import FindingKeep
from dsv4bench.harness.session import AgentSession, EndReason, request_summary
from dsv4bench.wire.transport import AiohttpTransport
from dsv4bench.wire.turn_answer import Deadlines, TurnOutcome, TurnProbe
from dsv4bench.harness.turn_judge import turn_context, turn_headers, turn_record
from dsv4bench.loop.turn_lane import TurnLane

# Sessions are seeded from the run seed so two runs with one seed replay the same tasks.
_SEED_STRIDE = 100_000

T = TypeVar("T")


async def play_session(
    client: httpx.AsyncClient,
    base_url: str,
    sess: AgentSession,
    deadlines: Deadlines,
    on_turn: Callable[[TurnOutcome, list[Verdict]], None] | None = None,
) -> None:
    """Play one session to its end, a turn at a time, each turn judged by the checkers. The
    loop of the tools that need no kills, history or run statistics (scripts/eval_engine.py,
    scripts/onpolicy_corpus.py); `on_turn` sees each turn before the session takes it in."""
    while not sess.done:
        body = sess.next_request()
        outcome = await chat_turn(client, f"{base_url}/chat/completions", body, deadlines)
        verdicts, _ = run_checks(turn_context(sess, body, outcome))
        if on_turn is not None:
            on_turn(outcome, verdicts)
        sess.observe(outcome.status, outcome.response, verdicts)


# A world's build runs step after step in one lane section until it has held the section this
# long: a step is ~0.2 ms, and the lane hands over once a loop pass, so a section a step made a
# world wait for 10-20 passes (bench-plan.md, "The ramp").
BUILD_SECTION_S = 0.001
# Worlds built at once, their sections taking the lane in turn (see `building`).
BUILDS_AT_ONCE = 4
# Sessions a closed pool starts per loop pass (a task each, some 20 µs: under a millisecond).
START_BATCH = 32


# NOTE: spelled out, not agents.base.Steps[T]: mypy reads dsv4bench.agents as Any, and Any[T] binds no T.
async def in_lane_steps(
    lane: TurnLane,
    steps: Generator[None, None, T],
    stop: Callable[[], bool],
    clock: Callable[[], float] = time.perf_counter,
) -> T | None:
    """What `steps` builds, in lane sections of up to BUILD_SECTION_S each (by `clock`), served
    before the turns waiting (TurnLane's `first`). A session's world built in one section held
    the loop ~3 ms (ops) or ~1.5 ms (data). None, the rest left unbuilt, when `stop()` holds
    between two sections (the load stopped while this session waited for the lane). A
    cancellation lands between two sections too, unlike the lane's own wait: what it cuts off
    is a build, no finished turn's record."""
    try:
        while True:
            async with lane.turn(first=True):
                began = clock()
                try:
                    while True:
                        next(steps)
                        if clock() - began >= BUILD_SECTION_S:
                            break
                except StopIteration as done:
                    return done.value
            if stop():
                return None
            await anyio.lowlevel.checkpoint_if_cancelled()
    finally:
        steps.close()  # a build left off: its generator ends here, not when collected


def session_seed(run_seed: int, index: int) -> int:
    return run_seed * _SEED_STRIDE + index


def make_client(config: RunConfig) -> httpx.AsyncClient:
    """One client for the whole run, with a pool sized to the concurrency."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    # NOTE: idle connections expire well before uvicorn's 5 s keep-alive (SGLang's default), so
    # the pool never reuses a socket the server is closing: that race reads as a connection_error.
    limits = httpx.Limits(
        max_connections=config.concurrency + 8, max_keepalive_connections=config.concurrency + 8, keepalive_expiry=2.0
    )
    # httpx's own timeouts are a backstop only: the turn deadlines are enforced in chat_turn, on
    # the run's listening clock (loop/lag_clock.py). A connect the harness's own stall held up must
    # not fail sooner than the turn's TTFT deadline would, as a 10 s connect limit did at 2,000
    # sessions starting together: the harness's overload recorded as the server's connection_error.
    timeout = httpx.Timeout(
        connect=config.ttft_timeout + 5, read=config.total_timeout + 5, write=30.0, pool=config.total_timeout + 5
    )
    return httpx.AsyncClient(headers=headers, timeout=timeout, trust_env=False, transport=AiohttpTransport(limits))


class AgentRun:
    """Drives all the sessions of one run and writes their history."""

    def __init__(
        self,
        config: RunConfig,
        model: str,
        history: HistoryWriter,
        stats: LiveStats,
        run_id: str,
        context_tokens: int | None = None,
        reference: ReferenceAnswers | None = None,
        family: str | None = None,
        cache_tiers: bool = False,
    ) -> None:
        """`cache_tiers`: ask each turn where its cached prompt tokens came from (an SGLang
        server's `return_cached_tokens_details`; only SGLang's kinds are asked it)."""
        self.config = config
        self.family = family  # the server's model family (families.family_of_server); None: every family
        self.reference = reference
        self.history = history
        self.stats = stats
        self.run_id = run_id
        self.model = model
        self.session_config = config.session_config(model, config.context_length or context_tokens, cache_tiers)
        self.deadlines = config.deadlines
        self._next_index = 0
        self._stop_at: float | None = None
        self.nemesis: Nemesis | None = None
        self.watch = ServerWatch(config, model, history)
        self.clock = LoopWatch()
        self.lane = TurnLane()
        # A few worlds built at a time, their sections through the lane: sessions started together
        # then start a few at a time. All built side by side, every world would finish at about
        # the same moment and the first requests leave in one burst.
        self.building = anyio.Semaphore(BUILDS_AT_ONCE)
        self.raw_not_offered = RawNotOffered(history)  # --raw not offered for the family: said once, recorded
        # Requests kept for after the load, alone (alone.py): findings to triage, turns to recheck.
        self.findings = FindingKeep(triage_limit(config.triage))
        self.recheck = RecheckKeep(config.recheck, config.seed)

    async def run(self) -> None:
        """The three phases: load, drain, final checks."""
        c = self.config
        self.stats.sessions_target = c.sessions
        self.stats.duration_s = c.duration
        self._stop_at = time.monotonic() + c.duration if c.duration else None
        self.history.event("run_start", run=self.run_id)
        started = anyio.current_time()
        async with make_client(c) as client, anyio.create_task_group() as background:
            self.client = client
            self.nemesis = nemesis = Nemesis(
                [parse_kill_spec(k) for k in c.kill], c.seed, self._nemesis_event, client, c.base_url
            )
            self.watch.start(background, client)
            clock_scope, nemesis_scope = anyio.CancelScope(), anyio.CancelScope()
            background.start_soon(self._run_in, clock_scope, self.clock.run)
            if c.kill:
                background.start_soon(self._run_in, nemesis_scope, lambda: nemesis.run(started))
            with paced_collection(background):
                await self._load()
            nemesis_scope.cancel()  # the load is over: nothing left to kill
            clock_scope.cancel()
            self.history.event("harness_clock", **self.clock.as_event())
            await self.watch.drain()
            await self.watch.final_checks(client)
            background.cancel_scope.cancel()  # the monitors and health polls stop

    async def _load(self) -> None:
        """Phase 1: every session, a closed pool or Poisson arrivals, until the sessions are
        played, the time is up or a kill-all ended the load."""
        async with anyio.create_task_group() as tg:
            if self.config.rate is None:
                for i in range(self.config.concurrency):
                    tg.start_soon(self._worker)
                    # START_BATCH sessions started per loop pass, with the I/O of those already
                    # started in between: thousands at once would hold the loop. Their worlds are
                    # built in the lane.
                    if i % START_BATCH == START_BATCH - 1:
                        await anyio.sleep(0)
            else:
                tg.start_soon(self._arrivals, tg)

    def _nemesis_event(self, kind: str, **fields: Any) -> None:
        if kind == "kill":
            self.stats.kills += len(fields.get("sessions") or [])
        self.history.event(kind, **fields)

    @staticmethod
    async def _run_in(scope: anyio.CancelScope, fn: Callable[[], Any]) -> None:
        with scope:
            await fn()

    def _take_index(self) -> int | None:
        """The next session to start, or None when the run has started all it should."""
        if self._time_up():
            return None
        if self.config.sessions is not None and self._next_index >= self.config.sessions:
            return None
        i = self._next_index
        self._next_index += 1
        return i

    def _time_up(self) -> bool:
        if self.nemesis is not None and self.nemesis.load_stopped:
            return True  # a kill-all without restart ends the load
        return self._stop_at is not None and time.monotonic() >= self._stop_at

    async def _worker(self) -> None:
        """Closed model: one slot that runs sessions back to back."""
        while (i := self._take_index()) is not None:
            await self.run_session(i)

    async def _arrivals(self, tg: anyio.abc.TaskGroup) -> None:
        """Open model: sessions arrive as a Poisson process; `concurrency` caps those in flight."""
        rng = random.Random(self.config.seed)
        limiter = anyio.CapacityLimiter(self.config.concurrency)

        async def one(i: int) -> None:
            async with limiter:
                await self.run_session(i)

        while (i := self._take_index()) is not None:
            tg.start_soon(one, i)
            await anyio.sleep(rng.expovariate(self.config.rate or 1.0))

    async def run_session(self, index: int) -> None:
        """One session; a nemesis kill with `restart` relaunches it as `<id>.r<attempt>`, same task."""
        attempt = 0
        while not self._time_up():
            sid = f"s{index:05d}" + (f".r{attempt}" if attempt else "")
            spec = (await self._attempt(index, sid, attempt)).killed_by
            if spec is None or not spec.restart or self._time_up():
                return
            attempt += 1
            self.history.event(
                "session_restart", session=sid, new_session=f"s{index:05d}.r{attempt}", attempt=attempt, spec=spec.text
            )

    async def _attempt(self, index: int, sid: str, attempt: int) -> Slot:
        assert self.nemesis is not None
        seed = session_seed(self.config.seed, index)
        family = family_for_session(self.config.scenario, index)
        async with self.building:
            built = AgentSession.in_steps(sid, family, seed, self.session_config)  # the world, in steps
            sess = await in_lane_steps(self.lane, built, self._time_up)
        if sess is None or self._time_up():  # the load stopped while this session waited for the lane: it never starts
            return Slot(sid)
        slot = self.nemesis.slots[sid] = Slot(sid)
        self.history.event("session_start", session=sid, scenario=family.name, seed=seed, attempt=attempt)
        self.stats.sessions_active += 1
        try:
            while not sess.done:
                if slot.killed_by is not None:
                    sess.stop(EndReason.KILLED)  # killed between turns
                    break
                if self._time_up():
                    sess.stop(EndReason.DURATION)
                    break
                await self._turn(sess, slot)
            return slot
        finally:
            del self.nemesis.slots[sid]
            self.stats.sessions_active -= 1
            self.stats.sessions_done += 1
            reason = sess.end_reason.value if sess.end_reason else "cancelled"
            self.history.event(
                "session_end", session=sess.session_id, reason=reason, turns=sess.turn, tool_calls=sess.tool_calls_run
            )

    async def _turn(self, sess: AgentSession, slot: Slot) -> None:
        async with self.lane.turn():
            body = sess.next_request()
        headers = turn_headers(self.run_id, sess)
        probe = slot.probe = TurnProbe()
        outcome: TurnOutcome | None = None
        with anyio.CancelScope() as scope:
            slot.scope = scope
            outcome = await chat_turn(
                self.client,
                f"{self.config.base_url}/chat/completions",
                body,
                self.deadlines,
                headers,
                probe,
                clock=self.clock,
            )
        slot.scope = slot.probe = None
        raw = None
        if (
            self.config.raw
            and outcome is not None
            and outcome.status is TurnStatus.OK
            and not scope.cancelled_caught
            and slot.killed_by is None
        ):
            raw = await raw_completion(
                self.client, self.config.base_url, body, headers, self.config.total_timeout, self.raw_not_offered
            )
        async with self.lane.turn():
            # NOTE: a kill that lands after the last byte but before the agent acts on the reply
            # (the turn returning, the raw request, the wait for the lane) cancels nothing; the
            # killed agent still never acts on that reply, so the turn is killed too.
            if outcome is None or scope.cancelled_caught or slot.killed_by is not None:
                outcome = _killed_outcome(outcome, probe, slot)
            t = outcome.timings
            t.harness_stall_ms = round(self.clock.stall_within(t.start_ns, t.end_ns or time.monotonic_ns()) * 1e3, 1)
            ctx = turn_context(sess, body, outcome, self.family)
            ctx.raw_completion = raw
            summary = request_summary(body, sess.keys)
            # NOTE: RunConfig allows --reference only at temperature 0, so every turn here is greedy.
            if self.reference is not None:
                ctx.reference = self.reference.get(summary["key"])
            verdicts, check_errors = run_checks(ctx)
            if ctx.reference is not None and outcome.status is TurnStatus.OK:
                summary["compared"] = True  # the reference sent this same request: judged against it
        # The record in a section of its own: the checks and the history's write were each about
        # 0.4 ms, and one section with both held the loop near a millisecond at 5,000 sessions.
        # The lane's entry is shielded, so the judged turn is recorded whatever is cancelled.
        async with self.lane.turn():
            if slot.killed_by is not None and outcome.status is not TurnStatus.KILLED:
                # The kill landed while the judged turn waited to be recorded: the agent has not
                # acted on the reply yet, so the turn is killed (the NOTE above), and unjudged.
                outcome = _killed_outcome(outcome, probe, slot)
                ctx = turn_context(sess, body, outcome, self.family)
                verdicts, check_errors = run_checks(ctx)  # a killed turn: none
                summary.pop("compared", None)
            if outcome.status is TurnStatus.OK:
                self.findings.note(headers, body, verdicts)
                self.recheck.note(headers, body, outcome.response, verdicts)
            rec = turn_record(self.run_id, sess, body, summary, outcome, verdicts, check_errors, kept_oracles(ctx))
            self.history.turn(rec)
            self.stats.add_turn(rec)
            sess.observe(outcome.status, outcome.response, verdicts)


def _killed_outcome(done: TurnOutcome | None, probe: TurnProbe, slot: Slot) -> TurnOutcome:
    """The outcome of a turn the nemesis killed (`done`: its outcome if it finished anyway):
    timings and the partial response kept, unjudged."""
    out = (
        done
        or probe.outcome
        or TurnOutcome(
            status=TurnStatus.KILLED, timings=Timings(start_wall_ns=time.time_ns(), start_ns=time.monotonic_ns())
        )
    )
    out.status = TurnStatus.KILLED
    out.error_kind = None
    out.error = f"killed by the nemesis ({slot.killed_by.text})" if slot.killed_by else "killed"
    if done is None:
        out.response = probe.assembler.response if probe.assembler is not None else None
    out.timings.end_ns = out.timings.end_ns or time.monotonic_ns()
    return out
