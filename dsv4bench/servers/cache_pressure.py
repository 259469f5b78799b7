"""What KV cache pressure a run reached on each server, read from its metrics.jsonl records.

Pure: the records in (monitor.MetricSample.as_dict), one `CachePressure` per endpoint out. Every
figure is the server's own (the names are dialect.py's "KV cache and its tiers"): a counter's
figure is how much it rose over the run, a gauge's its peak or last value. A figure the server
does not export is None, never 0, so "no eviction" and "cannot tell" read apart. A server with
several data-parallel ranks is read as one deployment: their figures summed per scrape, the
tensor-parallel copies of a rank counted once (dialect.per_rank).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dsv4bench.servers import dialect as d
from dsv4bench.servers.dialect import metric_name, per_rank, series_labels
from dsv4bench.servers.kv_pool import pool_from_metrics

# The most points a run's timeline keeps, taken evenly over its scrapes: enough for a plot.
TIMELINE_POINTS = 200
# (seconds since the first scrape, device KV used, tokens evicted so far, tokens loaded back so far)
Point = tuple[float, float | None, float | None, float | None]


def _kv_pool(labels: dict[str, str]) -> bool:
    """The load-back series of the device KV pool: where a release counts by host pool, the
    others (swa, mamba) count the same tokens again."""
    return labels.get(d.LOAD_BACK_POOL_LABEL, d.LOAD_BACK_KV_POOL) == d.LOAD_BACK_KV_POOL


class _Counter:
    """One counter over a run: how much each of its series rose since the endpoint's first good
    scrape. A series that fell was reset (the server restarted): its new value is added from zero,
    so a restart reads as neither negative pressure nor counted twice. The fold's own state."""

    def __init__(self, names: Iterable[str], keep: Callable[[dict[str, str]], bool] | None = None) -> None:
        self.names = tuple(names)
        self.keep = keep
        self.last: dict[str, float] = {}
        self.rise: dict[str, float] = {}
        self.resets = 0  # scrapes at which one of its series fell
        self.seen = False

    def feed(self, values: Mapping[str, float], first: bool) -> bool:
        """Reads one scrape; whether one of its series fell."""
        fell = False
        for series, value in values.items():
            if metric_name(series) not in self.names or not math.isfinite(value):
                continue
            if self.keep is not None and not self.keep(series_labels(series)):
                continue
            self.seen = True
            before = self.last.get(series)
            if before is None:
                # SGLang creates a labelled series at its first increment: one that shows up after
                # the first scrape rose from zero during the run.
                step = 0.0 if first else value
            elif value < before:
                step, fell = value, True
            else:
                step = value - before
            self.rise[series] = self.rise.get(series, 0.0) + step
            self.last[series] = value
        self.resets += fell
        return fell

    def restarted(self, values: Mapping[str, float]) -> None:
        """The server restarted at this scrape: a series it no longer shows starts again from zero
        when it shows up (SGLang creates it anew at its next increment)."""
        self.last = {s: v for s, v in self.last.items() if s in values}

    def total(self) -> float:
        """The rise over the run, for the deployment: ranks summed, a rank's copies once."""
        return sum(per_rank(self.rise, self.names, self.keep).values())


def _sum(values: Mapping[str, float], *names: str) -> float | None:
    ranks = per_rank(values, names)
    return sum(ranks.values()) if ranks else None


def _mean(values: Mapping[str, float], *names: str) -> float | None:
    """A fraction's value for the deployment: the mean over its ranks (their pools are alike)."""
    ranks = per_rank(values, names)
    return sum(ranks.values()) / len(ranks) if ranks else None


def _peak(seen: list[float | None]) -> float | None:
    known = [v for v in seen if v is not None]
    return max(known) if known else None


def _last(seen: list[float | None]) -> float | None:
    return next((v for v in reversed(seen) if v is not None), None)


def _downsample(points: list[Point], n: int = TIMELINE_POINTS) -> tuple[Point, ...]:
    """At most `n` points taken evenly, the first and the last among them."""
    if len(points) <= n:
        return tuple(points)
    return tuple(points[round(i * (len(points) - 1) / (n - 1))] for i in range(n))


