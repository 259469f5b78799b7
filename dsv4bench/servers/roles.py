"""Which part of a deployment a server is: a router, a unified server, a prefill or a decode server.

Each endpoint is judged by its role: only a router or a unified server takes a chat request, so
only they get a canary; a prefill or decode server, which is not expected to answer a chat, is
judged by its own queue gauges, `/health` and `/health_generate`. The role is read from the
server itself:

1. a router: SGLang's router (`sglang-router`, the model gateway) exposes `smg_` metrics
   (`sgl_router_` in older releases) and a `/workers` list. This comes first because a router
   may pass `/get_server_info` on to one of its workers and so speak with a worker's voice.
2. `/get_server_info`: SGLang's `disaggregation_mode` ("null", "prefill", "decode"); the
   bundled engine's `engine_type` ("unified", "router", "prefill", "decode"); SGLang's router
   (0.3) answers it for itself with `router_manager`.
3. the `engine_type` label of its `/metrics` series (SGLang and the bundled engine), but not a
   "unified" one from a release that labels PD workers so too; a server with vLLM's metrics is
   a unified server.

The pure functions take what the server answered; `discover_role` asks it.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from dsv4bench.wire.charset import response_text
from dsv4bench.servers.dialect import (
    BOOTSTRAP,
    DEFERRED_RELEASE,
    ENGINE_TYPE_LABEL,
    HOST_RECEIVE,
    INFLIGHT,
    OLD_NAMES,
    PREALLOC,
    PRIORITY_LABEL,
    QUEUE_GAUGES,
    SERVER_LABELS,
    SGLANG,
    SGLANG_RUNNING,
    SGLANG_WAITING,
    STAGES,
    TRANSFER,
    TRTLLM,
    TRTLLM_RUNNING,
    TRTLLM_WAITING,
    UNIFIED_LABEL_UNSURE,
    VLLM,
    VLLM_RUNNING,
    VLLM_WAITING,
    current_name,
    dialect_of,
    is_router_metrics,
    series_labels,
)
from dsv4bench.servers.monitor import parse_metrics

ROUTER, UNIFIED, PREFILL, DECODE, UNKNOWN = "router", "unified", "prefill", "decode", "unknown"
ROLES = (ROUTER, UNIFIED, PREFILL, DECODE)
SERVES_REQUESTS = frozenset({ROUTER, UNIFIED})
WORKERS = frozenset({PREFILL, DECODE})

# The queue gauges each role has, in the order a request passes through them (current names;
# `role_gauges` adds each one's older names).
_FRONT = (SGLANG_WAITING, SGLANG_RUNNING, VLLM_WAITING, VLLM_RUNNING, TRTLLM_WAITING, TRTLLM_RUNNING)
ROLE_GAUGES: dict[str, tuple[str, ...]] = {
    ROUTER: _FRONT,
    UNIFIED: _FRONT,
    PREFILL: (BOOTSTRAP, SGLANG_WAITING, SGLANG_RUNNING, INFLIGHT, VLLM_WAITING, VLLM_RUNNING),
    DECODE: (
        PREALLOC,
        TRANSFER,
        HOST_RECEIVE,
        SGLANG_WAITING,
        SGLANG_RUNNING,
        DEFERRED_RELEASE,
        VLLM_WAITING,
        VLLM_RUNNING,
    ),
    UNKNOWN: (
        BOOTSTRAP,
        SGLANG_WAITING,
        SGLANG_RUNNING,
        INFLIGHT,
        PREALLOC,
        TRANSFER,
        HOST_RECEIVE,
        DEFERRED_RELEASE,
        VLLM_WAITING,
        VLLM_RUNNING,
        TRTLLM_WAITING,
        TRTLLM_RUNNING,
    ),
}
_OLDER: dict[str, tuple[str, ...]] = {g: tuple(old for old, now in OLD_NAMES.items() if now == g) for g in QUEUE_GAUGES}

# A gauge's name in a narrow column (its stage), and in a sentence ("decode transfer queue stuck
# at 40"), for each of its names, old or current.
_WORDS = {
    SGLANG_RUNNING: "running requests",
    VLLM_RUNNING: "running requests",
    TRTLLM_RUNNING: "running requests",
    SGLANG_WAITING: "waiting queue",
    VLLM_WAITING: "waiting queue",
    TRTLLM_WAITING: "waiting queue",
    BOOTSTRAP: "bootstrap queue",
    INFLIGHT: "inflight queue",
    PREALLOC: "prealloc queue",
    TRANSFER: "transfer queue",
    HOST_RECEIVE: "host receive queue",
    DEFERRED_RELEASE: "deferred KV release",
}
GAUGE_LABELS = {name: STAGES[current_name(name)] for name in (*QUEUE_GAUGES, *OLD_NAMES)}
GAUGE_WORDS = {name: _WORDS[current_name(name)] for name in GAUGE_LABELS}


@dataclass(frozen=True)
class Role:
    """A server's role and where it was read (`source`), for the reader of a verdict."""

    name: str = UNKNOWN
    source: str = "not reported"

    @property
    def serves_requests(self) -> bool:
        return self.name in SERVES_REQUESTS

    @property
    def known(self) -> bool:
        return self.name != UNKNOWN


def part_labels(series: str) -> str:
    """The labels that tell series of one server apart (ranks and the like): `dp_rank=3`, or ''.
    SGLang's `priority=""` marks the total over the priority classes, no part."""
    labels = series_labels(series)
    return ",".join(
        f"{k}={v}" for k, v in sorted(labels.items()) if k not in SERVER_LABELS and not (k == PRIORITY_LABEL and not v)
    )


