"""Reproduce alone (--triage): after the load, does each finding happen with nothing else in flight?

The load is over and drained. For each distinct finding (the exact request of a turn a checker
found corrupt, kept in memory by the driver: `FindingKeep`), the request is sent again alone
TRIAGE_REPEATS times, greedy as it was, then once "cold": with a nonce that defeats the prefix
cache (`cold_body`). Each answer is judged by the same checkers as the run's turns, and the
finding is classed (`classify`):

- deterministic: every alone answer and the cold one show it again: the model, the chat
  template or the parser; with --raw, the raw oracle's reading of the alone answer says which
  (it disagrees with the server's parser: the parser; it agrees: the model or template);
- cache_state: it shows again alone, from the cache the load left (the prefix as cached), and
  never cold: the cached state is wrong (a stale or raced cache entry, a host-tier load);
- cold_path: never from the cache, only cold (the full prefill path, which the cache hid);
- intermittent: alone, some of the sends only, cold or not: a race even without load;
- load_dependent: never alone: batching, a race, a cache under pressure.

Before any class, the server must be deterministic at temperature 0 (`probe_determinism`): one
kept request with a fresh nonce is sent once (cold), then twice more (warm, from the cache the
first send filled); the two warm answers must agree. If they do not, the report says so and no
finding is classed: on such a server "not alone" would mean nothing. A cold answer that differs
from the warm ones is evidence of cache state, kept beside the verdict, not a lack of determinism.

Bounded: `--triage auto` takes up to TRIAGE_AUTO_LIMIT findings (config.py), `--triage N` up to N, chosen to
cover every (code, scenario) first; everything sent after the load stops at AFTER_LOAD_CAP_S.
Each request is an `alone_request` event in events.jsonl (so the history shows the traffic),
never a turn: the run's turn totals do not count it. The block goes to run.json's `triage`.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from dsv4bench.checks import run_checks
from dsv4bench.harness.reference_run import is_greedy, request_key
from dsv4bench.harness.server_watch import raw_completion
from dsv4bench.harness.turn_judge import request_context
from dsv4bench.history.codes import ANSWER_CHANGED_CODE, CORRUPTION_CODES, ORACLE_CODE, REFERENCE_CODE
from dsv4bench.history.records import ReferenceAnswer, TurnStatus, Verdict
from dsv4bench.history.run_folder import HistoryWriter
from dsv4bench.wire.client import chat_turn
from dsv4bench.wire.turn_answer import Deadlines, TurnOutcome

TRIAGE_REPEATS = 3  # alone sends of each finding's request
AFTER_LOAD_CAP_S = 120.0  # everything triage and recheck send after the load, together
ALONE_EVENT = "alone_request"
# Tags every request sent after the load (triage, recheck, persistence) with why it was sent.
ALONE_HEADER = "X-Dsv4bench-Alone"
# Codes judged against another answer, not by the checkers alone: a resend cannot show them again
# by itself (recheck.py classes its own findings).
_NOT_TRIAGED = frozenset({REFERENCE_CODE, ANSWER_CHANGED_CODE})

DETERMINISTIC, CACHE_STATE, COLD_PATH = "deterministic", "cache_state", "cold_path"
INTERMITTENT, LOAD_DEPENDENT, NOT_CLASSED = "intermittent", "load_dependent", "not_classed"


def kept_body(body: dict[str, Any]) -> dict[str, Any]:
    """A request as sent, safe to keep: the session appends to its own message list later."""
    messages = body.get("messages")
    return {**body, "messages": list(messages)} if isinstance(messages, list) else dict(body)


def cold_body(body: dict[str, Any], nonce: str) -> dict[str, Any]:
    """`body` with a unique first line that no cached prefix can match: the system message's
    content begins with it, or a system message holding it comes first. Everything after the
    nonce is recomputed, so a server's prefix cache cannot serve any of the prompt."""
    mark = f"[dsv4bench triage {nonce}]"
    messages = list(body.get("messages") or [])
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
        messages[0] = {**first, "content": f"{mark}\n{first['content']}"}
    else:
        messages.insert(0, {"role": "system", "content": mark})
    return {**body, "messages": messages}


