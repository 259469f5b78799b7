"""The servers' metrics dialects: every SGLang, vLLM and SGLang-router name the harness reads.

The monitor, the wedge detector, `probe`, `watch`, the role reader and the preflight name no
metric themselves; they read it here. A series is `name` or `name{label="v",...}` as the
monitor keys it (monitor.py); a gauge or counter is judged by its name, whatever its labels.

Servers renamed their metrics between releases. Every reader accepts each generation's names,
so nothing is judged differently by release; `dialect_of` tells from one scrape which dialect
and generation a server speaks, for the record of the run. The names are the servers' own:
SGLang's python/sglang/srt/metrics/collector.py (later observability/metrics_collector.py),
vLLM's vllm/v1/metrics/loggers.py and kv_connector/v1/nixl stats, and the router's
sgl-router/src/metrics.rs (later sgl-model-gateway/src/observability/metrics.rs).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

SGLANG = "sglang:"
VLLM = "vllm:"
# TensorRT-LLM's trtllm-serve answers /metrics with a JSON list of iteration stats, not Prometheus
# text (tensorrt_llm/serve/openai_server.py, get_iteration_stats). The monitor reads the latest
# iteration's fields as series named `trtllm:<field>` (monitor.parse_metrics), so every reader
# here judges them as it judges the others.
TRTLLM = "trtllm:"
# SGLang's router (`sglang-router`, the model gateway): `smg_`, `sgl_router_` in older releases.
SMG, SGL_ROUTER = "smg_", "sgl_router_"
ROUTER_PREFIXES = (SMG, SGL_ROUTER)
# A /metrics page is a serving engine's when it carries one of these.
SERVER_METRIC_PREFIXES = (SGLANG, VLLM, *ROUTER_PREFIXES)

# --- queue gauges ---------------------------------------------------------------------------
# The current names. SGLang's PD pipeline: prefill bootstrap -> waiting -> running -> inflight
# (KV sent); decode prealloc -> transfer (KV received) -> waiting -> running -> deferred release.
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_WAITING = "sglang:num_queue_reqs"
BOOTSTRAP = "sglang:num_prefill_bootstrap_queue_reqs"
INFLIGHT = "sglang:num_prefill_inflight_queue_reqs"
PREALLOC = "sglang:num_decode_prealloc_queue_reqs"
TRANSFER = "sglang:num_decode_transfer_queue_reqs"
# The part of the transfer queue whose KV is staged through host memory: a stuck one shows in
# both gauges.
HOST_RECEIVE = "sglang:num_decode_host_receive_queue_reqs"
# Finished requests whose KV pages are held until the prefill side acknowledges the transfer
# drained: stuck above 0, they are pages that never come back.
DEFERRED_RELEASE = "sglang:num_decode_deferred_kv_release_reqs"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
# TensorRT-LLM's iteration stats: requests in the batch, and requests queued for it.
TRTLLM_RUNNING = "trtllm:numActiveRequests"
TRTLLM_WAITING = "trtllm:numQueuedRequests"
# Its iteration counter: it moves only while the executor steps requests (an idle executor
# makes no iterations, a hung one neither), so it is its progress counter.
TRTLLM_ITER = "trtllm:iter"
# The fields of one iteration's stats read as series, each to its name.
TRTLLM_FIELDS = {"numActiveRequests": TRTLLM_RUNNING, "numQueuedRequests": TRTLLM_WAITING, "iter": TRTLLM_ITER}

RUNNING = (SGLANG_RUNNING, VLLM_RUNNING, TRTLLM_RUNNING)
WAITING = (SGLANG_WAITING, VLLM_WAITING, TRTLLM_WAITING)

# Every gauge a wedge check reads, in display order, with the stage it measures: the one word a
# narrow column shows (watch, probe) whatever the server calls it. Nine characters at most.
STAGES: dict[str, str] = {
    SGLANG_RUNNING: "running",
    SGLANG_WAITING: "waiting",
    BOOTSTRAP: "bootstrap",
    INFLIGHT: "inflight",
    PREALLOC: "prealloc",
    TRANSFER: "transfer",
    HOST_RECEIVE: "host recv",
    DEFERRED_RELEASE: "release",
    VLLM_RUNNING: "running",
    VLLM_WAITING: "waiting",
    TRTLLM_RUNNING: "running",
    TRTLLM_WAITING: "waiting",
}
QUEUE_GAUGES = tuple(STAGES)

# Names older SGLang releases give the same gauges: old name -> current name.
PREFILL_PREALLOC = "sglang:num_prefill_prealloc_queue_reqs"  # the bootstrap queue until PR #24341 (2026-05)
INFIGHT = "sglang:num_prefill_infight_queue_reqs"  # the inflight queue, misspelt until PR #7317 (2025-06)
OLD_NAMES: dict[str, str] = {PREFILL_PREALLOC: BOOTSTRAP, INFIGHT: INFLIGHT}

# SGLang with priority scheduling exports each queue gauge as the total under `priority=""`
# plus one series per priority class (`priority="1"`, ...) that add up to it: only the total is
# read, or every request would count twice.
PRIORITY_LABEL = "priority"

# --- servers and ranks -------------------------------------------------------------------------
# SGLang's label for a server's part in a PD deployment ("prefill", "decode", ...). Releases
# before PR #18552 (2026-02) label every server "unified", PD workers too (UNIFIED_LABEL_UNSURE).
ENGINE_TYPE_LABEL = "engine_type"
# Labels that name the server, not a part of it: every series of a server carries the same ones.
SERVER_LABELS = frozenset({"model_name", ENGINE_TYPE_LABEL})
# A server with several ranks exposes one series per rank: SGLang one per scheduler, labelled
# `tp_rank`, `pp_rank`, `moe_ep_rank` and, with data-parallel attention, `dp_rank`; vLLM V1 one
# per engine core, labelled `engine`. The wedge checks judge each rank's series, not the sum per
# server: a data-parallel rank is a scheduler with its own queues, requests never move between
# ranks, and a sum lets a rank whose queue moves (draining, or going up and down as transfers
# are retried) hide one that is stuck. Tensor-parallel ranks of one group report copies of one
# queue (SGLang reports from attention-TP rank 0 unless --enable-metrics-for-all-schedulers):
# the same value judged twice, never another verdict. Views of one number per gauge sum them.
VLLM_ENGINE_LABEL = "engine"

# --- counters ---------------------------------------------------------------------------------
# Counters end in `_total` in every dialect.
COUNTER_SUFFIX = "_total"
# Progress: the counters that move only when requests do (finish, abort, take in or put out
# tokens). Not every counter: vLLM exports `process_cpu_seconds_total` and
# `python_gc_collections_total`, newer SGLang `scheduler_loop_iterations_total`, which tick
# while nothing moves, and a failure counter rising is no progress either.
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens_total"  # counted when a request finishes
# Tokens by `mode` (prefill_compute, prefill_cache, decode), counted on each log interval.
SGLANG_REALTIME_TOKENS = "sglang:realtime_tokens_total"
PROGRESS_COUNTERS = frozenset(
    {
        "sglang:num_requests_total",
        "sglang:num_aborted_requests_total",
        "sglang:prompt_tokens_total",
        "sglang:cached_tokens_total",
        SGLANG_GENERATION_TOKENS,
        SGLANG_REALTIME_TOKENS,
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        TRTLLM_ITER,
    }
)
# `sglang:generation_tokens_total`, `vllm:generation_tokens_total`.
GENERATION_TOKENS_SUFFIX = "generation_tokens_total"
# Requests that failed between the parts of a deployment, or had to be retried there.
FAILURE_COUNTERS = frozenset(
    {
        "sglang:num_bootstrap_failed_reqs_total",
        "sglang:num_transfer_failed_reqs_total",
        "vllm:nixl_num_failed_transfers_total",
        "vllm:nixl_num_failed_notifications_total",
        "vllm:nixl_num_kv_expired_reqs_total",
        "smg_worker_retries_total",
        "smg_worker_retries_exhausted_total",
        "sgl_router_retries_total",
        "sgl_router_retries_exhausted_total",
    }
)

# --- the KV cache and its tiers -----------------------------------------------------------------
# What kv_pool.py reads a server's device pool from and cache_pressure.py the pressure a run
# reached. SGLang's names are from observability/metrics_collector.py (metrics/collector.py
# before): its scheduler gauges carry the rank labels above; its radix cache's counters
# (RadixCacheMetricsCollector) carry `cache_type` and, in newer releases, `tp_rank`, `pp_rank`
# and `dp_rank` (before those, the multiprocess registry summed a TP server's ranks into one
# series: TP times the count, which no reader can undo). SGLang creates a labelled counter's
# series at its first increment, so a server that never evicted has no eviction series at all.
SGLANG_POOL = "sglang:max_total_num_tokens"  # the device pool in tokens, per rank, set once at start
SGLANG_KV_USED = "sglang:kv_used_tokens"  # full-attention slots held by running requests (newer releases)
SGLANG_NUM_USED = "sglang:num_used_tokens"  # the same in every release; max(full, SWA) on hybrid-SWA models
# The fraction of the pool in use (used = token_usage x pool where only it is there). It is the
# bottleneck of the full, SWA and mamba pools: on a hybrid model, an approximation.
SGLANG_TOKEN_USAGE = "sglang:token_usage"
# Radix-cached slots no request holds: free to evict. It came after the eviction and retraction
# counters, in the same collectors: a scrape that has it comes from a release that counts both,
# so there a missing `evicted_tokens_total` or `num_retracted_requests_total` means none yet.
SGLANG_EVICTABLE = "sglang:kv_evictable_tokens"
# Device slots freed by eviction, whether backed up to the host tier or dropped.
SGLANG_EVICTED = "sglang:evicted_tokens_total"
# Tokens loaded back from the host tier (HiCache's L2), by host `pool` (kv, swa, mamba, ...) in
# newer releases: the device KV pool's count is read, the others count the same tokens again.
SGLANG_LOAD_BACK = "sglang:load_back_tokens_total"
LOAD_BACK_POOL_LABEL, LOAD_BACK_KV_POOL = "pool", "kv"
# HiCache's host pool, exported only with --enable-hierarchical-cache: where it is, a missing
# load-back counter means nothing was loaded back yet; where it is not, HiCache is off.
SGLANG_HOST_USED = "sglang:hicache_host_used_tokens"
SGLANG_HOST_TOTAL = "sglang:hicache_host_total_tokens"
# Prompt tokens served from cache, by `cache_source` (device, host, storage_<backend>, or `total`
# where a request gave no breakdown): the sources add up. The prompt tokens are by
# `is_streaming` in newer releases.
SGLANG_CACHED_TOKENS = "sglang:cached_tokens_total"
SGLANG_PROMPT_TOKENS = "sglang:prompt_tokens_total"
SGLANG_CACHE_HIT_RATE = "sglang:cache_hit_rate"  # the scheduler's own gauge
# Speculative decoding: the acceptance rate (accepted / proposed drafts) and the mean acceptance
# length (accepted drafts + the bonus token per verify step) are both real names, of two
# quantities. Only the rate is read as one; the length tells whether speculation ran at all (a
# server without it logs 0 for both, which is no rate of 0).
SGLANG_SPEC_ACCEPT_RATE = "sglang:spec_accept_rate"
SGLANG_SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
# Requests retracted (put back in the queue, their KV freed) when decoding ran out of pool:
# SGLang's preemption.
SGLANG_RETRACTED = "sglang:num_retracted_requests_total"
# vLLM (v1/metrics/loggers.py): the pool is in the labels of an info gauge (value 1), one series
# per engine core: `num_gpu_blocks` x `block_size` (num_gpu_blocks is "None" until profiled), or
# newer releases' `kv_cache_size_tokens`, which counts hybrid models' KV groups right.
VLLM_CACHE_CONFIG = "vllm:cache_config_info"
VLLM_NUM_GPU_BLOCKS, VLLM_BLOCK_SIZE, VLLM_POOL_TOKENS = "num_gpu_blocks", "block_size", "kv_cache_size_tokens"
# Each name first, then the one releases before 0.9 gave it (0.9 exports both, the same figure).
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # a fraction, 1 = full
VLLM_PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")  # tokens
VLLM_PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")  # tokens
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"
# v1/spec_decode/metrics.py: the acceptance rate is accepted / draft tokens over an interval.
VLLM_SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_SPEC_DRAFT = "vllm:spec_decode_num_draft_tokens_total"
# vLLM evicts no tokens it counts: under pressure it preempts running requests (their KV freed,
# recomputed later), counted in requests.
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
# The labels that tell copies of one rank's figure apart: the tensor- (pipeline-, expert-)
# parallel schedulers of one data-parallel rank hold the same requests and tokens, each a shard
# of their KV. A token figure is one of them, never their sum; each data-parallel rank
# (`dp_rank`, vLLM's `engine`) has a pool of its own, and the deployment's figure is their sum.
COPY_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})

# --- dialects and their generations -------------------------------------------------------------
SGLANG_DIALECT, VLLM_DIALECT, ROUTER_DIALECT, TRTLLM_DIALECT = "sglang", "vllm", "sglang-router", "trtllm"
# SGLang's generations, newest first, each told by a name only it exports. "bootstrap": since
# PR #24341 (and the bundled engine); "infight": PR #6188 to #7317; "prealloc": in between.
# A scrape with none of them (a release without PD gauges, or one that logged no stats yet)
# has no generation.
SGLANG_GENERATIONS = (("bootstrap", BOOTSTRAP), ("infight", INFIGHT), ("prealloc", PREFILL_PREALLOC))
# A "unified" `engine_type` from these is no proof: PR #18552 fell inside "prealloc".
UNIFIED_LABEL_UNSURE = frozenset({"infight", "prealloc"})
# vLLM V1 labels every series with its engine core (`engine`); V0 with `model_name` only.
VLLM_V1, VLLM_V0 = "v1", "v0"
# The router's per-worker gauges are `smg_worker_health{worker}` and
# `smg_worker_requests_active{worker}` (`sgl_router_worker_health`, `sgl_router_running_requests`
# before): its own count of requests it passed on, not a queue; the queues a wedge sits in are
# its workers', so no wedge check reads them.
ROUTER_GENERATIONS = (("smg", SMG), ("sgl_router", SGL_ROUTER))

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Dialect:
    """Which server's names a scrape speaks (`name`, "" for none known) and which generation of
    them (`generation`, "" where no name in it tells)."""

    name: str = ""
    generation: str = ""


def metric_name(series: str) -> str:
    """`name{labels}` -> `name`: gauges are judged by name whatever their labels."""
    return series.split("{", 1)[0]


def series_labels(series: str) -> dict[str, str]:
    """`name{a="1",b="2"}` -> {"a": "1", "b": "2"}."""
    _, _, inner = series.partition("{")
    return dict(_LABEL.findall(inner))


def current_name(name: str) -> str:
    """A gauge's current name for any of its names (an older release's or the current one)."""
    return OLD_NAMES.get(name, name)


def stage(series: str) -> str | None:
    """The stage a queue gauge series measures ("bootstrap", "transfer", ...), or None."""
    return STAGES.get(current_name(metric_name(series)))


def is_queue_gauge(series: str) -> bool:
    if current_name(metric_name(series)) not in STAGES:
        return False
    return not (f'{PRIORITY_LABEL}="' in series and series_labels(series).get(PRIORITY_LABEL))


def is_counter(series: str) -> bool:
    name = metric_name(series)
    return name.endswith(COUNTER_SUFFIX) or name in PROGRESS_COUNTERS


def counters(values: dict[str, float]) -> dict[str, float]:
    """The progress counter series of a scrape: finished, aborted or generated work all count."""
    return {k: v for k, v in values.items() if metric_name(k) in PROGRESS_COUNTERS}


def failures(values: dict[str, float]) -> dict[str, float]:
    """The failure counter series of a scrape (bootstrap, transfer, retries)."""
    return {k: v for k, v in values.items() if metric_name(k) in FAILURE_COUNTERS}


def generation_tokens(values: dict[str, float]) -> float:
    """Tokens generated so far, summed over the scrape's series. SGLang counts
    `generation_tokens_total` only when a request finishes; where it also counts decode tokens
    as they are made (`realtime_tokens_total{mode="decode"}`) those are read instead, so a
    request decoding for nobody shows before it ends."""
    decoded = [
        v
        for k, v in values.items()
        if metric_name(k) == SGLANG_REALTIME_TOKENS and series_labels(k).get("mode") == "decode"
    ]
    if decoded:
        return sum(decoded)
    return sum(v for k, v in values.items() if metric_name(k).endswith(GENERATION_TOKENS_SUFFIX))


RankKey = tuple[tuple[str, str], ...]


def per_rank(
    values: Mapping[str, float], names: Iterable[str], keep: Callable[[dict[str, str]], bool] | None = None
) -> dict[RankKey, float]:
    """One value per rank of the series named `names` (one figure's names across releases), keyed
    by their labels less COPY_LABELS: the copies of a rank (its tensor-parallel schedulers, or one
    series under an old and a new name) give one value, their largest. Summed, the values are the
    deployment's; averaged, a fraction's. A priority class's series is left out (PRIORITY_LABEL),
    as is a value that is not finite, or a series whose labels `keep` refuses."""
    wanted = frozenset(names)
    out: dict[RankKey, float] = {}
    for series, value in values.items():
        if metric_name(series) not in wanted or not math.isfinite(value):
            continue
        labels = series_labels(series)
        if labels.get(PRIORITY_LABEL) or (keep is not None and not keep(labels)):
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in COPY_LABELS))
        out[key] = max(out.get(key, value), value)
    return out


def is_router_metrics(values: dict[str, float]) -> bool:
    """Whether a scrape carries SGLang's router's own metrics."""
    return any(k.startswith(ROUTER_PREFIXES) for k in values)


def dialect_of(values: dict[str, float]) -> Dialect:
    """The dialect and generation of one scrape. A router comes first: it may pass its workers'
    series on beside its own."""
    for generation, prefix in ROUTER_GENERATIONS:
        if any(k.startswith(prefix) for k in values):
            return Dialect(ROUTER_DIALECT, generation)
    names = {metric_name(k) for k in values}
    if any(n.startswith(SGLANG) for n in names):
        return Dialect(SGLANG_DIALECT, next((g for g, marker in SGLANG_GENERATIONS if marker in names), ""))
    vllm = [k for k in values if k.startswith(VLLM)]
    if vllm:
        v1 = any(VLLM_ENGINE_LABEL in series_labels(k) for k in vllm)
        return Dialect(VLLM_DIALECT, VLLM_V1 if v1 else VLLM_V0)
    if any(n.startswith(TRTLLM) for n in names):
        return Dialect(TRTLLM_DIALECT)
    return Dialect()


class NoIterationStats(ValueError):
    """A TensorRT-LLM /metrics answer that is an empty list: no iteration ran since the last look.
    Not an error of the server (an idle one answers so), and no gauges either."""


def trtllm_series(stats: object) -> dict[str, float]:
    """The series of a TensorRT-LLM /metrics answer (a JSON list of iteration stats): the fields
    of its latest iteration. ValueError for an answer that is no such list, or holds no
    iteration: the stats are handed out once, so an empty list says only that no iteration ran
    since the last look, which is no evidence of empty queues (a hung executor runs none either)."""
    if not isinstance(stats, list) or not all(isinstance(s, dict) for s in stats):
        raise ValueError("not a JSON list of iteration stats")
    if not stats:
        raise NoIterationStats("no iteration stats since the last look (TensorRT-LLM reports per iteration)")
    latest = max(stats, key=lambda s: s.get("iter") if isinstance(s.get("iter"), (int, float)) else -1)
    out = {}
    for field, series in TRTLLM_FIELDS.items():
        value = latest.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[series] = float(value)
    if not out:
        raise ValueError("iteration stats without numActiveRequests, numQueuedRequests or iter")
    return out
