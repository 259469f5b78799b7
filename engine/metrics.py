"""Prometheus metrics with SGLang's names and labels, so SGLang dashboards and the harness's
wedge checks read the bundled engine the same way (the harness reads them from dsv4bench/servers/dialect.py).

Gauges and engine counters are read from `engine.stats()` at scrape time by a custom collector
(nothing to keep in sync); latency histograms are observed by the server per request. Every
series carries `model_name` and `engine_type` ("unified"; in PD mode "router", "prefill" and
"decode", one per server). The PD queue gauges are 0 unless the engine's stats carry the
matching fields (`num_prefill_bootstrap_queue`, `num_prefill_inflight_queue` on the prefill
server, `num_decode_prealloc_queue`, `num_decode_transfer_queue` on the decode server; see
engine/pd/stats.py `PDStats`; the host-receive and deferred-release gauges have no counterpart
here); they are always present, as on an SGLang server.

The device pool and the prefix cache under SGLang's names (python/sglang/srt/observability/
metrics_collector.py): `sglang:max_total_num_tokens` (the pool, num_pages * page_size), its
split `sglang:kv_used_tokens` + `sglang:kv_evictable_tokens` + `sglang:kv_available_tokens`,
`sglang:evicted_tokens_total` (tokens whose pages eviction took off the device, to the host
tier or, without HiCache or with it full, nowhere; a /flush_cache is not counted) and
`sglang:cached_tokens_total` (each request's cached prompt tokens, counted when it ends).
With --hicache only, as SGLang creates them only with its hierarchical cache:
`sglang:hicache_host_used_tokens`, `sglang:hicache_host_total_tokens` and
`sglang:load_back_tokens_total` (tokens loaded back from the host tier, counted as each load
starts), beside our own `dsv4mini:hicache_*` series.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from .scheduler import KVPoolStats

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
LABELS = ("model_name", "engine_type")

# SGLang's bucket edges (seconds).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 120.0, 160.0)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.8,
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    150.0,
    200.0,
    250.0,
    300.0,
    350.0,
    500.0,
    1000.0,
)

# (metric name, help, EngineStats field or None for "always 0 here")
GAUGES: tuple[tuple[str, str, str | None], ...] = (
    ("sglang:num_running_reqs", "The number of running requests.", "num_running"),
    ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", "num_queued"),
    (
        "sglang:num_prefill_bootstrap_queue_reqs",
        "Requests in the prefill bootstrap queue (PD).",
        "num_prefill_bootstrap_queue",
    ),
    (
        "sglang:num_prefill_inflight_queue_reqs",
        "Requests in the prefill inflight queue (PD).",
        "num_prefill_inflight_queue",
    ),
    (
        "sglang:num_decode_prealloc_queue_reqs",
        "Requests in the decode prealloc queue (PD).",
        "num_decode_prealloc_queue",
    ),
    (
        "sglang:num_decode_transfer_queue_reqs",
        "Requests in the decode transfer queue (PD).",
        "num_decode_transfer_queue",
    ),
    (
        "sglang:num_decode_host_receive_queue_reqs",
        "Requests of the decode transfer queue staged through host memory (PD).",
        None,
    ),
    (
        "sglang:num_decode_deferred_kv_release_reqs",
        "Finished requests whose KV release waits for the prefill side (PD).",
        None,
    ),
    ("sglang:token_usage", "The token usage (fraction of KV pages in use).", "token_usage"),
    ("sglang:cache_hit_rate", "The prefix cache hit rate.", "cache_hit_rate"),
)
# The device pool, SGLang's names and help (python/sglang/srt/observability/metrics_collector.py,
# SchedulerMetricsCollector). (metric name, help, KVPoolStats field)
KV_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", "max_total_num_tokens"),
    ("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.", "used_tokens"),
    (
        "sglang:kv_evictable_tokens",
        "Number of evictable (radix-cached) token slots in the KV cache pool.",
        "evictable_tokens",
    ),
    ("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.", "available_tokens"),
)
# SGLang's RadixCacheMetricsCollector (same file); its help says GPU to CPU, but it counts every
# eviction from the device pool, with HiCache or without.
EVICTED = ("sglang:evicted_tokens", "The number of tokens evicted from GPU to CPU.")
# (metric name without _total, help, EngineStats field)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("sglang:num_requests", "The number of requests received.", "num_requests_total"),
    ("sglang:num_aborted_requests", "The number of aborted requests.", "num_aborted_total"),
    ("sglang:generation_tokens", "The number of generated tokens.", "gen_tokens_total"),
    ("sglang:prompt_tokens", "The number of prefill (prompt) tokens.", "prompt_tokens_total"),
    # SGLang's TokenizerMetricsCollector (same file), counted per request as it ends.
    ("sglang:cached_tokens", "Number of cached prompt tokens.", "cached_tokens_total"),
)

# Every family a server always exposes (histograms expose _bucket/_sum/_count samples under these);
# the HICACHE_* families come on top with --hicache.
METRIC_NAMES: tuple[str, ...] = (
    *(g[0] for g in GAUGES),
    "sglang:num_used_tokens",
    "sglang:gen_throughput",
    *(g[0] for g in KV_GAUGES),
    EVICTED[0],
    *(c[0] for c in COUNTERS),
    "sglang:time_to_first_token_seconds",
    "sglang:e2e_request_latency_seconds",
)


class _ThroughputWindow:
    """Generated tokens per second over the last `window` seconds of scrapes."""

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self.samples: collections.deque[tuple[float, int]] = collections.deque()
        self.lock = threading.Lock()

    def update(self, total: int, now: float) -> float:
        with self.lock:
            self.samples.append((now, total))
            while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
                self.samples.popleft()
            t0, n0 = self.samples[0]
            return (total - n0) / (now - t0) if now - t0 > 0 else 0.0


# The HiCache host tier (--hicache): first SGLang's series, which it creates only with its
# hierarchical cache (python/sglang/srt/observability/metrics_collector.py: the host gauges in
# SchedulerMetricsCollector, load_back_tokens in RadixCacheMetricsCollector), so a server
# without HiCache has none of them; then ours, under our own prefix so that no dashboard
# mistakes them for SGLang's. (metric name without _total, help, HiCacheStats field)
HICACHE_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "sglang:hicache_host_used_tokens",
        "Number of tokens currently used in the host KV cache.",
        "host_used_tokens",
    ),
    ("sglang:hicache_host_total_tokens", "Total capacity of the host KV cache in tokens.", "host_total_tokens"),
    ("dsv4mini:hicache_host_pages_used", "Host-tier pages holding a backed-up prefix page.", "host_pages_used"),
    ("dsv4mini:hicache_host_pages", "Host-tier capacity in pages.", "host_pages_total"),
)
HICACHE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("sglang:load_back_tokens", "The number of tokens loaded from CPU to GPU.", "load_back_tokens_total"),
    ("dsv4mini:hicache_loads", "Host-to-device loads started.", "loads_total"),
    ("dsv4mini:hicache_pages_loaded", "Pages loaded back from the host tier.", "pages_loaded_total"),
    ("dsv4mini:hicache_pages_backed_up", "Evicted pages backed up to the host tier.", "pages_backed_up_total"),
    ("dsv4mini:hicache_load_bytes", "Bytes loaded from the host tier.", "load_bytes_total"),
    (
        "dsv4mini:hicache_unguarded_index_k_reads",
        "Index-K reads that went ahead of a load in flight "
        "(the hicache-index-race fault; an upper bound on stale reads).",
        "unguarded_index_k_reads_total",
    ),
)


class EngineCollector(Collector):
    """Reads `stats()` once per scrape and turns it into SGLang's gauges and counters."""

    def __init__(self, stats: Callable[[], Any], labels: tuple[str, str], page_size: int | None = None) -> None:
        self.stats = stats
        self.labels = list(labels)
        self.page_size = page_size
        self.throughput = _ThroughputWindow()

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        for name, doc, attr in GAUGES:
            yield self._gauge(name, doc, float(getattr(s, attr, 0) if attr else 0))
        used = getattr(s, "pages_used", 0) * (self.page_size or 0)
        yield self._gauge("sglang:num_used_tokens", "The number of KV token slots in use.", float(used))
        gen = self.throughput.update(int(getattr(s, "gen_tokens_total", 0)), time.monotonic())
        yield self._gauge("sglang:gen_throughput", "The generation throughput (token/s).", gen)
        kv = getattr(s, "kv", KVPoolStats())
        for name, doc, attr in KV_GAUGES:
            yield self._gauge(name, doc, float(getattr(kv, attr)))
        yield self._counter(*EVICTED, float(kv.evicted_tokens_total))
        for name, doc, attr in COUNTERS:
            yield self._counter(name, doc, float(getattr(s, attr, 0)))
        hicache = getattr(s, "hicache", None)
        if hicache is not None:
            for name, doc, attr in HICACHE_GAUGES:
                yield self._gauge(name, doc, float(getattr(hicache, attr)))
            for name, doc, attr in HICACHE_COUNTERS:
                yield self._counter(name, doc, float(getattr(hicache, attr)))

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self.labels, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self.labels, value)
        return family


class ServerMetrics:
    """One server's registry: engine gauges/counters at scrape time, latency histograms here."""

    def __init__(
        self, stats: Callable[[], Any], model_name: str, engine_type: str = "unified", page_size: int | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = (model_name, engine_type)
        self.registry.register(EngineCollector(stats, labels, page_size))
        ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Time to first token (seconds).",
            LABELS,
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        )
        e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "End-to-end request latency (seconds).",
            LABELS,
            registry=self.registry,
            buckets=E2E_BUCKETS,
        )
        self._ttft = ttft.labels(*labels)
        self._e2e = e2e.labels(*labels)

    def observe_first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def observe_request(self, seconds: float) -> None:
        self._e2e.observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4) of this server's registry."""
        return generate_latest(self.registry)
