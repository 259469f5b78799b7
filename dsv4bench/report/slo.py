"""Goodput against latency targets (`--slo ttft=2s,itl=100ms,e2e=60s`): each turn meets its
targets or not, and a run's share of turns meeting them and its goodput (turns and output
tokens per second that met them), as vLLM's `bench serve` and AIPerf define goodput. docs/slo.md is the reference; the rules, written once here:

- A turn is good when it completed (status ok), no checker found it corrupt, and it met every
  target given. A target is met at or under it (`<=`, as vLLM and AIPerf compare).
- TTFT and E2E are the turn's own (Timings.ttft_s, e2e_s). ITL is judged on the turn's mean gap
  between streamed deltas (TPOT-style, as vLLM's tpot and AIPerf's per-request ITL), not on a
  percentile of its gaps: one slow gap (a call's arguments sent at once, one scheduler stall)
  does not fail a turn whose stream was fluent overall, and the mean is what the peers compare.
  A turn with no gap (one delta, or not streamed) has no inter-token wait to miss: it meets
  ITL, as vLLM counts a one-token request's tpot as 0.
- A target that cannot be measured on a completed turn (no first-token stamp) is missed.
- Killed turns (our own nemesis cut them) are not counted at all; nor are turns a checker raised
  on (whether they are corrupt is unknown: our failure, never the server's), which are counted
  as `unjudged`. Corrupt turns and failed turns (HTTP error, connection error, timeout) are
  counted and never good, whatever their timings.
- Output tokens are each good turn's `usage.completion_tokens`; a good turn whose answer
  reported none is counted in `tokens_unknown`, and its tokens are not guessed.
- The rate is over the run's duration as summary.json's `duration_s` gives it (run_start to
  run_end); the live figures (exporter, Locust tab) over the time elapsed so far.
"""

from __future__ import annotations

import enum
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dsv4bench.errors import UsageError
from dsv4bench.history.records import TurnRecord, TurnStatus

# The targets `--slo` takes, in the order they are written back.
TARGETS: tuple[str, ...] = ("ttft", "itl", "e2e")
# Seconds per unit; a plain number is seconds, as every other time flag of ours.
UNITS: dict[str, float] = {"ms": 1e-3, "s": 1.0, "": 1.0}
_VALUE = re.compile(r"^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)$")


class SloError(UsageError, ValueError):
    """An --slo spec that cannot be read; the message names the part that is wrong."""


@dataclass(frozen=True)
class SloTargets:
    """The latency targets of a run, in seconds; None where not given."""

    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> SloTargets:
        """`ttft=2s,itl=100ms,e2e=60` (any subset; s, ms, or a plain number of seconds).
        SloError naming the bad part: an unknown target, a bad unit, a value not positive, a
        target given twice, or none at all."""
        seen: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, eq, value = (s.strip() for s in part.partition("="))
            key = key.lower()
            if not eq or not value:
                raise SloError(f"--slo {part!r}: write TARGET=VALUE, e.g. ttft=2s")
            if key not in TARGETS:
                raise SloError(f"--slo {part!r}: unknown target {key!r}; the targets are {', '.join(TARGETS)}")
            if key in seen:
                raise SloError(f"--slo {part!r}: {key} is given twice")
            seen[key] = _seconds(part, value)
        if not seen:
            raise SloError(f"--slo {text!r} names no target; give any of {', '.join(TARGETS)}, e.g. ttft=2s,itl=100ms")
        return cls(**{f"{k}_s": v for k, v in seen.items()})

    def given(self) -> dict[str, float]:
        """The targets given, by name, in seconds."""
        return {k: v for k in TARGETS if (v := getattr(self, f"{k}_s")) is not None}

    @property
    def spec(self) -> str:
        """The spec written back: `ttft=2s,itl=100ms`, each value in the unit that reads best."""
        return ",".join(f"{k}={_fmt(v)}" for k, v in self.given().items())


def _seconds(part: str, value: str) -> float:
    m = _VALUE.match(value)
    if m is None:
        if value.lstrip().startswith("-"):
            raise SloError(f"--slo {part!r}: a target must be positive")
        raise SloError(f"--slo {part!r}: {value!r} is not a number with a unit (s, ms), e.g. 2s or 100ms")
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit not in UNITS:
        raise SloError(f"--slo {part!r}: unknown unit {m.group(2)!r}; use s or ms (a plain number is seconds)")
    seconds = number * UNITS[unit]
    if not math.isfinite(seconds) or seconds <= 0:
        raise SloError(f"--slo {part!r}: a target must be positive and finite")
    return seconds


def _fmt(seconds: float) -> str:
    # 12 digits: the value reads back the same (6 would round a user's 1.2345678s), while the
    # float noise of a unit's product (0.1 * 1e3 = 100.00000000000001) is left out.
    return f"{seconds * 1e3:.12g}ms" if seconds < 1 else f"{seconds:.12g}s"


class Outcome(str, enum.Enum):
    """What one turn counts as against the targets."""

    MET = "met"  # completed, not corrupt, every target met: good
    MISSED = "missed"  # completed, not corrupt, a target missed
    CORRUPT = "corrupt"  # completed but corrupt: never good, whatever its timings
    FAILED = "failed"  # HTTP error, connection error or timeout: never good
    KILLED = "killed"  # cut by our own nemesis: not counted
    UNJUDGED = "unjudged"  # a checker raised on it: corrupt or not is unknown, not counted


NOT_COUNTED = (Outcome.KILLED, Outcome.UNJUDGED)


