"""The async driver: the thin, impure interpreter between sessions and the server.

It runs a closed pool of `concurrency` sessions, or an open Poisson arrival of `rate`
sessions per second, over one shared httpx client, and records every turn into the
history as it happens. Everything it decides is delegated: the session says what to send,
the checkers say what is wrong, the nemesis says whom to kill and when.

Each in-flight turn runs in its own cancel scope; a nemesis kill cancels it, which closes the
HTTP stream (the connection drops as a killed agent's would), and the turn is recorded
`killed` with its timings and partial response. After the load stops, with --metrics, the
monitors keep scraping through the drain window (see `_drain`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx

from .agents import family_for_session
from .checks import run_checks
from .client import Deadlines, TurnOutcome, TurnProbe, chat_turn
from .config import RunConfig
from .history import HistoryWriter
from .canary import canary, health
from .preflight import root_of
from .roles import WORKERS, Role, discover_role
from .monitor import QUEUE_GAUGES, monitor, scrape_once
from .nemesis import Nemesis, Slot, parse_kill_spec
from .progress import LiveStats
from .records import Timings, TurnContext, TurnRecord, TurnStatus, Verdict
from .reference import ReferenceAnswers
from .session import AgentSession, EndReason, SessionConfig, request_summary

# Sessions are seeded from the run seed so two runs with one seed replay the same tasks.
_SEED_STRIDE = 100_000


async def play_session(client: httpx.AsyncClient, base_url: str, sess: AgentSession, deadlines: Deadlines,
                       on_turn: Callable[[TurnOutcome, list[Verdict]], None] | None = None) -> None:
    """Play one session to its end, a turn at a time, each turn judged by the checkers. The
    loop of the tools that need no kills, history or run statistics (scripts/eval_engine.py,
    scripts/onpolicy_corpus.py); `on_turn` sees each turn before the session takes it in."""
    while not sess.done:
        outcome = await chat_turn(client, f"{base_url}/chat/completions", sess.next_request(), deadlines)
        verdicts, _ = run_checks(TurnContext(response=outcome.response, tools=sess.schemas, status=outcome.status,
                                             http_status=outcome.http_status, error=outcome.error,
                                             error_kind=outcome.error_kind, thinking=sess.config.thinking))
        if on_turn is not None:
            on_turn(outcome, verdicts)
        sess.observe(outcome.status, outcome.response, verdicts)


def session_seed(run_seed: int, index: int) -> int:
    return run_seed * _SEED_STRIDE + index


def make_client(config: RunConfig) -> httpx.AsyncClient:
    """One client for the whole run, with a pool sized to the concurrency."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    # NOTE: idle connections expire well before uvicorn's 5 s keep-alive (SGLang's default), so
    # the pool never reuses a socket the server is closing: that race reads as a connection_error.
    limits = httpx.Limits(max_connections=config.concurrency + 8, max_keepalive_connections=config.concurrency + 8,
                          keepalive_expiry=2.0)
    # httpx's own timeouts are a backstop only: the turn deadlines are enforced in chat_turn.
    timeout = httpx.Timeout(connect=10.0, read=config.total_timeout + 5, write=30.0, pool=config.total_timeout + 5)
    return httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout, trust_env=False)