@dataclass
class Kept:
    """A turn of the run, its exact request (body and tag headers) and what the load made of it."""

    headers: dict[str, str]  # turn_judge.turn_headers: the turn's session, depth, scenario and seed
    body: dict[str, Any]
    answer: ReferenceAnswer | None = None  # the answer under the load (recheck)
    codes: tuple[str, ...] = ()  # the corruption codes found on it (triage)
    order: int = 0  # when the load answered it, as a count (recheck sends the newest first)

    @property
    def session(self) -> str:
        return self.headers.get("X-Dsv4bench-Session", "")

    @property
    def turn(self) -> int:
        return int(self.headers.get("X-Dsv4bench-Turn", "0"))

    @property
    def scenario(self) -> str:
        return self.headers.get("X-Dsv4bench-Scenario", "")

    @property
    def label(self) -> str:
        return f"{self.session} turn {self.turn}"


class FindingKeep:
    """The findings the driver keeps for triage: at most `limit`, spread over (code, scenario) so
    every pair is covered before any has a second (a new pair evicts from the largest)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.groups: dict[tuple[str, str], list[Kept]] = {}
        self._keys: set[str] = set()

    def note(self, headers: dict[str, str], body: dict[str, Any], verdicts: list[Verdict]) -> None:
        codes = tuple(
            dict.fromkeys(v.code for v in verdicts if v.code in CORRUPTION_CODES and v.code not in _NOT_TRIAGED)
        )
        if not codes or self.limit <= 0 or not is_greedy(body):
            return
        kept = Kept(headers, kept_body(body), None, codes)
        group = (codes[0], kept.scenario)
        held = sum(len(g) for g in self.groups.values())
        if held >= self.limit and group in self.groups:
            return  # this pair is covered; the room is for pairs not seen yet
        key = request_key(body)
        if key in self._keys:
            return
        self._keys.add(key)
        self.groups.setdefault(group, []).append(kept)
        if held + 1 > self.limit:
            largest = max(self.groups.values(), key=len)
            largest.pop()

    def chosen(self) -> list[Kept]:
        """The kept findings, one of each pair first, then the second of each, ..."""
        out: list[Kept] = []
        lists = [g for _, g in sorted(self.groups.items())]
        for i in range(max(map(len, lists), default=0)):
            out.extend(g[i] for g in lists if i < len(g))
        return out[: self.limit]


@dataclass
class Sent:
    """One request sent alone and what the checkers found in its answer."""

    outcome: TurnOutcome
    codes: frozenset[str]  # the corruption codes found
    parser_disagrees: bool = False  # --raw: the raw oracle read the answer otherwise

    @property
    def ok(self) -> bool:
        return self.outcome.status is TurnStatus.OK and self.outcome.response is not None

    @property
    def answer(self) -> ReferenceAnswer | None:
        return ReferenceAnswer.of(self.outcome.response) if self.ok and self.outcome.response else None


class AloneSender:
    """Sends requests one at a time after the load, judges each, records each as an event."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        deadlines: Deadlines,
        run_id: str,
        family: str | None,
        history: HistoryWriter,
    ) -> None:
        self.client, self.base_url, self.deadlines = client, base_url, deadlines
        self.run_id, self.family, self.history = run_id, family, history
        self.requests = 0

    async def send(self, kept: Kept, purpose: str, body: dict[str, Any] | None = None, raw: bool = False) -> Sent:
        """Send `kept`'s request (or `body` in its place) alone, tagged as the turn's was and with
        X-Dsv4bench-Alone: `purpose`; judged by the run's checkers."""
        body = kept.body if body is None else body
        headers = {**kept.headers, "X-Dsv4bench-Run": self.run_id, ALONE_HEADER: purpose}
        self.requests += 1
        outcome = await chat_turn(self.client, f"{self.base_url}/chat/completions", body, self.deadlines, headers)
        ctx = request_context(body, outcome, family=self.family)
        if raw and outcome.status is TurnStatus.OK:
            ctx.raw_completion = await raw_completion(self.client, self.base_url, body, headers, self.deadlines.total_s)
        verdicts, _ = run_checks(ctx)
        codes = frozenset(v.code for v in verdicts if v.code in CORRUPTION_CODES)
        sent = Sent(outcome, codes, any(v.code == ORACLE_CODE for v in verdicts))
        t = outcome.timings
        self.history.event(
            ALONE_EVENT,
            purpose=purpose,
            session=kept.session,
            turn=kept.turn,
            key=request_key(body),
            status=outcome.status.value,
            error=outcome.error,
            codes=sorted(codes),
            ms=round(((t.end_ns or time.monotonic_ns()) - t.start_ns) / 1e6, 1),
        )
        return sent