def mean_itl_s(turn: TurnRecord) -> float | None:
    """The turn's mean gap between streamed deltas, in seconds; None where it has no gap."""
    gaps = turn.timings.token_gaps_ms
    return sum(gaps) / len(gaps) / 1e3 if gaps else None


def missed_targets(turn: TurnRecord, targets: SloTargets) -> list[str]:
    """The targets a completed turn missed (see the module docstring), in TARGETS order."""
    measured = {"ttft": turn.timings.ttft_s, "itl": mean_itl_s(turn), "e2e": turn.timings.e2e_s}
    missed = []
    for name, target in targets.given().items():
        value = measured[name]
        if value is None and name == "itl":
            continue  # no inter-token wait to miss
        if value is None or value > target:
            missed.append(name)
    return missed


def outcome(turn: TurnRecord, targets: SloTargets) -> Outcome:
    """What `turn` counts as against `targets`."""
    if turn.status is TurnStatus.KILLED:
        return Outcome.KILLED
    if turn.status is not TurnStatus.OK:
        return Outcome.FAILED
    if turn.check_errors:
        return Outcome.UNJUDGED
    if turn.corrupt:
        return Outcome.CORRUPT
    return Outcome.MISSED if missed_targets(turn, targets) else Outcome.MET


def output_tokens(turn: TurnRecord) -> int | None:
    """The turn's `usage.completion_tokens` as its answer reported it; None where it did not."""
    usage = turn.response.usage if turn.response is not None else None
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if type(n) is int and n >= 0 else None


@dataclass
class SloTally:
    """The running count of turns against one set of targets: fed turn by turn (the summary, the
    live exporter and the Locust tab all count through it), read as figures over a window."""

    targets: SloTargets
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)  # per target, over completed clean turns
    good_tokens: int = 0
    tokens_unknown: int = 0  # good turns whose answer reported no completion_tokens
    # Wall-clock span of the turns fed so far (first start, last end): a window that stops
    # growing when the load stops, for a view that has no run_end (the Locust tab).
    first_start_ns: int | None = None
    last_end_ns: int | None = None

    def add(self, turn: TurnRecord) -> Outcome:
        found = outcome(turn, self.targets)
        t = turn.timings
        end = t.start_wall_ns + (t.end_ns - t.start_ns) if t.end_ns is not None else t.start_wall_ns
        self.first_start_ns = min(t.start_wall_ns, self.first_start_ns or t.start_wall_ns)
        self.last_end_ns = max(end, self.last_end_ns or end)
        self.outcomes[found] += 1
        if found is Outcome.MISSED:
            self.missed.update(missed_targets(turn, self.targets))
        elif found is Outcome.MET:
            tokens = output_tokens(turn)
            if tokens is None:
                self.tokens_unknown += 1
            else:
                self.good_tokens += tokens
        return found

    @property
    def counted(self) -> int:
        return sum(n for o, n in self.outcomes.items() if o not in NOT_COUNTED)

    @property
    def good(self) -> int:
        return self.outcomes[Outcome.MET]

    @property
    def turns_window_s(self) -> float | None:
        """Seconds from the first turn's start to the last one's end; None before any turn."""
        if self.first_start_ns is None or self.last_end_ns is None:
            return None
        return (self.last_end_ns - self.first_start_ns) / 1e9

    @property
    def share(self) -> float | None:
        return self.good / self.counted if self.counted else None

    def figures(self, window_s: float | None) -> dict[str, Any]:
        """The summary's `slo` block over a window of `window_s` seconds (None: unknown)."""
        return {
            "spec": self.targets.spec,
            "targets_s": self.targets.given(),
            "turns": self.counted,
            "good": self.good,
            "share": self.share,
            "outcomes": {o.value: self.outcomes[o] for o in Outcome},
            "missed": {name: self.missed[name] for name in self.targets.given()},
            "good_output_tokens": self.good_tokens,
            "tokens_unknown": self.tokens_unknown,
            "window_s": window_s,
            "goodput_turns_per_s": per_second(self.good, window_s),
            "goodput_tokens_per_s": per_second(self.good_tokens, window_s),
        }


def tally_for(targets: SloTargets | None) -> SloTally | None:
    """A fresh tally of `targets`; None for a run given none."""
    return SloTally(targets) if targets is not None else None


def per_second(value: float, window_s: float | None) -> float | None:
    """`value` per second of `window_s`; None where the window is unknown or empty."""
    return value / window_s if window_s else None


def slo_figures(turns: list[TurnRecord], targets: SloTargets, window_s: float | None) -> dict[str, Any]:
    """The `slo` block of turns judged against targets over a window (summary.json's duration_s)."""
    tally = SloTally(targets)
    for t in turns:
        tally.add(t)
    return tally.figures(window_s)


def run_targets(run: dict[str, Any]) -> SloTargets | None:
    """The targets a run was given (run.json's config.slo); None where it was given none.
    SloError for a spec no run writes (a hand-edited run.json)."""
    config = run.get("config")
    spec = config.get("slo") if isinstance(config, dict) else None
    if spec is None:
        return None
    if not isinstance(spec, str):
        raise SloError(f"run.json's config.slo is not a spec: {spec!r}")
    return SloTargets.parse(spec)


def run_slo(run: dict[str, Any], turns: list[TurnRecord], window_s: float | None) -> dict[str, Any] | None:
    """summary.json's `slo` block: None for a run given no targets; `{"spec", "error"}` where its
    targets cannot be read (then nothing is judged against them)."""
    try:
        targets = run_targets(run)
    except SloError as e:
        config = run.get("config")
        return {"spec": str(config.get("slo")) if isinstance(config, dict) else None, "error": str(e)}
    return slo_figures(turns, targets, window_s) if targets is not None else None
