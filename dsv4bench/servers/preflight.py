"""Before a run: is the server there, which model does it serve, what does it say of itself."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import httpx

from dsv4bench.errors import Dsv4benchError
from dsv4bench.wire.charset import response_text
from dsv4bench.servers.dialect import SERVER_METRIC_PREFIXES, dialect_of
from dsv4bench.servers.monitor import parse_metrics
from dsv4bench.servers.roles import role_of
from dsv4bench.servers.kinds import recognise
from dsv4bench.servers.kv_pool import kv_pool
from dsv4bench.wire.sse import clean_value


class ServerError(Dsv4benchError):
    """The server cannot be used; the message is one line for the user."""


class HostLimitError(Dsv4benchError):
    """This machine cannot carry the run as asked; the message is one line for the user."""


# Beside one connection per session: the history, the scrapes, the bundled engine's pipes, ...
_SPARE_FILES = 64


def ensure_open_files(concurrency: int) -> None:
    """Raise the soft open-file limit to what `concurrency` connections need, or refuse the run:
    past the limit every new connection fails, and those failures would read as the server's
    `connection_error`s, our own limit turned into a verdict about the server."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    need = concurrency + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < need:
        raise HostLimitError(
            f"--concurrency {concurrency} needs about {need} open files, but this process may "
            f"open {target} (ulimit -n; hard limit {hard}): raise the limit or lower --concurrency"
        )


def root_of(base_url: str) -> str:
    """http://h:p/v1 -> http://h:p: SGLang's native endpoints (/health, /abort_request, ...)
    live at the server root."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _stats_or_none(text: str) -> dict[str, float] | None:
    """The series of TensorRT-LLM's iteration stats, or None where no iteration ran since the last look."""
    try:
        return parse_metrics(text)
    except ValueError:
        return None


def server_facts(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """GET /v1/models (required) and /get_server_info, /get_model_info and /metrics (where
    present; `metrics_url` and `metrics_dialect` when the root serves an engine's Prometheus
    metrics)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    facts: dict[str, Any] = {"base_url": base_url}
    with httpx.Client(timeout=timeout, headers=headers, trust_env=False) as c:
        try:
            r = c.get(f"{base_url}/models")
        except httpx.HTTPError as e:
            raise ServerError(f"cannot reach {base_url}: {type(e).__name__}: {e or 'no answer'}") from None
        if r.status_code in (401, 403):
            raise ServerError(f"{base_url}/models answered {r.status_code}: give --api-key")
        if 300 <= r.status_code < 400:  # the harness follows no redirect, its turns neither (client.py)
            raise ServerError(
                f"{base_url}/models answered HTTP {r.status_code}, a redirect to "
                f"{r.headers.get('location', '(no Location)')[:200]!r}: give --url the URL it names"
            )
        if r.status_code >= 400:
            raise ServerError(f"{base_url}/models answered HTTP {r.status_code}; is this an OpenAI-compatible /v1 URL?")
        try:
            data = r.json().get("data", [])
            models = [m["id"] for m in data]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise ServerError(f"{base_url}/models did not return an OpenAI model list") from None
        if not all(isinstance(m, str) and m for m in models):
            raise ServerError(
                f"{base_url}/models lists a model whose id is not a name: "
                f"{next(m for m in models if not (isinstance(m, str) and m))!r:.60}"
            )
        facts["models"] = models
        context = data[0].get("max_model_len") if data else None  # vLLM and SGLang report it here
        root = root_of(base_url)
        for name in ("get_server_info", "get_model_info"):
            try:
                r = c.get(f"{root}/{name}")
                if r.status_code == 200:
                    facts[name.removeprefix("get_")] = clean_value(r.json())  # run.json holds it
            except (httpx.HTTPError, ValueError, RecursionError):
                pass  # optional: vLLM and others do not serve these
        metrics_url = f"{root}/metrics"
        values: dict[str, float] | None = None
        try:
            r = c.get(metrics_url)
            text = response_text(r)
            # TensorRT-LLM's /metrics is a JSON list of iteration stats, `[]` while it is idle.
            trtllm_stats = r.status_code == 200 and text.lstrip()[:1] == "["
            if trtllm_stats:
                facts["metrics_url"] = metrics_url
                values = _stats_or_none(text)
            elif r.status_code == 200 and any(m in text for m in SERVER_METRIC_PREFIXES):
                values = parse_metrics(text)
                facts["metrics_url"] = metrics_url  # found: the run watches its queues for a wedge
            if values is not None:
                facts["metrics_dialect"] = asdict(dialect_of(values))  # whose names, which release's
                facts["role"] = role_of(facts.get("server_info"), values, None).name
            found, _ = recognise(facts.get("server_info"), values, None, metrics_json=trtllm_stats)
            facts["server_kind"] = found.name
        except (httpx.HTTPError, ValueError):  # ValueError: not Prometheus text after all
            pass
        if (pool := kv_pool(facts.get("server_info"), values, None)) is not None:
            facts["kv_pool"] = asdict(pool)  # what --cache-pressure sizes the run on
    info = facts.get("model_info")
    if not isinstance(context, int) and isinstance(info, dict):
        context = info.get("context_length")  # SGLang's /get_model_info
    if isinstance(context, int) and not isinstance(context, bool) and context > 0:
        facts["context_length"] = context
    return facts
