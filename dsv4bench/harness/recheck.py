"""Answers that change under load, in one run (--recheck F).

A race that changes what the model writes but not the form of its calls (a KV or index cache read
while it is being loaded) leaves every checker of a single turn quiet; `--reference` finds it only
with a whole second run. --recheck finds it in the same run: during the load, the driver keeps a
share F of the greedy turns that the checkers passed (`RecheckKeep`: the first turn of every
(scenario, depth) seen, then a seeded draw of F of the rest, at most RECHECK_MAX), and after the
load each kept request is sent again alone, twice. The second alone answer is the server's
settled answer to that request; if it differs from the answer under the load, the turn is
`answer_changed_under_load` (checks/reference.py compares them as --reference does).

It needs a server that is deterministic at temperature 0: triage.py's probe runs first, and on a
server that fails it nothing is compared. The class comes with the finding: both alone answers
agree (load_dependent: the load changed the answer), or the first alone answer differs from the
second (cache_state: the first read what the load left in the cache).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from dsv4bench.checks.reference import ALONE, answer_difference
from dsv4bench.harness.reference_run import is_greedy
from dsv4bench.harness.triage import CACHE_STATE, LOAD_DEPENDENT, AloneSender, Kept, kept_body
from dsv4bench.history.codes import ANSWER_CHANGED_CODE, CORRUPTION_CODES
from dsv4bench.history.records import AssembledResponse, ReferenceAnswer, Verdict

RECHECK_MAX = 400  # requests kept for recheck, whatever the share
RECHECK_REPEATS = 2  # alone sends of each: the first may read what the load left; the second is settled


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
    """The greedy, clean turns the driver keeps for recheck: every (scenario, depth) once, then a
    seeded share of the rest (the same seed draws the same turns), at most RECHECK_MAX."""

    def __init__(self, share: float, seed: int) -> None:
        self.share, self.seed = share, seed
        self.kept: list[Kept] = []
        self.strata: set[tuple[str, int]] = set()
        self.seen = 0  # greedy ok turns the checkers passed: what the share is of

    def note(
        self, headers: dict[str, str], body: dict[str, Any], response: AssembledResponse | None, verdicts: list[Verdict]
    ) -> None:
        if self.share <= 0 or response is None or not is_greedy(body):
            return
        if any(v.code in CORRUPTION_CODES for v in verdicts):
            return  # already a finding: triage takes it
        self.seen += 1
        kept = Kept(headers, body, ReferenceAnswer.of(response))
        stratum = (kept.scenario, kept.turn)
        new = stratum not in self.strata
        drawn = zlib.crc32(f"{self.seed}:{kept.label}".encode()) / 2**32 < self.share
        if len(self.kept) >= RECHECK_MAX or not (new or drawn):
            return
        self.strata.add(stratum)
        kept.body = kept_body(body)
        self.kept.append(kept)


def changed_verdict(under_load: ReferenceAnswer, alone: ReferenceAnswer) -> Verdict | None:
    """The finding where the answer under the load differs from the settled alone one (the
    comparison of answer_changed_under_load's checker, checks/reference.py)."""
    found = answer_difference(ANSWER_CHANGED_CODE, under_load, alone, ALONE)
    return found[0] if found else None


async def recheck_one(sender: AloneSender, kept: Kept) -> Changed | None:
    """Send one kept request alone twice; the finding if the settled answer is not the load's."""
    answers: list[ReferenceAnswer] = []
    for _ in range(RECHECK_REPEATS):
        sent = await sender.send(kept, "recheck")
        if sent.answer is None:
            return None  # a failed send compares nothing (it is in the events)
        answers.append(sent.answer)
    assert kept.answer is not None
    verdict = changed_verdict(kept.answer, answers[-1])
    if verdict is None:
        return None
    first_differs = answers[0].output != answers[-1].output
    cls = CACHE_STATE if first_differs else LOAD_DEPENDENT
    evidence = f"under the load one answer, alone another ({verdict.where}); the {RECHECK_REPEATS} alone answers " + (
        "differ: the first read what the load left in the cache" if first_differs else "agree"
    )
    return Changed(kept, verdict, cls, evidence)
