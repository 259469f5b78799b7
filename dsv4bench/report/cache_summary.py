"""summary.json's `cache` block: what KV cache pressure the run reached, and where each turn's
prompt prefix came from.

Pure: a History in, a dict out. The server side is servers/cache_pressure.py's reading of
metrics.jsonl (one CachePressure per scraped endpoint); the client side is read from the turns'
own usage: each answer says how many prompt tokens it found cached and, on SGLang asked for it,
how many of them came back from the host tier (`cached_tokens_details`). A figure nobody gave
is None, never 0, so "no eviction" and "cannot tell" read apart (DESIGN.md section 10).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dsv4bench.history.records import TurnRecord, TurnStatus, is_finite_number
from dsv4bench.history.run_folder import History
from dsv4bench.report.counting import distribution, outcome_counts, percentile, turn_end_wall_ns
from dsv4bench.servers.cache_pressure import CachePressure, cache_pressure

# Where a turn's prompt prefix came from, in the order the report lists them.
HOST, DEVICE, COMPUTED, UNKNOWN = "host", "device", "computed", "unknown"
PREFIX_SOURCES: tuple[str, ...] = (HOST, DEVICE, COMPUTED, UNKNOWN)
# CachePressure's fractions: kept as floats; every other figure is a count of tokens or requests.
_FRACTIONS = frozenset({"cache_hit_rate", "spec_accept_first", "spec_accept_min", "spec_accept_last"})


def _number(value: Any) -> float | None:
    """A figure a server reported, or None for one that is missing, negative or not a number."""
    return float(value) if is_finite_number(value) and value >= 0 else None


def _usage(turn: TurnRecord) -> dict[str, Any] | None:
    usage = turn.response.usage if turn.response else None
    return usage if isinstance(usage, dict) else None


def prompt_tokens(turn: TurnRecord) -> float | None:
    """The turn's prompt tokens as its answer's usage reported them; None where it reported none."""
    usage = _usage(turn)
    return _number(usage.get("prompt_tokens")) if usage else None


def _host_tokens(turn: TurnRecord) -> float | None:
    details = turn.response.cached_tokens_details if turn.response else None
    return _number(details.get("host")) if isinstance(details, dict) else None


def cached_tokens(turn: TurnRecord) -> float | None:
    """Prompt tokens the server found cached for the turn: usage's
    `prompt_tokens_details.cached_tokens`, else the sum of SGLang's split by tier; None where the
    answer gave neither."""
    usage = _usage(turn)
    details = usage.get("prompt_tokens_details") if usage else None
    cached = _number(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is not None:
        return cached
    tiers = turn.response.cached_tokens_details if turn.response else None
    if not isinstance(tiers, dict):
        return None
    parts = [n for v in tiers.values() if (n := _number(v)) is not None]
    return sum(parts) if parts else None


def prefix_source(turn: TurnRecord) -> str:
    """Where the turn's prompt prefix came from: `host` where SGLang said part of it was loaded
    back from the host tier, `device` where some of it was cached and none came from the host
    (or the server does not split by tier), `computed` where nothing was cached, `unknown` where
    the answer reported no usage."""
    host = _host_tokens(turn)
    if host:
        return HOST
    cached = cached_tokens(turn)
    if cached:
        return DEVICE
    if cached is not None or prompt_tokens(turn) is not None:
        return COMPUTED
    return UNKNOWN


def _spread(values: list[float]) -> dict[str, Any]:
    """distribution() with the p95 the recorded agent sessions are described by (DESIGN.md 10)."""
    return {**distribution(values), "p95": percentile(values, 95)}


def working_set_peak(turns: list[TurnRecord]) -> int | None:
    """The most tokens the sessions held at once: at each turn's end, the sum over the sessions
    open then (seen, and not past their last turn) of each one's latest prompt + completion. What
    the live sessions ask the pool to keep; None where no turn reported its prompt tokens."""
    last_end: dict[str, int] = {}
    for t in turns:
        last_end[t.session] = max(last_end.get(t.session, 0), turn_end_wall_ns(t))
    steps: list[tuple[int, int, str, float]] = []
    for t in turns:
        prompt = prompt_tokens(t)
        if prompt is None:
            continue
        usage = _usage(t) or {}
        held = prompt + (_number(usage.get("completion_tokens")) or 0.0)
        steps.append((turn_end_wall_ns(t), 0, t.session, held))
    if not steps:
        return None
    # NOTE: a session leaves only after every turn ending at its last instant is counted (1 > 0).
    steps += [(end, 1, session, 0.0) for session, end in last_end.items()]
    # A running total, not a sum over the open sessions at each step: a proxy run's thousands of
    # sessions would make that quadratic. Token counts are whole, so the total stays exact.
    held_by: dict[str, float] = {}
    total = peak = 0.0
    for _, leaving, session, held in sorted(steps):
        total -= held_by.pop(session, 0.0)
        if not leaving:
            held_by[session] = held
            total += held
            peak = max(peak, total)
    return round(peak)


def _figure(name: str, value: Any) -> Any:
    """One CachePressure figure as summary.json keeps it: counts whole, no NaN."""
    if not isinstance(value, float):
        return value
    if not is_finite_number(value):
        return None
    return int(value) if name not in _FRACTIONS and value.is_integer() else value


def server_block(pressure: CachePressure) -> dict[str, Any]:
    """One server's figures: every CachePressure field but its timeline (the plot's), and whether
    eviction and host-tier reads were reached (None: the server does not export the counter)."""
    figures = {
        f.name: _figure(f.name, getattr(pressure, f.name)) for f in dataclasses.fields(pressure) if f.name != "timeline"
    }
    return {**figures, "eviction_reached": pressure.eviction_reached, "host_reads_reached": pressure.host_reads_reached}


def any_reached(flags: list[bool | None]) -> bool | None:
    """The run's answer from its servers': True where any reached it, False where some server
    says and none reached it, None where no server says."""
    if any(f is True for f in flags):
        return True
    return False if any(f is False for f in flags) else None


def _facts(history: History) -> dict[str, Any]:
    server = history.run.get("server")
    return server if isinstance(server, dict) else {}


def pool_block(history: History, servers: dict[str, CachePressure]) -> dict[str, Any] | None:
    """The device KV pool in tokens and where the figure came from: the server's facts at the
    start (preflight), else the --cache-pressure plan's, else the largest pool a scrape gave."""
    facts = _facts(history)
    found = facts.get("kv_pool")
    if isinstance(found, dict) and is_finite_number(found.get("tokens")) and found["tokens"] > 0:
        return {"tokens": int(found["tokens"]), "source": str(found.get("source") or "the server's facts")}
    plan = facts.get("cache_plan")
    if isinstance(plan, dict) and is_finite_number(plan.get("pool_tokens")) and plan["pool_tokens"] > 0:
        return {"tokens": int(plan["pool_tokens"]), "source": str(plan.get("pool_source") or "the cache plan")}
    scraped = [(p.kv_total_tokens, ep) for ep, p in servers.items() if p.kv_total_tokens is not None]
    if not scraped:
        return None
    tokens, endpoint = max(scraped)
    return {"tokens": int(tokens), "source": f"scraped from {endpoint}"}