class AgentRun:
    """Drives all the sessions of one run and writes their history."""

    def __init__(self, config: RunConfig, model: str, history: HistoryWriter, stats: LiveStats, run_id: str,
                 context_tokens: int | None = None, reference: ReferenceAnswers | None = None) -> None:
        self.config = config
        self.reference = reference
        self.history = history
        self.stats = stats
        self.run_id = run_id
        self.model = model
        self.session_config = SessionConfig(
            model=model,
            max_turns=config.max_turns,
            thinking=config.thinking,
            stream=config.stream,
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            on_corrupt=config.on_corrupt,
            context_tokens=config.context_length or context_tokens,
        )
        self.deadlines = Deadlines(ttft_s=config.ttft_timeout, total_s=config.total_timeout)
        self._next_index = 0
        self._stop_at: float | None = None
        self.nemesis: Nemesis | None = None
        self.samples: list[dict[str, Any]] = []  # every metrics sample of the run, for the wedge check
        self._latest: dict[str, dict[str, Any]] = {}  # endpoint -> its latest sample
        self.load_stopped_ns: int | None = None  # monotonic ns when the load stopped (drain start)
        self.health: list[dict[str, Any]] = []  # /health after the drain window
        self.canaries: list[dict[str, Any]] = []
        self._roles: dict[str, Role] = {}  # server root -> its role, as it stated it

    async def run(self) -> None:
        c = self.config
        self.stats.sessions_target = c.sessions
        self.stats.duration_s = c.duration
        self._stop_at = time.monotonic() + c.duration if c.duration else None
        self.history.event("run_start", run=self.run_id)
        started = anyio.current_time()
        async with make_client(c) as client, anyio.create_task_group() as monitors:
            self.client = client
            self.nemesis = Nemesis([parse_kill_spec(k) for k in c.kill], c.seed, self._nemesis_event, client, c.base_url)
            if c.metrics:
                monitors.start_soon(monitor, list(c.metrics), self._write_sample, c.metrics_interval, None,
                                     c.api_key)
                monitors.start_soon(self._poll_health, client)
            nemesis_scope = anyio.CancelScope()
            if c.kill:
                monitors.start_soon(self._run_nemesis, nemesis_scope, started)
            async with anyio.create_task_group() as tg:
                if c.rate is None:
                    for _ in range(c.concurrency):
                        tg.start_soon(self._worker)
                else:
                    tg.start_soon(self._arrivals, tg)
            nemesis_scope.cancel()  # the load is over: nothing left to kill
            if c.metrics:
                await self._drain()
            else:
                self.load_stopped_ns = time.monotonic_ns()
                self.history.event("load_stopped", t_ns=self.load_stopped_ns, drain_timeout_s=0)
            await self._after_drain_checks(client)
            # One last sample of every endpoint after the load, then the monitors stop.
            for ep in c.metrics:
                self._write_sample(await scrape_once(client, ep, timeout=5.0))
            monitors.cancel_scope.cancel()

    def _nemesis_event(self, kind: str, **fields: Any) -> None:
        if kind == "kill":
            self.stats.kills += len(fields.get("sessions") or [])
        self.history.event(kind, **fields)

    async def _run_nemesis(self, scope: anyio.CancelScope, started: float) -> None:
        assert self.nemesis is not None
        with scope:
            await self.nemesis.run(started)

    def _write_sample(self, sample: dict[str, Any]) -> None:
        self.history.metrics.write(sample)
        self.samples.append(sample)
        self._latest[sample["endpoint"]] = sample

    def _queues_empty(self) -> bool:
        """Every endpoint's latest sample (taken after the load stopped) has all queue gauges at 0."""
        for ep in self.config.metrics:
            s = self._latest.get(ep)
            if s is None or not s.get("ok") or s["t_ns"] < (self.load_stopped_ns or 0):
                return False
            if any(v != 0 for k, v in s.get("values", {}).items() if k.split("{", 1)[0] in QUEUE_GAUGES):
                return False
        return True

    def _server_roots(self) -> list[str]:
        """The root of every server the run touches: the target's and each /metrics endpoint's."""
        return sorted({root_of(self.config.base_url)} | {root_of(m.rsplit("/metrics", 1)[0]) for m in self.config.metrics})

    async def _role(self, client: httpx.AsyncClient, root: str) -> Role:
        """The server's role, asked once and kept; its latest scrape fills in where it states none."""
        role = self._roles.get(root)
        if role is None or not role.known:
            scraped = next((s.get("values") for m, s in self._latest.items()
                            if root_of(m.rsplit("/metrics", 1)[0]) == root and s.get("ok")), None)
            role = await discover_role(client, root, timeout=5.0, metrics=scraped)
            self._roles[root] = role
        return role

    async def _poll_health(self, client: httpx.AsyncClient) -> None:
        """/health of every server on the metrics interval, as events: a slow or dead endpoint
        is a sample with status None, never an error of the run."""
        while True:
            for root in self._server_roots():
                h = await health(client, root, timeout=max(1.0, self.config.metrics_interval))
                self.health.append(h)
                self.history.event("health", **h)
            await anyio.sleep(self.config.metrics_interval)

    async def _after_drain_checks(self, client: httpx.AsyncClient) -> None:
        """After the drain window, each server by its role (DESIGN §7): /health of every server,
        /health_generate of a prefill or decode server (they take no chat), and one canary
        against the target unless it is one of those. A canary that hangs while /health says
        200 is the incident's `health_lies`; one answered with an error is an error of the
        check, recorded as such (canary.py), never a hang."""
        roles: dict[str, Role] = {}

        async def ask(root: str) -> None:
            roles[root] = await self._role(client, root)

        async with anyio.create_task_group() as tg:  # a server that does not answer costs one timeout
            for root in self._server_roots():
                tg.start_soon(ask, root)
        for root in self._server_roots():
            role = roles[root]
            paths = ("/health", "/health_generate") if role.name in WORKERS else ("/health",)
            for path in paths:
                h = await health(client, root, path)
                self.health.append(h)
                self.history.event("health", **h, role=role.name)
        target = roles.get(root_of(self.config.base_url)) or Role()
        if target.name in WORKERS:
            self.history.event("canary_skipped", endpoint=self.config.base_url, role=target.name,
                               reason=f"the target is a {target.name} server ({target.source}): it takes no chat")
            return
        c = await canary(client, self.config.base_url, self.model, timeout=self.config.canary_timeout)
        self.canaries.append(c)
        self.history.event("canary", **c, role=target.name)

    async def _drain(self) -> None:
        """Keep the monitors scraping up to drain_timeout after the load stopped, or until the queues empty."""
        self.load_stopped_ns = time.monotonic_ns()
        self.history.event("load_stopped", t_ns=self.load_stopped_ns, drain_timeout_s=self.config.drain_timeout)
        deadline = anyio.current_time() + self.config.drain_timeout
        reason = "timeout"
        while (left := deadline - anyio.current_time()) > 0:
            await anyio.sleep(min(left, self.config.metrics_interval / 2))
            if self._queues_empty():
                reason = "queues_empty"
                break
        drain_s = (time.monotonic_ns() - self.load_stopped_ns) / 1e9
        self.history.event("drain_end", reason=reason, drain_s=round(drain_s, 3))

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
            self.history.event("session_restart", session=sid, new_session=f"s{index:05d}.r{attempt}",
                               attempt=attempt, spec=spec.text)

    async def _attempt(self, index: int, sid: str, attempt: int) -> Slot:
        assert self.nemesis is not None
        seed = session_seed(self.config.seed, index)
        family = family_for_session(self.config.scenario, index)
        sess = AgentSession(sid, family, seed, self.session_config)
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
        body = sess.next_request()
        headers = {
            "X-Dsv4bench-Run": self.run_id,
            "X-Dsv4bench-Session": sess.session_id,
            "X-Dsv4bench-Turn": str(sess.turn),
            "X-Dsv4bench-Scenario": sess.family.name,
            "X-Dsv4bench-Seed": str(sess.seed),
        }
        probe = slot.probe = TurnProbe()
        outcome: TurnOutcome | None = None
        with anyio.CancelScope() as scope:
            slot.scope = scope
            outcome = await chat_turn(self.client, f"{self.config.base_url}/chat/completions", body, self.deadlines,
                                      headers, probe)
        slot.scope = slot.probe = None
        # NOTE: a kill that lands after the last byte but before the turn returns cancels
        # nothing; the killed agent still never acts on that reply, so the turn is killed too.
        if outcome is None or scope.cancelled_caught or slot.killed_by is not None:
            outcome = _killed_outcome(outcome, probe, slot)
        ctx = TurnContext(
            response=outcome.response,
            tools=sess.schemas,
            status=outcome.status,
            http_status=outcome.http_status,
            error=outcome.error,
            error_kind=outcome.error_kind,
            stream=bool(body.get("stream")),
            max_tokens=body.get("max_tokens"),
            thinking=self.config.thinking,
            tool_choice=str(body.get("tool_choice", "auto")),
        )
        if self.config.raw and outcome.status is TurnStatus.OK and slot.killed_by is None:
            ctx.raw_completion = await self._raw_completion(body, headers)
        summary = request_summary(body)
        # NOTE: RunConfig allows --reference only at temperature 0, so every turn here is greedy.
        if self.reference is not None:
            ctx.reference = self.reference.get(summary["key"])
        verdicts, check_errors = run_checks(ctx)
        if ctx.reference is not None and outcome.status is TurnStatus.OK:
            summary["compared"] = True  # the reference sent this same request: judged against it
        rec = self._record(sess, body, summary, outcome, verdicts, check_errors)
        self.history.turn(rec)
        self.stats.add_turn(rec)
        sess.observe(outcome.status, outcome.response, verdicts)

    def _record(self, sess: AgentSession, body: dict[str, Any], summary: dict[str, Any], outcome: TurnOutcome,
                verdicts: list, check_errors: list[str]) -> TurnRecord:
        failing = bool(verdicts) or bool(check_errors) or outcome.status not in (TurnStatus.OK, TurnStatus.KILLED)
        if failing:
            summary["body"] = body  # the exact request, so the turn can be replayed and audited
        return TurnRecord(
            run=self.run_id,
            session=sess.session_id,
            turn=sess.turn,
            scenario=sess.family.name,
            seed=sess.seed,
            status=outcome.status,
            timings=outcome.timings,
            http_status=outcome.http_status,
            error=outcome.error,
            error_kind=outcome.error_kind,
            request=summary,
            response=outcome.response,
            verdicts=verdicts,
            raw_sse=outcome.raw_lines if failing else None,
            check_errors=check_errors,
        )

    async def _raw_completion(self, body: dict[str, Any], headers: dict[str, str]) -> str | None:
        """The --raw oracle: the same conversation as a raw prompt to /v1/completions."""
        from .checks.oracle import render_prompt

        try:
            prompt = render_prompt(body)
            resp = await self.client.post(
                f"{self.config.base_url}/completions",
                # Special tokens must survive: the oracle parses </think> and the DSML markers itself.
                json={"model": body["model"], "prompt": prompt, "max_tokens": body.get("max_tokens"),
                      "temperature": 0.0, "stream": False, "skip_special_tokens": False},
                headers=headers,
                timeout=self.config.total_timeout,
            )
            if resp.status_code >= 400:
                return None
            return str(resp.json()["choices"][0]["text"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return None  # no oracle for this turn; the chat turn is still judged


def _killed_outcome(done: TurnOutcome | None, probe: TurnProbe, slot: Slot) -> TurnOutcome:
    """The outcome of a turn the nemesis killed (`done`: its outcome if it finished anyway):
    timings and the partial response kept, unjudged."""
    out = done or probe.outcome or TurnOutcome(status=TurnStatus.KILLED,
                                       timings=Timings(start_wall_ns=time.time_ns(), start_ns=time.monotonic_ns()))
    out.status = TurnStatus.KILLED
    out.error_kind = None
    out.error = f"killed by the nemesis ({slot.killed_by.text})" if slot.killed_by else "killed"
    if done is None:
        out.response = probe.assembler.response if probe.assembler is not None else None
    out.timings.end_ns = out.timings.end_ns or time.monotonic_ns()
    return out
