"""Corruption that persists: after the load and the drain, a few fresh sessions, one at a time,
on the seeds of sessions that were clean early in the run. If they now corrupt, the load left
the server's state poisoned (`poisoned_state`: a cache, a speculative-decoding draft state, a
KV pool that stays wrong until a restart); if they are clean, the corruption needed the load.

Bounded: `--persist-sessions` sessions (0: off), each cut off at PERSIST_CAP_S in all. On by
default when the load found corruption; its sessions go to run.json's `persistence` block and a
few events, never to turns.jsonl: they are no turns of the run. With --recover-cmd, after the
recovery, fresh sessions are played again until one is clean: the time to clean is measured.

A fresh session replays its seed exactly: the same requests, tagged with the replayed session's
id as it was (a server may key anything on the request), and no deeper than the replayed session
went, since only a turn that was clean then can show a change now. Poisoned needs more than half
of the fresh sessions corrupt, and their corrupt-turn share above twice the share of the run's
first third: a server that corrupted at that rate from the start shows no state the load left.

The choice of sessions and the judgement are pure (`clean_early_sessions`, `early_rate`,
`judge`); the sessions are played by `check_persistence` and `time_to_clean`, the thin impure part.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import httpx

from dsv4bench.agents import get_family
from dsv4bench.checks import run_checks
from dsv4bench.harness.config import RunConfig
from dsv4bench.harness.driver import make_client
from dsv4bench.harness.session import AgentSession
from dsv4bench.harness.triage import ALONE_HEADER
from dsv4bench.harness.turn_judge import turn_context, turn_headers
from dsv4bench.history.codes import CORRUPTION_CODES
from dsv4bench.history.records import TurnRecord, TurnStatus
from dsv4bench.history.run_folder import History, HistoryWriter
from dsv4bench.wire.client import chat_turn

POISONED_CODE = "poisoned_state"
PERSIST_CAP_S = 120.0  # all the fresh sessions of one check together; the recovery's wait too
RETRY_PAUSE_S = 1.0  # between fresh sessions while waiting for a recovered server to be clean
SESSION_PREFIX = "persist"  # fresh sessions are persist<N>-<the session they replay>

# How a fresh session ended.
CORRUPT, CLEAN, ERROR, CUT = "corrupt", "clean", "error", "cut"


@dataclass(frozen=True)
class Pick:
    """A session of the run whose seed a fresh session replays."""

    session: str
    scenario: str
    seed: int
    started_wall_ns: int
    turns: int  # how deep it went: a fresh session goes no deeper


@dataclass
class FreshSession:
    """What one fresh session found; `outcome`: corrupt, clean, error (a turn failed: not
    judged), or cut (the time cap stopped it before its end, nothing corrupt so far)."""

    session: str
    replays: str
    scenario: str
    seed: int
    turns: int = 0
    corrupt_turns: int = 0
    codes: tuple[str, ...] = ()
    first_corrupt: dict[str, Any] | None = None  # turn, code, where, detail of the first finding
    outcome: str = CUT


def clean_early_sessions(history: History, limit: int) -> list[Pick]:
    """Up to `limit` sessions of the run, earliest started first, each with at least one turn,
    every turn complete, judged and not corrupt (so their seeds are known clean on this server),
    one per (scenario, seed)."""
    by_session: dict[str, list[TurnRecord]] = {}
    for t in history.turns:
        by_session.setdefault(t.session, []).append(t)
    picks: list[Pick] = []
    for sid, turns in by_session.items():
        if all(t.status is TurnStatus.OK and not t.corrupt and not t.check_errors for t in turns):
            first = min(turns, key=lambda t: t.timings.start_wall_ns)
            picks.append(Pick(sid, first.scenario, first.seed, first.timings.start_wall_ns, len(turns)))
    picks.sort(key=lambda p: (p.started_wall_ns, p.session))
    seen: set[tuple[str, int]] = set()
    out = []
    for p in picks:
        if (p.scenario, p.seed) not in seen:
            seen.add((p.scenario, p.seed))
            out.append(p)
    return out[:limit]


def found_corruption(history: History) -> bool:
    """Whether the load found a corrupt turn: the persistence check's trigger."""
    return any(t.corrupt for t in history.turns)


EARLY_SHARE = 1 / 3  # the run's first third: the rate the server corrupted at before the load told


def early_rate(history: History) -> float:
    """The share of complete turns corrupt among those that started in the run's first third."""
    ok = [t for t in history.turns if t.status is TurnStatus.OK and t.timings.start_wall_ns]
    if not ok:
        return 0.0
    start = min(t.timings.start_wall_ns for t in ok)
    span = max(t.timings.start_wall_ns for t in ok) - start
    early = [t for t in ok if t.timings.start_wall_ns - start <= span * EARLY_SHARE]
    return sum(t.corrupt for t in early) / len(early)


def judge(sessions: list[FreshSession], before: float = 0.0) -> tuple[bool | None, str]:
    """(poisoned, why): poisoned when more than half of the fresh sessions that ran to a judgement
    (corrupt or clean) corrupted, and their corrupt-turn share is above twice `before`, the share
    of the run's first third; None when none ran to a judgement (every one failed or was cut)."""
    judged = [s for s in sessions if s.outcome in (CORRUPT, CLEAN)]
    corrupt = [s for s in judged if s.outcome == CORRUPT]
    if not judged:
        return None, f"none of {len(sessions)} fresh session(s) ran to a judgement (errors or the time cap)"
    words = f"{len(corrupt)} of {len(judged)} fresh session(s) alone after the load corrupted"
    turns = sum(s.turns for s in judged)
    now = sum(s.corrupt_turns for s in judged) / turns if turns else 0.0
    if 2 * len(corrupt) > len(judged) and now <= 2 * before:
        return False, (
            f"{words}, {now:.0%} of their turns; but {before:.0%} of the turns of the run's first third "
            "were corrupt too: the server corrupted at this rate from the start, no sign of state the load left"
        )
    return 2 * len(corrupt) > len(judged), words


