"""How deep sessions grow: context profiles drawn from recorded agent sessions (`--context`).

A cache race that needs a prefix evicted from the device pool and loaded back cannot fire while
the sessions' working set fits the pool, so a load that stops at a few thousand tokens per
session proves nothing on a production pool. A profile gives each session a deepest prompt
drawn from the distribution recorded agents reach, and the session grows toward it as agents
grow theirs: it opens with the reads an agent makes on its world (agents/exploration.py: the
world's real files, tables and logs, every result a real tool call's), then takes its turns,
and ends when its next prompt would pass its depth (EndReason.DEPTH_REACHED) or the server's
context (CONTEXT_FULL), as an agent framework compacts or stops.

The deepest prompt per session is log-normal: ln D ~ N(ln P50, sigma) with sigma set by P95,
the shape of the recorded distributions (a long right tail). Each session's draw comes from its
own seed (a standard normal draw the profile scales), so a run replays the same depths.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from dataclasses import dataclass

from dsv4bench.errors import UsageError

_Z95 = 1.6448536269514722  # the standard normal's 95th percentile
# P95/P50 of the SWE-agent / OpenHands trajectories (69,274 / 23,840): a custom profile given
# only its median takes that tail.
_TAIL_RATIO = 69_274 / 23_840
# What a session's own turns add after its opening, in tokens: the short profile's sessions
# grow by about this much over their turns (deepest p50 5,357 with a ~1k opening), so an opening
# of the target less this leaves the session's turns to reach its depth. A shallow depth keeps a
# quarter of itself for its turns instead: a few turns reach it.
TURN_GROWTH_TOKENS = 4_000
# Characters per token of each family's reads on the bundled engine's tokenizer (an 8k-entry
# BPE), measured over their openings: code reads longer per token than logs. The opening is
# measured in characters (the harness has no tokenizer of an arbitrary server's); a production
# vocabulary (DeepSeek's 128k) takes more characters per token, so an opening never holds more
# tokens than it was given there, only fewer.
CHARS_PER_TOKEN = {"coding": 3.3, "data": 2.9, "ops": 2.2}
_CHARS_PER_TOKEN_LEAST = min(CHARS_PER_TOKEN.values())
# The shallowest depth a profile draws: below it a session is the short profile's anyway.
MIN_DEPTH_TOKENS = 2_000


class ContextProfileError(UsageError, ValueError):
    """A --context value that names no profile and is no P50[,P95]."""


@dataclass(frozen=True)
class ContextProfile:
    """A distribution of the deepest prompt per session, with where its figures come from."""

    name: str
    p50: int | None  # tokens; None: the sessions' own growth, no opening (the short profile)
    p95: int | None
    max_turns: int | None  # turns per session the recorded sessions take; None: --max-turns' default
    source: str

    @property
    def grows(self) -> bool:
        """Whether sessions open with reads and grow toward a drawn depth."""
        return self.p50 is not None

    def depth_for(self, seed: int) -> int | None:
        """Session `seed`'s deepest prompt in tokens (None for the short profile)."""
        if self.p50 is None or self.p95 is None:
            return None
        return self._depth(_standard_draw(seed))

    def _depth(self, z: float) -> int:
        """The depth at standard normal `z`: the same z gives every profile's session `seed` its
        depth, so a profile scaled by k draws k times the depths (cache_plan.py counts on it)."""
        assert self.p50 is not None and self.p95 is not None
        sigma = math.log(self.p95 / self.p50) / _Z95
        return max(MIN_DEPTH_TOKENS, round(math.exp(math.log(self.p50) + sigma * z)))

    def opening_chars(self, depth: int, family: str) -> int:
        """Characters of reads a session of `family` and `depth` tokens opens with."""
        ratio = CHARS_PER_TOKEN.get(family, _CHARS_PER_TOKEN_LEAST)
        return max(0, round((depth - min(TURN_GROWTH_TOKENS, depth // 4)) * ratio))

    def mean_depth(self, context_tokens: int | None) -> float | None:
        """The mean deepest prompt per session, each capped at the server's context: what one
        session holds in the KV pool at its deepest (None for the short profile)."""
        if not self.grows:
            return None
        cap = context_tokens or 1 << 62
        return statistics.fmean(min(cap, self._depth(z)) for z in _standard_draws())


def _standard_draw(seed: int) -> float:
    """Session `seed`'s standard normal draw, the same under every profile."""
    return random.Random(f"context-depth:{seed}").gauss(0.0, 1.0)


@functools.cache
def _standard_draws(n: int = 4000) -> tuple[float, ...]:
    """The draws of sessions 0..n-1: the mean depth of the first n sessions of any run."""
    return tuple(_standard_draw(seed) for seed in range(n))


SHORT = ContextProfile(
    "short",
    None,
    None,
    None,
    "dsv4bench's own sessions: `agents --concurrency 80 --duration 90` reached a deepest prompt per session of "
    "5,357 tokens at the median, 9,278 at most (80 sessions, ~450k tokens together)",
)
SWE = ContextProfile(
    "swe",
    23_840,
    69_274,
    36,
    "SWE-agent and OpenHands trajectories (15,000 sessions): deepest prompt per session 23,840 tokens at the "
    "median, 69,274 at p95, 89,876 at p99, over a median 36 turns",
)
CODING_AGENT = ContextProfile(
    "coding-agent",
    154_000,
    200_000,
    100,
    "recorded Claude Code and Codex use (TraceLab, 357k model calls): ~154k input tokens per call on average, "
    "96% from cache; past a 32k prefix each call appends ~700-950 new tokens. The per-call mean is taken as the "
    "median deepest prompt (a session's deepest is at least its calls' mean) and p95 as the 200k window the "
    "clients run in",
)
PROFILES: dict[str, ContextProfile] = {p.name: p for p in (SHORT, SWE, CODING_AGENT)}
DEFAULT = SHORT.name


def parse_context(text: str) -> ContextProfile:
    """`--context`: a profile's name, or `P50[,P95]` in tokens (`24000`, `24k,70k`)."""
    value = text.strip().lower()
    if value in PROFILES:
        return PROFILES[value]
    parts = [p.strip() for p in value.split(",")]
    if 1 <= len(parts) <= 2 and all(parts):
        try:
            figures = [_tokens(p) for p in parts]
        except ValueError:
            figures = []
        if figures:
            p50 = figures[0]
            p95 = figures[1] if len(figures) == 2 else round(p50 * _TAIL_RATIO)
            if p50 < MIN_DEPTH_TOKENS:
                raise ContextProfileError(
                    f"--context's median must be at least {MIN_DEPTH_TOKENS:,} tokens, got {p50:,}"
                )
            if p95 < p50:
                raise ContextProfileError(f"--context's P95 ({p95:,}) must not be below its P50 ({p50:,})")
            return ContextProfile(
                f"{p50},{p95}",
                p50,
                p95,
                None,
                f"given: deepest prompt per session {p50:,} at the median, {p95:,} at p95",
            )
    names = ", ".join(PROFILES)
    raise ContextProfileError(f"--context takes {names} or P50[,P95] in tokens (e.g. 24k,70k); got {text!r}")


def _tokens(text: str) -> int:
    """`24000`, `24k`, `1.5m` as a whole number of tokens; ValueError otherwise."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = float(text[:-1] if scale > 1 else text)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(text)
    return round(number * scale)
