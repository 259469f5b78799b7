"""The async driver: the thin, impure interpreter between sessions and the server.

It runs a closed pool of `concurrency` sessions, or an open Poisson arrival of `rate`
sessions per second, over one shared httpx client, and records every turn into the
history as it happens. Everything it decides is delegated: the session says what to send,
the checkers say what is wrong.
"""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
import httpx

from .agents import family_for_session
from .checks import run_checks
from .client import Deadlines, TurnOutcome, chat_turn
from .config import RunConfig
from .history import HistoryWriter
from .monitor import monitor, scrape_once
from .progress import LiveStats
from .records import TurnContext, TurnRecord, TurnStatus
from .session import AgentSession, EndReason, SessionConfig, request_summary

# Sessions are seeded from the run seed so two runs with one seed replay the same tasks.
_SEED_STRIDE = 100_000


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

    def __init__(self, config: RunConfig, model: str, history: HistoryWriter, stats: LiveStats, run_id: str) -> None:
        self.config = config
        self.history = history
        self.stats = stats
        self.run_id = run_id
        self.session_config = SessionConfig(
            model=model,
            max_turns=config.max_turns,
            thinking=config.thinking,
            stream=config.stream,
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            on_corrupt=config.on_corrupt,
        )
        self.deadlines = Deadlines(ttft_s=config.ttft_timeout, total_s=config.total_timeout)
        self._next_index = 0
        self._stop_at: float | None = None

    async def run(self) -> None:
        c = self.config
        self.stats.sessions_target = c.sessions
        self.stats.duration_s = c.duration
        self._stop_at = time.monotonic() + c.duration if c.duration else None
        self.history.event("run_start", run=self.run_id)
        async with make_client(c) as client, anyio.create_task_group() as monitors:
            self.client = client
            if c.metrics:
                monitors.start_soon(monitor, list(c.metrics), self.history.metrics.write, c.metrics_interval)
            async with anyio.create_task_group() as tg:
                if c.rate is None:
                    for _ in range(c.concurrency):
                        tg.start_soon(self._worker)
                else:
                    tg.start_soon(self._arrivals, tg)
            # One last sample of every endpoint after the load, then the monitors stop.
            for ep in c.metrics:
                self.history.metrics.write(await scrape_once(client, ep, timeout=5.0))
            monitors.cancel_scope.cancel()

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
        seed = session_seed(self.config.seed, index)
        family = family_for_session(self.config.scenario, index)
        sess = AgentSession(f"s{index:05d}", family, seed, self.session_config)
        self.history.event("session_start", session=sess.session_id, scenario=family.name, seed=seed)
        self.stats.sessions_active += 1
        try:
            while not sess.done:
                if self._time_up():
                    sess.stop(EndReason.DURATION)
                    break
                await self._turn(sess)
        finally:
            self.stats.sessions_active -= 1
            self.stats.sessions_done += 1
            reason = sess.end_reason.value if sess.end_reason else "cancelled"
            self.history.event(
                "session_end", session=sess.session_id, reason=reason, turns=sess.turn, tool_calls=sess.tool_calls_run
            )

    async def _turn(self, sess: AgentSession) -> None:
        body = sess.next_request()
        headers = {
            "X-Dsv4bench-Run": self.run_id,
            "X-Dsv4bench-Session": sess.session_id,
            "X-Dsv4bench-Turn": str(sess.turn),
            "X-Dsv4bench-Scenario": sess.family.name,
            "X-Dsv4bench-Seed": str(sess.seed),
        }
        outcome = await chat_turn(self.client, f"{self.config.base_url}/chat/completions", body, self.deadlines, headers)
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
        if self.config.raw and outcome.status is TurnStatus.OK:
            ctx.raw_completion = await self._raw_completion(body, headers)
        verdicts, check_errors = run_checks(ctx)
        rec = self._record(sess, body, outcome, verdicts, check_errors)
        self.history.turn(rec)
        self.stats.add_turn(rec)
        sess.observe(outcome.status, outcome.response, verdicts)

    def _record(self, sess: AgentSession, body: dict[str, Any], outcome: TurnOutcome, verdicts: list, check_errors: list[str]) -> TurnRecord:
        failing = bool(verdicts) or bool(check_errors) or outcome.status is not TurnStatus.OK
        summary = request_summary(body)
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
