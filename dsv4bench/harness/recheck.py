"""Answers that change under load, in one run (--recheck F).

A race that changes what the model writes but not the form of its calls (a KV or index cache read
while it is being loaded) leaves every checker of a single turn quiet; `--reference` finds it only
with a whole second run. --recheck finds it in the same run: during the load, the driver keeps a
share F of the greedy turns that the checkers passed (`RecheckKeep`: the latest turn of every
(scenario, depth) seen, and a seeded draw of F of all of them, the latest RECHECK_MAX kept), and
after the load each kept request is sent again alone, newest first: cache state builds up as the
load goes on (a device pool fills and prefixes come back from a host tier), so the last stretch
of the load is where such a race shows, and where the time cap must not fall.

Each kept request is sent alone once; an answer equal to the load's ends it (one request per
clean turn). One that differs is sent a second time, the server's settled answer:
- the settled answer differs from the load's: the load changed the answer
  (`load_dependent` where both alone answers agree, `cache_state` where they differ too);
- the settled answer is the load's: the first alone answer read what the load left in the
  cache (`cache_state`): the server answered one greedy request two ways.
Either is `answer_changed_under_load` (checks/reference.py compares answers as --reference does).

It needs a server that is deterministic at temperature 0, whatever else is in its batch (SGLang:
`--enable-deterministic-inference`): triage.py's probe runs first, and on a server that fails it
nothing is compared.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any

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
        """What is sent, in order: each (scenario, depth)'s latest turn, newest first, so every pair
        is covered before the time cap can fall; then the drawn turns, newest first."""
        first = sorted(self.latest.values(), key=lambda k: k.order, reverse=True)
        chosen = {id(k) for k in first}
        return first + [k for k in reversed(self.drawn) if id(k) not in chosen]

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


async def recheck_one(sender: AloneSender, kept: Kept) -> Changed | None:
    """Send one kept request alone (twice where the first answer is not the load's); the finding
    where the server answered it two ways (see the module docstring)."""
    assert kept.answer is not None
    first = await sender.send(kept, "recheck")
    if first.answer is None or changed_verdict(kept.answer, first.answer) is None:
        return None  # the load's answer again (a failed send compares nothing: it is in the events)
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