async def play_fresh(
    client: httpx.AsyncClient,
    config: RunConfig,
    model: str,
    family: str | None,
    run_id: str,
    found: FreshSession,
    depth: int | None,
) -> None:
    """Play `found`'s fresh session alone, every turn judged, into `found`: the replayed session's
    requests as they were (its id in the request and its tags), `depth` turns at most; cancelled
    from outside (the time cap), it keeps what it saw (outcome `cut`, or `corrupt`)."""
    sess = AgentSession(
        found.replays, get_family(found.scenario), found.seed, config.session_config(model, config.context_length)
    )
    codes: dict[str, None] = {}
    try:
        while not sess.done and (depth is None or found.turns < depth):
            body = sess.next_request()
            headers = {**turn_headers(run_id, sess), ALONE_HEADER: "persistence"}  # after the load, as triage's
            outcome = await chat_turn(client, f"{config.base_url}/chat/completions", body, config.deadlines, headers)
            verdicts, _ = run_checks(turn_context(sess, body, outcome, family))
            found.turns += 1
            bad = [v for v in verdicts if v.code in CORRUPTION_CODES] if outcome.status is TurnStatus.OK else []
            if bad:
                found.corrupt_turns += 1
                codes.update(dict.fromkeys(v.code for v in bad))
                if found.first_corrupt is None:
                    v = bad[0]
                    found.first_corrupt = {
                        "turn": sess.turn,
                        "code": v.code,
                        "where": v.where,
                        "detail": v.detail[:200],
                    }
            sess.observe(outcome.status, outcome.response, verdicts)
            if outcome.status is not TurnStatus.OK and not found.corrupt_turns:
                found.outcome = ERROR
        if found.outcome != ERROR:
            found.outcome = CORRUPT if found.corrupt_turns else CLEAN
    finally:
        found.codes = tuple(codes)
        if found.corrupt_turns:  # what it found stands, however it ended
            found.outcome = CORRUPT


async def _check(
    config: RunConfig, model: str, family: str | None, run_id: str, picks: list[Pick], history: HistoryWriter
) -> list[FreshSession]:
    out: list[FreshSession] = []
    async with make_client(config) as client:
        with anyio.move_on_after(PERSIST_CAP_S):
            for i, pick in enumerate(picks):
                sid = f"{SESSION_PREFIX}{i}-{pick.session}"
                out.append(FreshSession(sid, pick.session, pick.scenario, pick.seed))
                await play_fresh(client, config, model, family, run_id, out[-1], pick.turns)
                history.event("persistence_session", fresh=sid, replays=pick.session, outcome=out[-1].outcome)
    return out


def check_persistence(
    config: RunConfig, model: str, family: str | None, run_id: str, history: History, writer: HistoryWriter
) -> dict[str, Any] | None:
    """run.json's `persistence` block: the fresh sessions and whether the state is poisoned; None
    when the check does not run (switched off, or the load found no corruption)."""
    if config.persist_sessions == 0 or not found_corruption(history):
        return None
    picks = clean_early_sessions(history, config.persist_sessions)
    if not picks:
        writer.event("persistence_skipped", reason="no session was clean")
        return {"poisoned": None, "why": "no session of the run was clean: no seed known clean to replay"}
    t0 = time.monotonic()
    writer.event("persistence_start", sessions=len(picks))
    sessions = anyio.run(_check, config, model, family, run_id, picks, writer)
    before = early_rate(history)
    poisoned, why = judge(sessions, before)
    writer.event("persistence_end", poisoned=poisoned)
    return {
        "poisoned": poisoned,
        "early_corrupt_share": round(before, 4),
        "code": POISONED_CODE if poisoned else None,
        "why": why,
        "sessions": [asdict(s) for s in sessions],
        "elapsed_s": round(time.monotonic() - t0, 3),
        "cap_s": PERSIST_CAP_S,
    }


async def _until_clean(
    config: RunConfig, model: str, family: str | None, run_id: str, pick: Pick, t0: float
) -> dict[str, Any]:
    tries = 0
    last = None
    async with make_client(config) as client:
        with anyio.move_on_after(max(0.0, PERSIST_CAP_S - (time.monotonic() - t0))):
            while True:
                tries += 1
                found = FreshSession(f"{SESSION_PREFIX}-recovered{tries}", pick.session, pick.scenario, pick.seed)
                await play_fresh(client, config, model, family, run_id, found, pick.turns)
                last = found.outcome
                if last == CLEAN:
                    return {"clean_after_s": round(time.monotonic() - t0, 3), "tries": tries, "last": last}
                await anyio.sleep(RETRY_PAUSE_S)
    return {"clean_after_s": None, "tries": tries, "last": last}


def time_to_clean(
    config: RunConfig, model: str, family: str | None, run_id: str, block: dict[str, Any], t0: float
) -> dict[str, Any]:
    """After --recover-cmd (started at monotonic `t0`): fresh sessions on the first replayed seed,
    one after another, until one is clean; `clean_after_s` counts from the command's start (None:
    not clean within PERSIST_CAP_S of it)."""
    first = block["sessions"][0]
    pick = Pick(first["replays"], first["scenario"], first["seed"], 0, first["turns"])
    return anyio.run(_until_clean, config, model, family, run_id, pick, t0)
