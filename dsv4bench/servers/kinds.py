"""The kinds of server the harness meets, and what each offers: the one table of them.

Each server is judged by the endpoints and metrics its kind has. An endpoint a kind never had
is "not offered": not asked, shown as such, never a sign that the server is unwell. Where a
kind's releases differ (or the kind is not known), the server is judged by what answers: a
404, 405 or 501 says the endpoint is not there, which is no verdict about the server either.

What each kind offers, from its own sources:
- SGLang (python/sglang/srt/entrypoints/http_server.py): /health, /health_generate,
  /get_server_info (/server_info in newer releases), /get_model_info, /v1/models and, with
  --enable-metrics, Prometheus /metrics with `sglang:` names.
- SGLang's router (`sglang-router`, the model gateway; sgl-router/src/server.rs): /health,
  /health_generate, /workers, /get_server_info, /get_model_info, /v1/models; its own metrics
  (`smg_`, `sgl_router_`) on its --prometheus-port. Its queues are its workers'.
- The bundled engine serves as SGLang does (DESIGN.md, "Server dialect"), and states itself with
  the `engine_type` of its /get_server_info, a key SGLang does not send.
- vLLM (vllm/entrypoints/openai/api_server.py): /health, /ping, /version ({"version": ...}),
  /v1/models, /tokenize and Prometheus /metrics with `vllm:` names
  (`vllm:num_requests_running`, `vllm:num_requests_waiting`, ...). No /health_generate and no
  /get_server_info.
- TensorRT-LLM's `trtllm-serve` (tensorrt_llm/serve/openai_server.py, docs/source/commands/
  trtllm-serve.rst): /health, /version ({"version": ...}), /v1/models and a /metrics that is a
  JSON list of iteration stats (`numActiveRequests`, `numQueuedRequests`, `iter`, ...; read as
  `trtllm:` series, dialect.py), not Prometheus text. /health_generate came in later releases:
  judged by what answers. No /get_server_info.
- A plain OpenAI-compatible server: nothing is known beyond /v1/models and the chat endpoint.

Prefix-cache flush (`cache_flush`, used by --recheck): SGLang's POST /flush_cache (refused while
requests run), which its router passes to every worker and the bundled engine serves too; vLLM's
POST /reset_prefix_cache (served only with VLLM_SERVER_DEV_MODE=1: a 404 otherwise).
TensorRT-LLM and unknown kinds: none known, none asked.

Recognition (`recognise`) reads what the server answered, the strongest sign first: the bundled
engine's `engine_type`; a router's own metrics, worker list or `router_manager`; an SGLang
/get_server_info; then the names of its metrics (sglang:, vllm:, trtllm:).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsv4bench.servers.dialect import (
    SGLANG_DIALECT,
    SGLANG_RUNNING,
    SGLANG_WAITING,
    TRTLLM_DIALECT,
    TRTLLM_RUNNING,
    TRTLLM_WAITING,
    VLLM_DIALECT,
    VLLM_RUNNING,
    VLLM_WAITING,
    dialect_of,
    is_router_metrics,
)

SGLANG, SGLANG_ROUTER, BUNDLED, VLLM, TRTLLM, UNKNOWN_KIND = (
    "sglang",
    "sglang-router",
    "bundled",
    "vllm",
    "trtllm",
    "unknown",
)

HEALTH, HEALTH_GENERATE, SERVER_INFO, METRICS, VERSION, MODELS, WORKERS_PATH = (
    "/health",
    "/health_generate",
    "/get_server_info",
    "/metrics",
    "/version",
    "/v1/models",
    "/workers",
)
# The answers that say an endpoint is not there: no verdict about the server.
NOT_THERE = frozenset({404, 405, 501})
NOT_OFFERED = "not offered"

PROMETHEUS, TRTLLM_JSON = "prometheus", "trtllm-json"


@dataclass(frozen=True)
class Kind:
    """One kind of server: what it is called, and for each endpoint whether it has it (True),
    never had it (False) or differs by release (absent: judged by what answers)."""

    name: str
    title: str
    offers: dict[str, bool] = field(default_factory=dict)
    metrics_format: str | None = None  # PROMETHEUS, TRTLLM_JSON, or None where not known
    queue_gauges: tuple[str, ...] = ()  # the queue gauges its /metrics carries; () where it has none known
    # Seconds its /metrics may hold a request before it answers (TensorRT-LLM waits for new
    # iteration stats): a scrape is given that long, and SCRAPE_MARGIN_S more, to answer.
    metrics_hold_s: float = 0.0
    # The path that drops its prefix cache (POST), where it has one; None where it has none known.
    cache_flush: str | None = None

    def offered(self, path: str) -> bool | None:
        """True: it has `path`; False: it never had it (not asked); None: judged by what answers."""
        return self.offers.get(path)

    @property
    def known(self) -> bool:
        return self.name != UNKNOWN_KIND

    @property
    def serves_alone(self) -> bool:
        """A kind whose server, where it states no role, is one that takes chat itself (vLLM,
        trtllm-serve: their disaggregated workers sit behind a proxy of their own)."""
        return self.name in (VLLM, TRTLLM)


SGLANG_FLUSH = "/flush_cache"
_SGLANG_OFFERS = {HEALTH: True, HEALTH_GENERATE: True, SERVER_INFO: True, MODELS: True}
KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(SGLANG, "SGLang", _SGLANG_OFFERS, PROMETHEUS, (SGLANG_WAITING, SGLANG_RUNNING), cache_flush=SGLANG_FLUSH),
        Kind(
            SGLANG_ROUTER, "SGLang router", {**_SGLANG_OFFERS, WORKERS_PATH: True}, PROMETHEUS, cache_flush=SGLANG_FLUSH
        ),
        Kind(
            BUNDLED,
            "bundled engine",
            {**_SGLANG_OFFERS, METRICS: True},
            PROMETHEUS,
            (SGLANG_WAITING, SGLANG_RUNNING),
            cache_flush=SGLANG_FLUSH,
        ),
        Kind(
            VLLM,
            "vLLM",
            {
                HEALTH: True,
                HEALTH_GENERATE: False,
                SERVER_INFO: False,
                METRICS: True,
                VERSION: True,
                MODELS: True,
                WORKERS_PATH: False,
            },
            PROMETHEUS,
            (VLLM_WAITING, VLLM_RUNNING),
            cache_flush="/reset_prefix_cache",
        ),
        # trtllm-serve's /metrics gathers the iteration stats that come within 2 s before it answers
        # (openai_server.py, get_iteration_stats: get_stats_async(2)).
        Kind(
            TRTLLM,
            "TensorRT-LLM",
            {HEALTH: True, SERVER_INFO: False, METRICS: True, VERSION: True, MODELS: True, WORKERS_PATH: False},
            TRTLLM_JSON,
            (TRTLLM_WAITING, TRTLLM_RUNNING),
            2.0,
        ),
        Kind(UNKNOWN_KIND, "OpenAI-compatible, kind unknown", {MODELS: True}),
    )
}
# The metrics dialect that names a kind, where nothing stronger does.
_BY_DIALECT = {SGLANG_DIALECT: SGLANG, VLLM_DIALECT: VLLM, TRTLLM_DIALECT: TRTLLM}


# What a scrape is given beyond the kind's own hold, for the answer to be written and read on a
# busy machine: a scrape cut at the bare interval (0.2 s in a fast run) loses the samples that a
# wedge is judged by, on the slow machines a wedge is most often looked for on.
SCRAPE_MARGIN_S = 1.0
# Before the first answer says which kind a server is, a scrape waits as long as any kind holds one.
LONGEST_HOLD_S = max(k.metrics_hold_s for k in KINDS.values())


def scrape_timeout(k: Kind | None, interval: float) -> float:
    """Seconds one scrape of /metrics may take: the kind's hold (the longest of any kind while
    `k` is None, not known yet) and SCRAPE_MARGIN_S, or the scrape interval where that is longer."""
    hold = LONGEST_HOLD_S if k is None else k.metrics_hold_s
    return max(interval, hold + SCRAPE_MARGIN_S)


def kind(name: str | None) -> Kind:
    return KINDS.get(name or UNKNOWN_KIND, KINDS[UNKNOWN_KIND])


def recognise(
    info: Any, metrics: dict[str, float] | None, workers: Any = None, metrics_json: bool = False
) -> tuple[Kind, str]:
    """(the kind, where it was read) from what the server answered (None where it did not):
    its /get_server_info, its /metrics series, its /workers answer, and whether its /metrics
    was a JSON list (TensorRT-LLM's iteration stats, which an idle server answers with `[]`)."""
    values = metrics or {}
    if isinstance(info, dict) and "engine_type" in info:
        return KINDS[BUNDLED], "/get_server_info engine_type"
    if is_router_metrics(values):
        return KINDS[SGLANG_ROUTER], "/metrics smg_ series"
    if isinstance(info, dict) and info.get("router_manager") is True:
        return KINDS[SGLANG_ROUTER], "/get_server_info router_manager"
    listed = workers.get("workers", workers.get("urls")) if isinstance(workers, dict) else workers
    if isinstance(listed, list):
        return KINDS[SGLANG_ROUTER], "/workers list"
    if isinstance(info, dict):
        return KINDS[SGLANG], "/get_server_info"
    by_metrics = _BY_DIALECT.get(dialect_of(values).name)
    if by_metrics is not None:
        return KINDS[by_metrics], f"/metrics {dialect_of(values).name} series"
    if metrics_json:
        return KINDS[TRTLLM], "/metrics JSON iteration stats"
    return KINDS[UNKNOWN_KIND], "judged by what answers"


def not_offered(k: Kind, path: str, status: int | None) -> bool:
    """Whether `path` is not offered by this server: its kind never had it, or (where its kind
    may or may not have it) it answered 404, 405 or 501."""
    have = k.offered(path)
    if have is False:
        return True
    return have is None and status in NOT_THERE
