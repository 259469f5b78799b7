"""A turn judged and recorded, without the I/O: the headers that tag a turn's request, the
checkers' context of its outcome, and the TurnRecord that turns.jsonl keeps. The `agents`
driver (driver.py) and the Locust user (locust/user.py) both go through here, so a turn reads
the same in the history whichever played it.
"""

from __future__ import annotations

from typing import Any

from dsv4bench.families import family_for
from dsv4bench.history.records import GivenText, OracleReadings, TurnContext, TurnRecord, TurnStatus, Verdict
from dsv4bench.history.request_terms import RequestTerms
from dsv4bench.harness.session import AgentSession, request_summary
from dsv4bench.wire.turn_answer import TurnOutcome


def turn_headers(run_id: str, sess: AgentSession) -> dict[str, str]:
    """What tags the request of `sess`'s next turn (the bundled engine logs them)."""
    return {
        "X-Dsv4bench-Run": run_id,
        "X-Dsv4bench-Session": sess.session_id,
        "X-Dsv4bench-Turn": str(sess.turn),
        "X-Dsv4bench-Scenario": sess.family.name,
        "X-Dsv4bench-Seed": str(sess.seed),
    }


def offered_tools(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The request's tools as the checkers take them: name -> JSON Schema of its arguments."""
    tools: dict[str, dict[str, Any]] = {}
    listed = body.get("tools")
    for t in listed if isinstance(listed, list) else []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            tools[fn["name"]] = params if isinstance(params, dict) else {}
    return tools


def request_context(
    body: dict[str, Any],
    outcome: TurnOutcome,
    tools: dict[str, dict[str, Any]] | None = None,
    family: str | None = None,
) -> TurnContext:
    """What the checkers judge of the answer to `body`: what it offered and allowed (tools,
    tool_choice, thinking, stop...) and the text it gave the model are read from the body itself,
    so a request any client wrote (a proxied agent, a replayed capture) is judged as ours are.
    `tools`: the schemas where the caller has them already (a session's). `family`: the server's
    model family where the run knows it (its tool-call parser), else the model names say it."""
    terms = RequestTerms.of_body(body)
    served = outcome.response.model if outcome.response is not None else None
    return TurnContext(
        response=outcome.response,
        tools=offered_tools(body) if tools is None else tools,
        status=outcome.status,
        http_status=outcome.http_status,
        error=outcome.error,
        error_kind=outcome.error_kind,
        stream=bool(body.get("stream")),
        max_tokens=token_cap(body),
        thinking=terms.thinking,
        terms=terms,
        given=GivenText.of_body(body),
        family=family or family_for(models=(served, body.get("model") if isinstance(body.get("model"), str) else None)),
    )


def token_cap(body: dict[str, Any]) -> int | None:
    """The request's cap on completion tokens: `max_tokens`, else `max_completion_tokens` (an
    integer, else not known)."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def turn_context(
    sess: AgentSession, body: dict[str, Any], outcome: TurnOutcome, family: str | None = None
) -> TurnContext:
    """What the checkers judge of one of `sess`'s turns (`family`: the server's, where the run knows it)."""
    return request_context(body, outcome, sess.schemas, family)


def client_request_summary(body: dict[str, Any]) -> dict[str, Any]:
    """request_summary of a body a client wrote (any shape: the proxy's traffic, a capture's
    replay): what it cannot summarize is said, never raised."""
    try:
        return request_summary(body)
    except Exception as e:  # noqa: BLE001 - a client's odd body is recorded, never a crash
        return {"unsummarized": f"{type(e).__name__}: {e}"[:200], "stream": bool(body.get("stream"))}


def keeps_evidence(
    status: TurnStatus, verdicts: list[Verdict], check_errors: list[str], oracles: OracleReadings | None = None
) -> bool:
    """Whether a turn's record keeps its exact request and raw stream: one with findings, a
    checker that failed, parsers that read it differently, or an error (not a kill)."""
    return (
        bool(verdicts) or bool(check_errors) or oracles is not None or status not in (TurnStatus.OK, TurnStatus.KILLED)
    )


def turn_record(
    run_id: str,
    sess: AgentSession,
    body: dict[str, Any],
    summary: dict[str, Any],
    outcome: TurnOutcome,
    verdicts: list[Verdict],
    check_errors: list[str],
    oracles: OracleReadings | None,
) -> TurnRecord:
    """The history's record of the turn `sess` just played (before it observes the outcome)."""
    failing = keeps_evidence(outcome.status, verdicts, check_errors, oracles)
    if failing:
        summary["body"] = body  # the exact request, so the turn can be replayed and audited
    where = (run_id, sess.session_id, sess.turn, sess.family.name, sess.seed)
    return outcome_record(*where, outcome, summary, verdicts, check_errors, failing, oracles)


def outcome_record(
    run_id: str,
    session: str,
    turn: int,
    scenario: str,
    seed: int,
    outcome: TurnOutcome,
    summary: dict[str, Any],
    verdicts: list[Verdict],
    check_errors: list[str],
    failing: bool,
    oracles: OracleReadings | None = None,
) -> TurnRecord:
    """A turn's record from its outcome and judgement, as `agents`, `--replay` and the proxy write
    it: the raw stream kept only with a failing turn's evidence (keeps_evidence)."""
    return TurnRecord(
        run=run_id,
        session=session,
        turn=turn,
        scenario=scenario,
        seed=seed,
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
        oracles=oracles,
    )