@dataclass(frozen=True)
class CachePressure:
    """The pressure one server's KV cache reached over a run. Token figures are the deployment's
    (data-parallel ranks summed); None where the server does not export the figure."""

    endpoint: str
    evicted_tokens: float | None  # tokens evicted from the device pool over the run
    load_back_tokens: float | None  # tokens loaded back from the host tier (None: HiCache off)
    preemptions: float | None  # requests preempted (vLLM) or retracted (SGLang) for want of pool
    host_used_tokens_max: float | None
    host_total_tokens: float | None
    kv_used_tokens_max: float | None  # device KV held by running requests, its peak
    kv_total_tokens: float | None  # the device pool, where a metric gives it
    evictable_tokens_max: float | None  # cached KV no request holds, its peak
    cached_tokens: float | None  # prompt tokens served from cache over the run
    prompt_tokens: float | None
    # cached / prompt over the run where the counters exist (vLLM: prefix-cache hits / queries),
    # else the server's last gauge.
    cache_hit_rate: float | None
    spec_accept_first: float | None
    spec_accept_min: float | None
    spec_accept_last: float | None
    counter_resets: int  # how often a counter read here fell (a restart): once per counter and scrape
    scrapes: int  # the good scrapes read
    timeline: tuple[Point, ...]

    @property
    def eviction_reached(self) -> bool | None:
        """Whether the run evicted from the device pool; None where the server does not say."""
        return None if self.evicted_tokens is None else self.evicted_tokens > 0

    @property
    def host_reads_reached(self) -> bool | None:
        """Whether the run read KV back from the host tier; None where there is no host tier."""
        return None if self.load_back_tokens is None else self.load_back_tokens > 0


# Every name read, so each scrape is cut down to its few series once.
_READ = frozenset(
    {
        d.SGLANG_POOL,
        d.SGLANG_KV_USED,
        d.SGLANG_NUM_USED,
        d.SGLANG_TOKEN_USAGE,
        d.SGLANG_EVICTABLE,
        d.SGLANG_EVICTED,
        d.SGLANG_LOAD_BACK,
        d.SGLANG_HOST_USED,
        d.SGLANG_HOST_TOTAL,
        d.SGLANG_CACHED_TOKENS,
        d.SGLANG_PROMPT_TOKENS,
        d.SGLANG_CACHE_HIT_RATE,
        d.SGLANG_SPEC_ACCEPT_RATE,
        d.SGLANG_SPEC_ACCEPT_LENGTH,
        d.SGLANG_RETRACTED,
        d.VLLM_CACHE_CONFIG,
        *d.VLLM_KV_USAGE,
        *d.VLLM_PREFIX_QUERIES,
        *d.VLLM_PREFIX_HITS,
        d.VLLM_PROMPT_TOKENS,
        d.VLLM_SPEC_ACCEPTED,
        d.VLLM_SPEC_DRAFT,
        d.VLLM_PREEMPTIONS,
    }
)


def _kv_used(values: Mapping[str, float], pool: float | None) -> float | None:
    """Device KV held by running requests: SGLang's token gauges, else a usage fraction of the
    pool (vLLM's only figure)."""
    used = _sum(values, d.SGLANG_KV_USED)
    if used is None:
        used = _sum(values, d.SGLANG_NUM_USED)
    if used is None:
        usage = _mean(values, *d.VLLM_KV_USAGE, d.SGLANG_TOKEN_USAGE)
        used = usage * pool if usage is not None and pool is not None else None
    return used


def _rates(accepted: list[float], drafted: list[float]) -> list[float]:
    """vLLM's acceptance rate over each interval between scrapes that drafted tokens."""
    pairs = zip(zip(accepted, accepted[1:]), zip(drafted, drafted[1:]))
    return [(a1 - a0) / (d1 - d0) for (a0, a1), (d0, d1) in pairs if d1 > d0]


