"""Answers that change under load, in one run (--recheck F).

A race that changes what the model writes but not the form of its calls (a KV or index cache read
while it is being loaded) leaves every checker of a single turn quiet; `--reference` finds it only
with a whole second run. --recheck finds it in the same run: during the load, the driver keeps a
share F of the greedy turns that the checkers passed (`RecheckKeep`: the latest turn of every
(scenario, depth) seen, and a seeded draw of F of all of them, the latest RECHECK_MAX kept), and
after the load each kept request is sent again, newest session first: cache state builds up as
the load goes on (a device pool fills and prefixes come back from a host tier), so the last
stretch of the load is where such a race shows, and where the time cap must not fall.

Each kept request is first screened: sent once with at most `--recheck-group` - 1 others of the
recheck in flight (nothing of the load; RunConfig.recheck_group). Why a group and not alone: a
request alone is mostly decode steps, and a step costs about the same for one sequence as for a
few, so a group rechecks several turns in the time of one (bench-plan.md, "Triage and recheck").
What it gives up: a race that fires with as few requests in flight as the group changes the
screen's answer as it changed the load's, and hides (`--recheck-group 1` screens each alone). A screened answer equal
to the load's ends it (one request per clean turn); the screen only chooses what is confirmed,
and judges nothing. One that differs is confirmed alone (`RecheckGate`: every other request of
the recheck finishes first and none starts meanwhile), up to twice, the second the server's
settled answer:
- the first alone answer is the load's: nothing is found (the screen's difference came from the
  group; counted as `screen_only`, evidence that the server's answers depend on its batch);
- the settled answer differs from the load's: the load changed the answer (`load_dependent`
  where both alone answers agree, `cache_state` where they differ too);
- the settled answer is the load's: the first alone answer read what the load left in the
  cache (`cache_state`): the server answered one greedy request two ways.
Either finding is `answer_changed_under_load` (checks/reference.py compares answers as
--reference does).

It needs a server that is deterministic at temperature 0, whatever else is in its batch (SGLang:
`--enable-deterministic-inference`), as the load's own answers came from a full batch:
triage.py's probe runs first, and on a server that fails it nothing is compared.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from dsv4bench.checks.reference import ALONE, answer_difference
from dsv4bench.harness.reference_run import is_greedy
from dsv4bench.harness.triage import CACHE_STATE, LOAD_DEPENDENT, AloneSender, Kept, kept_body
from dsv4bench.history.codes import ANSWER_CHANGED_CODE, CORRUPTION_CODES
from dsv4bench.history.records import AssembledResponse, ReferenceAnswer, Verdict

RECHECK_MAX = 400  # drawn requests kept for recheck, whatever the share: the latest ones


@dataclass
class Changed:
    """A turn whose answer alone differs from its answer under the load."""

    kept: Kept
    verdict: Verdict
    cls: str
    evidence: str

    def as_dict(self) -> dict[str, Any]:
        k = self.kept
        return {
            "session": k.session,
            "turn": k.turn,
            "scenario": k.scenario,
            "codes": [ANSWER_CHANGED_CODE],
            "class": self.cls,
            "cause": None,
            "where": self.verdict.where,
            "detail": self.verdict.detail,
            "evidence": self.evidence,
        }


class RecheckKeep:
    """The greedy, clean turns the driver keeps for recheck: the latest of every (scenario, depth),
    and a seeded share of all (the same seed draws the same turns), the latest RECHECK_MAX of them."""

    def __init__(self, share: float, seed: int) -> None:
        self.share, self.seed = share, seed
        self.latest: dict[tuple[str, int], Kept] = {}  # per (scenario, depth): its latest turn
        self.drawn: deque[Kept] = deque(maxlen=RECHECK_MAX)  # the oldest leave when it is full
        self.seen = 0  # greedy ok turns the checkers passed: what the share is of

    @property
    def strata(self) -> set[tuple[str, int]]:
        return set(self.latest)

    @property
    def kept(self) -> list[Kept]:
        """What is sent, in order, a session at a time: first the sessions holding some (scenario,
        depth)'s latest turn, so every pair is covered before the time cap can fall, then those of
        the drawn turns; each group newest first (by its session's newest kept turn), and within a
        session its kept turns by depth. Why a session at a time: a turn's request extends the
        previous turn's, so once the cache is dropped each request reuses the prefix its
        predecessor computed alone and prefills only what its turn added. Sent scattered, every
        request would prefill its whole context again (on the CPU engine most of its time alone)."""
        first = sorted(self.latest.values(), key=lambda k: k.order, reverse=True)
        chosen = {id(k) for k in first}
        turns = first + [k for k in reversed(self.drawn) if id(k) not in chosen]
        by_session: dict[str, list[Kept]] = {}
        for k in turns:  # sessions in the order their first turn comes above
            by_session.setdefault(k.session, []).append(k)
        return [k for group in by_session.values() for k in sorted(group, key=lambda k: (k.turn, k.order))]

    def note(
        self, headers: dict[str, str], body: dict[str, Any], response: AssembledResponse | None, verdicts: list[Verdict]
    ) -> None:
        if self.share <= 0 or response is None or not is_greedy(body):
            return
        if any(v.code in CORRUPTION_CODES for v in verdicts):
            return  # already a finding: triage takes it
        self.seen += 1
        kept = Kept(headers, kept_body(body), ReferenceAnswer.of(response), order=self.seen)
        self.latest[(kept.scenario, kept.turn)] = kept
        if zlib.crc32(f"{self.seed}:{kept.label}".encode()) / 2**32 < self.share:
            self.drawn.append(kept)


def changed_verdict(under_load: ReferenceAnswer, alone: ReferenceAnswer) -> Verdict | None:
    """The finding where the answer under the load differs from the settled alone one (the
    comparison of answer_changed_under_load's checker, checks/reference.py)."""
    found = answer_difference(ANSWER_CHANGED_CODE, under_load, alone, ALONE)
    return found[0] if found else None


class RecheckGate:
    """Screens share the server; a confirmation has it alone. `alone()` waits for the screens in
    flight to finish and holds new ones back until it is done (a waiting confirmation goes first,
    so screens cannot starve it)."""

    def __init__(self) -> None:
        self._changed = anyio.Condition()
        self._shared = 0
        self._alone = False
        self._waiting = 0  # confirmations waiting for the screens in flight
        self.screen_only = 0  # screens that differed where the alone answer was the load's

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._changed:
            while self._alone or self._waiting:
                await self._changed.wait()
            self._shared += 1
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                async with self._changed:
                    self._shared -= 1
                    self._changed.notify_all()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        async with self._changed:
            self._waiting += 1
            try:
                while self._alone or self._shared:
                    await self._changed.wait()
            finally:
                self._waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                async with self._changed:
                    self._alone = False
                    self._changed.notify_all()


async def recheck_one(sender: AloneSender, kept: Kept, gate: RecheckGate) -> Changed | None:
    """Screen one kept request; where its answer differs from the load's, confirm it alone (twice
    where the first alone answer is not the load's): the finding where the server answered it two
    ways (see the module docstring)."""
    assert kept.answer is not None
    async with gate.shared():
        screen = await sender.send(kept, "recheck_screen")
    if screen.answer is None or changed_verdict(kept.answer, screen.answer) is None:
        return None  # the load's answer again (a failed send compares nothing: it is in the events)
    async with gate.alone():
        return await _confirm(sender, kept, gate)


async def _confirm(sender: AloneSender, kept: Kept, gate: RecheckGate) -> Changed | None:
    assert kept.answer is not None
    first = await sender.send(kept, "recheck")
    if first.answer is None:
        return None
    if changed_verdict(kept.answer, first.answer) is None:
        gate.screen_only += 1
        return None
    second = await sender.send(kept, "recheck")
    if second.answer is None:
        return None
    settled = changed_verdict(kept.answer, second.answer)
    if settled is not None:
        agree = first.answer.output == second.answer.output
        cls = LOAD_DEPENDENT if agree else CACHE_STATE
        evidence = f"under the load one answer, alone another ({settled.where}); the 2 alone answers " + (
            "agree" if agree else "differ too: the first read what the load left in the cache"
        )
        return Changed(kept, settled, cls, evidence)
    verdict = changed_verdict(kept.answer, first.answer)
    assert verdict is not None
    evidence = (
        f"the first answer alone differs from the load's ({verdict.where}), the second is the load's again: "
        "the first read what the load left in the cache"
    )
    return Changed(kept, verdict, CACHE_STATE, evidence)