def cache_block(history: History) -> dict[str, Any] | None:
    """summary.json's `cache`; None for a run with no turns and no metrics."""
    if not history.turns and not history.metrics:
        return None
    servers = cache_pressure(history.metrics)
    pool = pool_block(history, servers)
    plan = _facts(history).get("cache_plan")
    ok = [t for t in history.turns if t.status is TurnStatus.OK]
    by_source: dict[str, list[TurnRecord]] = {s: [] for s in PREFIX_SOURCES}
    for t in ok:
        by_source[prefix_source(t)].append(t)
    deepest: dict[str, float] = {}
    for t in ok:
        if (prompt := prompt_tokens(t)) is not None:
            deepest[t.session] = max(deepest.get(t.session, 0.0), prompt)
    peak = working_set_peak(history.turns)
    return {
        "pool": pool,
        "plan": plan if isinstance(plan, dict) else None,
        "eviction_reached": any_reached([p.eviction_reached for p in servers.values()]),
        "host_reads_reached": any_reached([p.host_reads_reached for p in servers.values()]),
        "servers": {ep: server_block(p) for ep, p in servers.items()},
        # Completed turns only: a failed turn's answer, and so its usage, never came.
        "prefix_sources": {s: outcome_counts(turns) for s, turns in by_source.items()},
        "cached_tokens_per_turn": _spread([c for t in ok if (c := cached_tokens(t)) is not None]),
        "deepest_prompt_per_session": _spread(list(deepest.values())),
        "working_set_peak": peak,
        "working_set_over_pool": peak / pool["tokens"] if peak is not None and pool else None,
    }
