"""A server's device KV pool in tokens, and where that figure came from.

Pure readers: SGLang's /get_server_info body, or one /metrics scrape ({series: value}, as the
monitor keys it), in; a `KvPool` or None out. A deployment with several data-parallel ranks has
a pool per rank, and its pool is their sum; the tensor-parallel copies of one rank are one pool
(dialect.COPY_LABELS says why).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dsv4bench.servers.dialect import (
    SGLANG_POOL,
    VLLM_BLOCK_SIZE,
    VLLM_CACHE_CONFIG,
    VLLM_ENGINE_LABEL,
    VLLM_NUM_GPU_BLOCKS,
    VLLM_POOL_TOKENS,
    metric_name,
    per_rank,
    series_labels,
)

# The figure a user gave on the command line: it wins over anything a server says.
GIVEN_SOURCE = "given on the command line"
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class KvPool:
    """The device KV pool of a server, in tokens, and one short phrase a report can print for
    where the figure came from."""

    tokens: int
    source: str

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens <= 0:
            raise ValueError(f"a KV pool is a positive number of tokens, not {self.tokens!r}")


def _count(value: object) -> int | None:
    """A positive int from JSON, or None: a bool (an int to Python), a float, a string or a
    figure of 0 or less is no pool."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _gauge_count(value: float) -> int | None:
    """A gauge's value as a pool: finite, whole and positive, or None."""
    if not math.isfinite(value) or value <= 0 or value != int(value):
        return None
    return int(value)


def _label_count(labels: Mapping[str, str], name: str) -> int | None:
    """A label's value as a positive int; None for "None" (not profiled yet) or anything else."""
    text = labels.get(name, "")
    return _count(int(text)) if _DIGITS.fullmatch(text) else None


def _rank_of(state: Mapping[str, object]) -> int | None:
    """The pool one entry of SGLang's `internal_states` (one per data-parallel rank) reports:
    `max_total_num_tokens`, or `memory_usage.token_capacity` as the scheduler reports it."""
    own = _count(state.get("max_total_num_tokens"))
    if own is not None:
        return own
    usage = state.get("memory_usage")
    return _count(usage.get("token_capacity")) if isinstance(usage, dict) else None


def pool_from_server_info(info: object) -> KvPool | None:
    """The pool SGLang's /get_server_info body gives, or None where it gives none.

    The body is the server's args, its first scheduler's info (top-level `max_total_num_tokens`:
    one data-parallel rank's pool) and `internal_states`, one entry per data-parallel rank. The
    ranks' own figures are summed where every rank gives one and there is one per rank of
    `dp_size`; else the top-level figure, times `dp_size` where that is above 1."""
    if not isinstance(info, dict):
        return None
    dp_size = _count(info.get("dp_size")) or 1
    states = info.get("internal_states")
    ranks: dict[object, int] = {}
    if isinstance(states, list) and states and all(isinstance(s, dict) for s in states):
        for i, state in enumerate(states):
            tokens = _rank_of(state)
            if tokens is None:
                ranks = {}
                break
            # An entry that names its rank counts once, however often it is listed.
            rank = state.get("dp_rank", i)
            rank = rank if isinstance(rank, (int, str)) else i
            ranks[rank] = max(ranks.get(rank, tokens), tokens)
    top = _count(info.get("max_total_num_tokens"))
    if ranks and (len(ranks) == dp_size or top is None):
        return KvPool(sum(ranks.values()), f"/get_server_info internal_states{_of(len(ranks), 'DP ranks')}")
    if top is None:
        return None
    if dp_size > 1:
        return KvPool(top * dp_size, f"/get_server_info max_total_num_tokens x dp_size {dp_size}")
    return KvPool(top, "/get_server_info max_total_num_tokens")


def _vllm_pool(values: Mapping[str, float]) -> KvPool | None:
    """vLLM's pool: per engine core, `kv_cache_size_tokens` where a release gives it, else
    `num_gpu_blocks` x `block_size`; summed over the engines. None until every engine profiled."""
    engines: dict[str, int | None] = {}
    sized = True  # every engine's figure is kv_cache_size_tokens
    for series in values:
        if metric_name(series) != VLLM_CACHE_CONFIG:
            continue
        labels = series_labels(series)
        tokens = _label_count(labels, VLLM_POOL_TOKENS)
        if tokens is None:
            sized = False
            blocks, size = _label_count(labels, VLLM_NUM_GPU_BLOCKS), _label_count(labels, VLLM_BLOCK_SIZE)
            tokens = blocks * size if blocks is not None and size is not None else None
        engine = labels.get(VLLM_ENGINE_LABEL, "")
        known = engines.get(engine, tokens)
        engines[engine] = max(known, tokens) if known is not None and tokens is not None else None
    counts = [t for t in engines.values() if t is not None]
    if not engines or len(counts) < len(engines):
        return None
    field = VLLM_POOL_TOKENS if sized else f"{VLLM_NUM_GPU_BLOCKS} x {VLLM_BLOCK_SIZE}"
    return KvPool(sum(counts), f"/metrics {VLLM_CACHE_CONFIG} {field}{_of(len(counts), 'engines')}")


def _of(n: int, what: str) -> str:
    """The count a summed figure names in its source ("4 engines"), where it summed several."""
    return f" ({n} {what})" if n > 1 else ""


def pool_from_metrics(values: dict[str, float]) -> KvPool | None:
    """The pool one /metrics scrape gives, or None: vLLM's `vllm:cache_config_info`, SGLang's
    `sglang:max_total_num_tokens` (one series per rank: the data-parallel ranks' summed)."""
    vllm = _vllm_pool(values)
    if vllm is not None:
        return vllm
    ranks = per_rank(values, (SGLANG_POOL,))
    counts = [c for c in map(_gauge_count, ranks.values()) if c is not None]
    if not counts or len(counts) < len(ranks):
        return None
    return KvPool(sum(counts), f"/metrics {SGLANG_POOL}{_of(len(counts), 'DP ranks')}")


def kv_pool(server_info: object, values: dict[str, float] | None, given_tokens: int | None) -> KvPool | None:
    """The server's device KV pool: a figure the user gave wins (ValueError for one that is no
    positive int), then what /get_server_info says, then what /metrics says; None where nothing
    says."""
    if given_tokens is not None:
        if _count(given_tokens) is None:
            raise ValueError(f"a KV pool is a positive number of tokens, not {given_tokens!r}")
        return KvPool(given_tokens, GIVEN_SOURCE)
    from_info = pool_from_server_info(server_info)
    if from_info is not None:
        return from_info
    return pool_from_metrics(values) if values else None
