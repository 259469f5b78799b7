"""`--cache-pressure X`: size a run so that its sessions' working set is X times the server's KV pool.

The working set is what the live sessions hold in the device pool at their deepest: concurrency
times the mean deepest prompt per session (each capped at the server's context). Past the pool,
every round of turns must push at least the excess out of the device pool, and where the server
keeps a host tier (HiCache) those prefixes come back from it: the path a host-tier race needs.

The plan keeps the user's concurrency. It keeps a context profile that already reaches X and
scales a profile's depths up (P50 and P95 together, the recorded shape kept) until it does; with
the default short profile it takes the SWE-agent trajectories' shape, scaled to X. A plan that
needs sessions deeper than the server's context at this concurrency is refused in one line.
Pure: the pool comes in as a number, the plan goes out as data.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4bench.errors import UsageError
from dsv4bench.harness.context_profile import SWE, ContextProfile

if TYPE_CHECKING:
    from dsv4bench.harness.config import RunConfig

# The deepest scale tried: 2^20 times a profile's depths is far past any server's context.
_MAX_SCALE = float(1 << 20)
_BISECTIONS = 40


class CachePlanError(UsageError, ValueError):
    """A pressure that cannot be reached: the line the CLI prints before exiting 2."""


@dataclass(frozen=True)
class CachePlan:
    """What the run will do to the pool, said before the load starts."""

    pressure: float  # X asked
    pool_tokens: int
    pool_source: str
    concurrency: int
    context_tokens: int | None
    profile: ContextProfile  # the profile the sessions draw from (scaled where it had to be)
    mean_depth: float  # tokens a session holds at its deepest, on average
    sessions: int | None  # sessions the run plays; None: bounded by --duration

    @property
    def working_set(self) -> float:
        return self.concurrency * self.mean_depth

    @property
    def reached(self) -> float:
        """The working set over the pool: at least `pressure`."""
        return self.working_set / self.pool_tokens

    @property
    def evicted_per_round(self) -> float:
        """Tokens that must leave the device pool each time every live session takes a turn."""
        return max(0.0, self.working_set - self.pool_tokens)

    def lines(self) -> list[str]:
        """The plan as the CLI prints it before the load."""
        context = f"{self.context_tokens:,}" if self.context_tokens else "unknown"
        return [
            f"cache plan: KV pool {self.pool_tokens:,} tokens ({self.pool_source}); server context {context}",
            f"  sessions: {self.concurrency} at once, context profile {self.profile.name} "
            f"(deepest prompt p50 {self.profile.p50:,}, p95 {self.profile.p95:,} tokens), "
            f"{self.mean_depth:,.0f} tokens each at their deepest on average",
            f"  working set {self.working_set:,.0f} tokens = {self.reached:.2f}x the pool (asked {self.pressure:g}x): "
            f"each round of turns must evict at least {self.evicted_per_round:,.0f} tokens from the device pool",
        ]

    def to_json(self) -> dict[str, object]:
        """What run.json keeps of the plan (the report's pressure section reads it)."""
        return {
            "pressure": self.pressure,
            "pool_tokens": self.pool_tokens,
            "pool_source": self.pool_source,
            "concurrency": self.concurrency,
            "context_tokens": self.context_tokens,
            "context": self.profile.name,
            "mean_depth": round(self.mean_depth),
            "working_set": round(self.working_set),
            "reached": round(self.reached, 3),
            "sessions": self.sessions,
        }


def plan_cache_pressure(
    pressure: float,
    pool_tokens: int,
    pool_source: str,
    concurrency: int,
    context_tokens: int | None,
    profile: ContextProfile,
    max_tokens: int,
    sessions: int | None,
) -> CachePlan:
    """The run that puts `pressure` times `pool_tokens` in the live sessions, or CachePlanError."""
    if not math.isfinite(pressure) or pressure <= 0:
        raise CachePlanError(f"--cache-pressure must be a positive number, got {pressure:g}")
    if pool_tokens < 1:
        raise CachePlanError(f"the KV pool must be at least 1 token, got {pool_tokens}")
    need = pressure * pool_tokens / concurrency  # mean deepest prompt per session
    deepest = (context_tokens - max_tokens) if context_tokens else None
    if deepest is not None and deepest < need:
        raise CachePlanError(
            f"--cache-pressure {pressure:g} needs {pressure * pool_tokens:,.0f} tokens in {concurrency} sessions at "
            f"once ({need:,.0f} each), past the server's context of {context_tokens:,} tokens (less --max-tokens "
            f"{max_tokens:,}): raise --concurrency to at least {math.ceil(pressure * pool_tokens / deepest)}"
        )
    base = profile if profile.grows else SWE
    chosen = base
    mean = base.mean_depth(deepest) or 0.0
    if mean < need or not profile.grows:
        chosen = _scaled(base, _scale_for(base, need, deepest))
        mean = chosen.mean_depth(deepest) or 0.0
    return CachePlan(
        pressure,
        pool_tokens,
        pool_source,
        concurrency,
        context_tokens,
        chosen,
        mean,
        max(sessions or 0, concurrency) if sessions is not None else None,
    )


def _scaled(profile: ContextProfile, scale: float) -> ContextProfile:
    assert profile.p50 is not None and profile.p95 is not None
    p50, p95 = round(profile.p50 * scale), round(profile.p95 * scale)
    return ContextProfile(
        f"{p50},{p95}",
        p50,
        p95,
        profile.max_turns,
        f"{profile.name} scaled by {scale:.3g} to reach the asked pressure ({profile.source})",
    )


def _scale_for(profile: ContextProfile, need: float, cap: int | None) -> float:
    """The scale of `profile`'s depths whose capped mean is `need` (bisection: the capped mean
    rises with the scale, and flattens at the cap)."""
    lo, hi = 1e-3, _MAX_SCALE
    for _ in range(_BISECTIONS):
        mid = math.sqrt(lo * hi)
        if (_scaled(profile, mid).mean_depth(cap) or 0.0) < need:
            lo = mid
        else:
            hi = mid
    return hi


def plan_run(config: RunConfig, facts: dict[str, Any]) -> tuple[RunConfig, CachePlan] | None:
    """`config` sized for its --cache-pressure on the server `facts` describe (preflight's), and
    the plan; None without --cache-pressure. CachePlanError where the pool is unknown or the
    pressure cannot be reached."""
    if config.cache_pressure is None:
        return None
    if config.kv_pool_tokens is not None:
        pool, source = config.kv_pool_tokens, "--kv-pool-tokens"
    elif isinstance(found := facts.get("kv_pool"), dict) and isinstance(found.get("tokens"), int):
        pool, source = found["tokens"], str(found.get("source") or "the server")
    else:
        raise CachePlanError(
            "--cache-pressure: the server does not say its KV pool (no max_total_num_tokens in /get_server_info, "
            "no vllm:cache_config_info in /metrics): give it with --kv-pool-tokens N"
        )
    context = config.context_length or facts.get("context_length")
    plan = plan_cache_pressure(
        config.cache_pressure,
        pool,
        source,
        config.concurrency,
        context if isinstance(context, int) else None,
        config.context_profile,
        config.max_tokens,
        config.sessions,
    )
    sized = dataclasses.replace(
        config,
        context=plan.profile.name,
        max_turns=config.max_turns or plan.profile.max_turns,
        sessions=plan.sessions,
    )
    return sized, plan