@dataclass
class Determinism:
    """Whether the server gave one request the same greedy answer twice alone."""

    deterministic: bool | None  # None: not known (a send failed, or nothing to send)
    detail: str
    cold_differs: bool = False  # the first, cold, answer differed from the warm ones: cache evidence

    def as_dict(self) -> dict[str, Any]:
        return {"deterministic": self.deterministic, "detail": self.detail, "cold_differs": self.cold_differs}


async def probe_determinism(sender: AloneSender, kept: Kept) -> Determinism:
    """One kept request under a fresh nonce: once cold, then twice warm; the warm answers must agree."""
    body = cold_body(kept.body, secrets.token_hex(6))
    sends = [await sender.send(kept, "determinism", body) for _ in range(3)]
    failed = next((s for s in sends if not s.ok), None)
    if failed is not None:
        return Determinism(None, f"not known: a probe of {kept.label} failed ({failed.outcome.error or 'no answer'})")
    cold, warm1, warm2 = (s.answer.output for s in sends if s.answer is not None)
    if warm1 != warm2:
        return Determinism(False, f"the same request ({kept.label}, alone, cache warm) got two different answers")
    detail = f"the same request ({kept.label}) alone twice: one answer"
    return Determinism(True, detail + ("; the cold send's answer differed" if cold != warm1 else ""), cold != warm1)


def classify(hits: int, repeats: int, cold_hit: bool | None) -> str:
    """A finding's class from its alone sends (`hits` of `repeats` showed it) and the cold send
    (None: it failed). See the module docstring."""
    if hits == repeats and cold_hit:
        return DETERMINISTIC
    if hits and cold_hit is False:
        return CACHE_STATE
    if hits:
        return INTERMITTENT
    if cold_hit:
        return COLD_PATH
    return LOAD_DEPENDENT if cold_hit is False else NOT_CLASSED


@dataclass
class Triaged:
    """One finding's triage: its class and the evidence, as the report's line gives them."""

    session: str
    turn: int
    scenario: str
    codes: tuple[str, ...]
    cls: str
    evidence: str
    alone: list[bool] = field(default_factory=list)  # each alone send: showed it again
    cold: bool | None = None
    cause: str | None = None  # deterministic with --raw: "parser" or "model or template"

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "turn": self.turn,
            "scenario": self.scenario,
            "codes": list(self.codes),
            "class": self.cls,
            "cause": self.cause,
            "alone_hits": sum(self.alone),
            "alone_sent": len(self.alone),
            "cold_hit": self.cold,
            "evidence": self.evidence,
        }


async def triage_one(sender: AloneSender, kept: Kept, deterministic: bool | None, raw: bool) -> Triaged:
    """Send one finding's request alone TRIAGE_REPEATS times and once cold; class it."""
    wanted = set(kept.codes)
    alone: list[bool] = []
    failed = 0
    parser_disagrees = False
    for i in range(TRIAGE_REPEATS):
        s = await sender.send(kept, "triage", raw=raw and i == 0)
        failed += not s.ok
        if s.ok:
            alone.append(bool(wanted & s.codes))
            parser_disagrees |= i == 0 and s.parser_disagrees
    c = await sender.send(kept, "triage_cold", cold_body(kept.body, secrets.token_hex(6)))
    cold = bool(wanted & c.codes) if c.ok else None
    hits = sum(alone)
    evidence = f"alone {hits} of {len(alone)}, cold {'-' if cold is None else int(cold)} of 1"
    if failed:
        evidence += f"; {failed} alone send(s) failed"
    out = Triaged(kept.session, kept.turn, kept.scenario, kept.codes, NOT_CLASSED, evidence, alone, cold)
    if deterministic is not True:
        out.evidence += "; not classed: the server is not known to be deterministic at temperature 0"
        return out
    if failed:
        out.evidence += "; not classed"
        return out
    out.cls = classify(hits, len(alone), cold)
    if out.cls == DETERMINISTIC and raw:
        out.cause = "parser" if parser_disagrees else "model or template"
        out.evidence += (
            f"; the raw oracle {'disagrees with' if parser_disagrees else 'agrees with'} the server's parser"
        )
    return out


async def triage_findings(
    sender: AloneSender, kept: list[Kept], deterministic: bool | None, raw: bool, out: list[Triaged]
) -> None:
    """Each kept finding triaged in turn, appended to `out` as it is done: the caller bounds the
    time, and a cut keeps every finding triaged before it."""
    for k in kept:
        out.append(await triage_one(sender, k, deterministic, raw))
