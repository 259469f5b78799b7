"""Before a run: is the server there, which model does it serve, what does it say of itself."""

from __future__ import annotations

from typing import Any

import httpx


class ServerError(Exception):
    """The server cannot be used; the message is one line for the user."""


def root_of(base_url: str) -> str:
    """http://h:p/v1 -> http://h:p: SGLang's native endpoints (/health, /abort_request, ...)
    live at the server root."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def server_facts(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """GET /v1/models (required) and /get_server_info, /get_model_info (where present)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    facts: dict[str, Any] = {"base_url": base_url}
    with httpx.Client(timeout=timeout, headers=headers, trust_env=False) as c:
        try:
            r = c.get(f"{base_url}/models")
        except httpx.HTTPError as e:
            raise ServerError(f"cannot reach {base_url}: {type(e).__name__}: {e or 'no answer'}") from None
        if r.status_code in (401, 403):
            raise ServerError(f"{base_url}/models answered {r.status_code}: give --api-key")
        if r.status_code >= 400:
            raise ServerError(f"{base_url}/models answered HTTP {r.status_code}; is this an OpenAI-compatible /v1 URL?")
        try:
            data = r.json().get("data", [])
            models = [m["id"] for m in data]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ServerError(f"{base_url}/models did not return an OpenAI model list") from None
        facts["models"] = models
        context = data[0].get("max_model_len") if data else None  # vLLM and SGLang report it here
        root = root_of(base_url)
        for name in ("get_server_info", "get_model_info"):
            try:
                r = c.get(f"{root}/{name}")
                if r.status_code == 200:
                    facts[name.removeprefix("get_")] = r.json()
            except (httpx.HTTPError, ValueError):
                pass  # optional: vLLM and others do not serve these
    info = facts.get("model_info")
    if not isinstance(context, int) and isinstance(info, dict):
        context = info.get("context_length")  # SGLang's /get_model_info
    if isinstance(context, int) and not isinstance(context, bool) and context > 0:
        facts["context_length"] = context
    return facts