def _one(endpoint: str, scrapes: list[tuple[int, dict[str, float]]]) -> CachePressure:
    evicted, load_back = _Counter((d.SGLANG_EVICTED,)), _Counter((d.SGLANG_LOAD_BACK,), _kv_pool)
    cached = _Counter((d.SGLANG_CACHED_TOKENS, *d.VLLM_PREFIX_HITS))
    queries = _Counter(d.VLLM_PREFIX_QUERIES)
    prompt = _Counter((d.SGLANG_PROMPT_TOKENS, d.VLLM_PROMPT_TOKENS))
    accepted, drafted = _Counter((d.VLLM_SPEC_ACCEPTED,)), _Counter((d.VLLM_SPEC_DRAFT,))
    preempted = _Counter((d.VLLM_PREEMPTIONS, d.SGLANG_RETRACTED))
    counters = (evicted, load_back, cached, queries, prompt, accepted, drafted, preempted)
    cut = [(t, {s: v for s, v in values.items() if metric_name(s) in _READ}) for t, values in scrapes]
    pools = [pool_from_metrics(values) for _, values in cut]
    pool = _last([p.tokens if p else None for p in pools])
    used: list[float | None] = []
    evictable: list[float | None] = []
    host_used: list[float | None] = []
    host_total: list[float | None] = []
    spec: list[float] = []
    curve: list[tuple[float, float | None, float, float]] = []
    acc_so_far: list[float] = []
    draft_so_far: list[float] = []
    marks = {d.SGLANG_EVICTABLE: False, d.SGLANG_HOST_TOTAL: False}
    for i, ((t_ns, values), scrape_pool) in enumerate(zip(cut, pools)):
        fell = [counter.feed(values, first=i == 0) for counter in counters]
        if any(fell):
            for counter in counters:
                counter.restarted(values)
        for name in marks:
            marks[name] = marks[name] or any(metric_name(s) == name for s in values)
        used.append(_kv_used(values, scrape_pool.tokens if scrape_pool else pool))
        evictable.append(_sum(values, d.SGLANG_EVICTABLE))
        host_used.append(_sum(values, d.SGLANG_HOST_USED))
        host_total.append(_sum(values, d.SGLANG_HOST_TOTAL))
        rate, length = _mean(values, d.SGLANG_SPEC_ACCEPT_RATE), _mean(values, d.SGLANG_SPEC_ACCEPT_LENGTH)
        if rate is not None and (length is None or length > 0):
            spec.append(rate)
        acc_so_far.append(accepted.total())
        draft_so_far.append(drafted.total())
        curve.append(((t_ns - cut[0][0]) / 1e9, used[-1], evicted.total(), load_back.total()))
    # Where a release creates a counter's series at its first increment, the marker of that
    # release (dialect.py) tells "none yet" from "not exported".
    evicted_known = evicted.seen or marks[d.SGLANG_EVICTABLE]
    load_back_known = load_back.seen or marks[d.SGLANG_HOST_TOTAL]
    preempted_known = preempted.seen or marks[d.SGLANG_EVICTABLE]
    if drafted.seen:
        spec = _rates(acc_so_far, draft_so_far)
    hit_rate = _last([_mean(values, d.SGLANG_CACHE_HIT_RATE) for _, values in cut])
    if queries.seen and queries.total() > 0:
        hit_rate = cached.total() / queries.total()
    elif cached.seen and prompt.seen and prompt.total() > 0:
        hit_rate = cached.total() / prompt.total()
    timeline = [(t, kv, ev if evicted_known else None, lb if load_back_known else None) for t, kv, ev, lb in curve]
    return CachePressure(
        endpoint=endpoint,
        evicted_tokens=evicted.total() if evicted_known else None,
        load_back_tokens=load_back.total() if load_back_known else None,
        preemptions=preempted.total() if preempted_known else None,
        host_used_tokens_max=_peak(host_used),
        host_total_tokens=_last(host_total),
        kv_used_tokens_max=_peak(used),
        kv_total_tokens=float(pool) if pool is not None else None,
        evictable_tokens_max=_peak(evictable),
        cached_tokens=cached.total() if cached.seen else None,
        prompt_tokens=prompt.total() if prompt.seen else None,
        cache_hit_rate=hit_rate,
        spec_accept_first=spec[0] if spec else None,
        spec_accept_min=min(spec) if spec else None,
        spec_accept_last=spec[-1] if spec else None,
        counter_resets=sum(c.resets for c in counters),
        scrapes=len(cut),
        timeline=_downsample(timeline),
    )


def _t_ns(record: Mapping[str, Any]) -> int | None:
    """A record's time: its monotonic clock, else its wall clock."""
    for key in ("t_ns", "t_wall_ns"):
        t = record.get(key)
        if isinstance(t, int) and not isinstance(t, bool):
            return t
    return None


def cache_pressure(records: Iterable[dict[str, Any]]) -> dict[str, CachePressure]:
    """The cache pressure each endpoint's server reached, from a run's metrics.jsonl records, by
    endpoint in the order each first appears. A failed scrape (`ok` false, no values) is skipped,
    as is a record that is no scrape; an endpoint whose every scrape failed reads with no figures
    (`scrapes` 0)."""
    by_endpoint: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for record in records:
        endpoint = record.get("endpoint") if isinstance(record, dict) else None
        if not isinstance(endpoint, str):
            continue
        scrapes = by_endpoint.setdefault(endpoint, [])
        values, t_ns = record.get("values"), _t_ns(record)
        if record.get("ok") is True and isinstance(values, dict) and t_ns is not None:
            numbers = {
                s: float(v) for s, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            scrapes.append((t_ns, numbers))
    return {endpoint: _one(endpoint, scrapes) for endpoint, scrapes in by_endpoint.items()}