def role_gauges(role: str) -> tuple[str, ...]:
    """The role's gauges in request order, each followed by its names in older releases."""
    return tuple(n for g in ROLE_GAUGES.get(role, ROLE_GAUGES[UNKNOWN]) for n in (g, *_OLDER[g]))


def own_gauges_shown(role: str, present: Container[str]) -> list[str]:
    """The role's gauges among the names `present`, in its order; the names of one stage (SGLang's
    and vLLM's, an old release's and the current one) show once, the first exported wins."""
    labels: set[str] = set()
    shown = []
    for g in role_gauges(role):
        if g in present and GAUGE_LABELS[g] not in labels:
            labels.add(GAUGE_LABELS[g])
            shown.append(g)
    return shown


def role_from_server_info(info: Any) -> Role | None:
    """The role a `/get_server_info` answer states, or None when it states none."""
    if not isinstance(info, dict):
        return None
    if info.get("router_manager") is True:
        return Role(ROUTER, "/get_server_info router_manager")
    mode = info.get("disaggregation_mode")
    if isinstance(mode, str) and mode.lower() in WORKERS:
        return Role(mode.lower(), "/get_server_info disaggregation_mode")
    engine_type = info.get("engine_type")
    if isinstance(engine_type, str) and engine_type.lower() in ROLES:
        return Role(engine_type.lower(), "/get_server_info engine_type")
    if "disaggregation_mode" in info and (mode is None or (isinstance(mode, str) and mode.lower() == "null")):
        return Role(UNIFIED, "/get_server_info disaggregation_mode")
    return None


def role_from_metrics(values: dict[str, float]) -> Role | None:
    """The role a `/metrics` scrape shows: a router's own metrics, else the `engine_type` label."""
    if is_router_metrics(values):
        return Role(ROUTER, "/metrics smg_ series")
    types = {series_labels(k).get(ENGINE_TYPE_LABEL, "").lower() for k in values if k.startswith(SGLANG)}
    known = sorted(types & set(ROLES))
    # Older SGLang labels its PD workers "unified" too: from those releases the label proves nothing.
    unsure = known == [UNIFIED] and dialect_of(values).generation in UNIFIED_LABEL_UNSURE
    if len(known) == 1 and not unsure:
        return Role(known[0], "/metrics engine_type label")
    if any(k.startswith(VLLM) for k in values):
        return Role(UNIFIED, "/metrics vllm series")
    if any(k.startswith(TRTLLM) for k in values):
        # trtllm-serve's disaggregated workers are told apart by the disagg server, not by it.
        return Role(UNIFIED, "/metrics trtllm iteration stats")
    return None


def role_from_workers(payload: Any) -> Role | None:
    """A `/workers` answer that lists workers names a router."""
    workers = payload.get("workers") if isinstance(payload, dict) else payload
    if isinstance(workers, list):
        return Role(ROUTER, "/workers list")
    return None


async def _get_json(client: httpx.AsyncClient, url: str, timeout: float) -> Any:
    """The JSON of a 200 answer, else None: a missing or broken endpoint only means "not stated"."""
    try:
        with anyio.fail_after(timeout):
            r = await client.get(url, timeout=timeout)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, TimeoutError):
        return None


async def _get_metrics(client: httpx.AsyncClient, url: str, timeout: float) -> dict[str, float] | None:
    try:
        with anyio.fail_after(timeout):
            r = await client.get(url, timeout=timeout)
        return parse_metrics(response_text(r)) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, TimeoutError):
        return None


async def stated_role(client: httpx.AsyncClient, root: str, timeout: float = 5.0) -> tuple[Any, Any]:
    """(`/get_server_info`, `/workers`) of the server at `root`, each None where it gave none."""
    root = root.rstrip("/")
    answers: dict[str, Any] = {}

    async def fetch(key: str, path: str) -> None:
        answers[key] = await _get_json(client, root + path, timeout)

    async with anyio.create_task_group() as tg:
        tg.start_soon(fetch, "info", "/get_server_info")
        tg.start_soon(fetch, "workers", "/workers")
    return answers.get("info"), answers.get("workers")


async def discover_role(
    client: httpx.AsyncClient, root: str, timeout: float = 5.0, metrics: dict[str, float] | None = None
) -> Role:
    """Ask the server at `root` what it is (see the module docstring for the order); never raises.
    `metrics`: a scrape already made of root/metrics, so it is not fetched again."""
    root = root.rstrip("/")
    scraped: dict[str, Any] = {}

    async def fetch_metrics() -> None:
        scraped["values"] = await _get_metrics(client, root + "/metrics", timeout)

    async def fetch_stated() -> None:
        scraped["info"], scraped["workers"] = await stated_role(client, root, timeout)

    async with anyio.create_task_group() as tg:
        tg.start_soon(fetch_stated)
        if metrics is None:
            tg.start_soon(fetch_metrics)
    values = metrics if metrics is not None else scraped.get("values") or {}
    return role_of(scraped.get("info"), values, scraped.get("workers"))


def role_of(server_info: Any, metrics: dict[str, float] | None, workers: Any) -> Role:
    """The role from what a server answered (None where it did not answer)."""
    values = metrics or {}
    if is_router_metrics(values):
        return Role(ROUTER, "/metrics smg_ series")
    return role_from_workers(workers) or role_from_server_info(server_info) or role_from_metrics(values) or Role()
