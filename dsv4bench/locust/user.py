"""The agent user: each loop of a Locust user plays one whole multi-turn session on the sans-IO
session core, as `agents` does: the same scenarios, seeds, tools and checkers, every turn
recorded into the run's history (recorder.py) and reported to Locust's statistics:

- each turn is a request of type TURN named by its scenario and kind (`coding: task`,
  `coding: tool results`, `coding: nudge`), its response time the turn's end-to-end time;
- its time to first token is a request of type TTFT named by the scenario;
- a turn with verdict codes, an HTTP error or a timeout is a failure whose message names the
  codes (or the error) and the session and turn, so Locust's failures tab lists corruption by
  code;
- a turn cut short because the user was stopped (a kill storm, a stop in the web UI) is
  recorded `killed` with what had arrived, and reported as type KILLED, never as a failure.
"""

from __future__ import annotations

import time

import httpx
from gevent import GreenletExit
from locust import User, constant, task
from locust.env import Environment

from dsv4bench.agents import family_for_session
from dsv4bench.checks import run_checks
from dsv4bench.checks.parser_view import kept_oracles
from dsv4bench.history.records import TurnRecord, TurnStatus
from dsv4bench.harness.session import AgentSession, EndReason, request_summary
from dsv4bench.report.counting import turn_codes
from dsv4bench.wire.turn_answer import TurnOutcome, TurnProbe
from dsv4bench.harness.turn_judge import turn_context, turn_headers, turn_record
from dsv4bench.locust.recorder import LocustRun, current
from dsv4bench.locust.turn import chat_turn


class TurnFailure(Exception):
    """What Locust's failures tab shows for a turn: its codes or error, its session and turn."""

    def __repr__(self) -> str:  # Locust's failures tab shows the repr: the message alone reads best
        return str(self)


def turn_kind(sess: AgentSession) -> str:
    """What the next request answers: the task, the last turn's tool results, or a nudge after
    an unusable reply."""
    if sess.turn == 0:
        return "task"
    return "tool results" if sess.messages[-1].get("role") == "tool" else "nudge"


class AgentUser(User):
    """One agent at a time per user: a session played to its end, then the next."""

    wait_time = constant(0)

    def on_start(self) -> None:
        run = current()
        c = run.plan.config
        headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else {}
        # httpx's own timeouts are a backstop only: the turn deadlines are enforced in chat_turn.
        timeout = httpx.Timeout(connect=10.0, read=c.total_timeout + 5, write=30.0, pool=c.total_timeout + 5)
        self.client = httpx.Client(
            headers=headers,
            timeout=timeout,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=1, keepalive_expiry=2.0),
        )

    def on_stop(self) -> None:
        self.client.close()

    @task
    def session(self) -> None:
        run = current()
        plan = run.plan
        index = run.next_session_index()
        sid = run.session_id(index)
        family = family_for_session(plan.config.scenario, index)
        sess = AgentSession(sid, family, run.session_seed(index), plan.session_config)
        run.event("session_start", session=sid, scenario=family.name, seed=sess.seed, attempt=0)
        try:
            while not sess.done:
                self._turn(run, sess)
        except GreenletExit:
            sess.stop(EndReason.KILLED)
            raise
        finally:
            run.event(
                "session_end",
                session=sid,
                reason=sess.end_reason.value if sess.end_reason else "cancelled",
                turns=sess.turn,
                tool_calls=sess.tool_calls_run,
            )

    def _turn(self, run: LocustRun, sess: AgentSession) -> None:
        plan = run.plan
        kind = turn_kind(sess)
        body = sess.next_request()
        probe = TurnProbe()
        try:
            outcome = chat_turn(
                self.client,
                f"{plan.config.base_url}/chat/completions",
                body,
                plan.config.deadlines,
                turn_headers(run.run_id, sess),
                probe,
            )
        except GreenletExit:
            self._killed(run, sess, body, probe, kind)
            raise
        ctx = turn_context(sess, body, outcome)
        verdicts, check_errors = run_checks(ctx)
        rec = turn_record(
            run.run_id, sess, body, request_summary(body, sess.keys), outcome, verdicts, check_errors, kept_oracles(ctx)
        )
        run.turn(rec)
        _report(self.environment, rec, kind)
        sess.observe(outcome.status, outcome.response, verdicts)

    def _killed(self, run: LocustRun, sess: AgentSession, body: dict, probe: TurnProbe, kind: str) -> None:
        """The user was stopped mid-turn: what had arrived is kept, unjudged, as a killed turn."""
        outcome = probe.outcome or TurnOutcome.starting()
        outcome.status, outcome.error_kind = TurnStatus.KILLED, None
        outcome.error = "killed: the Locust user was stopped"
        if probe.assembler is not None:
            outcome.response = probe.assembler.response
        outcome.timings.end_ns = outcome.timings.end_ns or time.monotonic_ns()
        rec = turn_record(run.run_id, sess, body, request_summary(body, sess.keys), outcome, [], [], None)
        run.turn(rec)
        _report(self.environment, rec, kind)


def _report(environment: Environment, rec: TurnRecord, kind: str) -> None:
    """The turn into Locust's statistics (module docstring)."""
    t = rec.timings
    elapsed_ms = ((t.end_ns or t.start_ns) - t.start_ns) / 1e6
    length = len(rec.response.content or "") if rec.response else 0
    fire = environment.events.request.fire
    if rec.status is TurnStatus.KILLED:
        fire(
            request_type="KILLED",
            name=rec.scenario,
            response_time=elapsed_ms,
            response_length=length,
            exception=None,
            context={"session": rec.session, "turn": rec.turn},
        )
        return
    failure = None
    if codes := turn_codes(rec):
        failure = TurnFailure(f"{', '.join(codes)}: session {rec.session} turn {rec.turn}")
    elif rec.status is not TurnStatus.OK:
        failure = TurnFailure(f"{rec.error or rec.status.value}: session {rec.session} turn {rec.turn}")
    fire(
        request_type="TURN",
        name=f"{rec.scenario}: {kind}",
        response_time=elapsed_ms,
        response_length=length,
        exception=failure,
        context={"session": rec.session, "turn": rec.turn},
    )
    if (ttft := t.ttft_s) is not None:
        fire(
            request_type="TTFT",
            name=rec.scenario,
            response_time=ttft * 1e3,
            response_length=0,
            exception=None,
            context={"session": rec.session, "turn": rec.turn},
        )
