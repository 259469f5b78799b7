"""The servers' metrics dialects: every SGLang, vLLM and SGLang-router name the harness reads.

The monitor, the wedge detector, `probe`, `watch`, the role reader and the preflight name no
metric themselves; they read it here. A series is `name` or `name{label="v",...}` as the
monitor keys it (monitor.py); a gauge or counter is judged by its name, whatever its labels.
"""

from __future__ import annotations

SGLANG = "sglang:"
VLLM = "vllm:"
# SGLang's router (`sglang-router`, the model gateway): `smg_`, `sgl_router_` in older releases.
ROUTER_PREFIXES = ("smg_", "sgl_router_")
# A /metrics page is a serving engine's when it carries one of these.
SERVER_METRIC_PREFIXES = (SGLANG, VLLM, "smg_")

# Queue gauges. SGLang's PD pipeline: prefill bootstrap -> inflight; decode prealloc -> transfer.
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_WAITING = "sglang:num_queue_reqs"
BOOTSTRAP = "sglang:num_prefill_bootstrap_queue_reqs"
INFLIGHT = "sglang:num_prefill_inflight_queue_reqs"
PREALLOC = "sglang:num_decode_prealloc_queue_reqs"
TRANSFER = "sglang:num_decode_transfer_queue_reqs"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"

RUNNING = (SGLANG_RUNNING, VLLM_RUNNING)
WAITING = (SGLANG_WAITING, VLLM_WAITING)
# Every gauge a wedge check reads, in display order: running, waiting, then the PD pipeline in
# the order a request passes through it.
QUEUE_GAUGES = (SGLANG_RUNNING, SGLANG_WAITING, BOOTSTRAP, INFLIGHT, PREALLOC, TRANSFER, VLLM_RUNNING, VLLM_WAITING)

# Counters end in `_total` in both dialects; any of them moving is progress.
COUNTER_SUFFIX = "_total"
# `sglang:generation_tokens_total`, `vllm:generation_tokens_total`.
GENERATION_TOKENS_SUFFIX = "generation_tokens_total"

# SGLang's label for a server's part in a PD deployment ("prefill", "decode", ...).
ENGINE_TYPE_LABEL = "engine_type"
# Labels that name the server, not a part of it: every series of a server carries the same ones.
SERVER_LABELS = frozenset({"model_name", ENGINE_TYPE_LABEL})


def metric_name(series: str) -> str:
    """`name{labels}` -> `name`: gauges are judged by name whatever their labels."""
    return series.split("{", 1)[0]


def is_queue_gauge(series: str) -> bool:
    return metric_name(series) in QUEUE_GAUGES


def is_counter(series: str) -> bool:
    return metric_name(series).endswith(COUNTER_SUFFIX)


def counters(values: dict[str, float]) -> dict[str, float]:
    """The counter series of a scrape: finished, aborted or generated work all count."""
    return {k: v for k, v in values.items() if is_counter(k)}


def generation_tokens(values: dict[str, float]) -> float:
    """Tokens generated so far, summed over the scrape's series."""
    return sum(v for k, v in values.items() if metric_name(k).endswith(GENERATION_TOKENS_SUFFIX))


def is_router_metrics(values: dict[str, float]) -> bool:
    """Whether a scrape carries SGLang's router's own metrics."""
    return any(k.startswith(ROUTER_PREFIXES) for k in values)
