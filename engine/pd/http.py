"""The HTTP face of the prefill and the decode server, each on its own port as in an SGLang PD
deployment: `/health` and `/health_generate`, `/metrics` (SGLang's names, `engine_type`
"prefill" / "decode"), `/server_info`, `/model_info` and `/get_load` (engine/server_facts.py,
what SGLang's router reads when it registers a worker), `/flush_cache` and `/abort_request`. The router's face is
engine/server.py's app over the PDRouter.

`/health` here is the liveness of every thread the server needs (its engine loop, and the
bootstrap and transfer workers it depends on): a dead worker is a 503 even though the loop
still turns. With the planted `health-lies` fault it answers from the loop's liveness flag
alone, as the router then does too.

Like the router's (engine/server.py), every endpoint needs the API key when one is set, but
`/health` and `/metrics` unless `ServerConfig.auth_health_metrics`; `/abort_request` bodies
cross the same edge checks (engine/request_limits.py); every error is an OpenAI-style JSON body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..metrics import CONTENT_TYPE, ServerMetrics
from ..request_limits import RequestError
from .. import server_facts
from ..server import ServerConfig, auth_middleware, guarded, http_error, read_json
from ..tokenizer import DSV4Tokenizer
from .decode import DecodeEngine
from .prefill import PrefillEngine

ABORT_TIMEOUT_S = 5.0  # an engine thread that does not answer by then is not coming back
MAX_BODY_BYTES = 64 * 1024  # /abort_request is the only body these servers read


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(RequestError(status, message, param).body(), status_code=status)


async def _answer(future: Future[Any]) -> Any:
    return await asyncio.wait_for(asyncio.wrap_future(future), ABORT_TIMEOUT_S)


def build_worker_app(engine: PrefillEngine | DecodeEngine, engine_type: str, model_name: str,
                     tokenizer: DSV4Tokenizer, max_context: int, needs: Sequence[Callable[[], bool]],
                     health_lies: bool = False, server_cfg: ServerConfig = ServerConfig()) -> Starlette:
    """The app of the prefill or decode server. `needs` are the liveness checks of the
    threads it depends on besides its own loop; `server_cfg` gives the API key and whether
    /health and /metrics need it (its ports and names are not read)."""
    metrics = ServerMetrics(lambda: engine.stats, model_name, engine_type, engine.cfg.page_size)

    async def health(request: Request) -> Response:
        ok = engine.alive() and (health_lies or all(alive() for alive in needs))
        return Response(status_code=200 if ok else 503)

    async def metrics_text(request: Request) -> Response:
        return Response(metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def server_info(request: Request) -> Response:
        return JSONResponse(server_facts.server_info(engine.cfg, engine_type, model_name, tokenizer, max_context))

    async def model_info(request: Request) -> Response:
        return JSONResponse(server_facts.model_info(engine_type, model_name, tokenizer, tokenizer.eos_token_id,
                                                    max_context))

    async def load(request: Request) -> Response:
        return JSONResponse(server_facts.load(engine.stats))

    async def flush_cache(request: Request) -> Response:
        if isinstance(engine, DecodeEngine):  # no prefix cache on the decode side: nothing to drop
            return JSONResponse({"message": "Cache flushed."})
        try:
            flushed = await _answer(engine.flush_cache())
        except TimeoutError:
            return _error(503, f"the {engine_type} engine is not answering")
        if flushed:
            return JSONResponse({"message": "Cache flushed."})
        return _error(400, "Cache not flushed: requests are running.")

    async def abort_request(request: Request) -> Response:
        body = await read_json(request, min(MAX_BODY_BYTES, server_cfg.max_body_bytes))
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        try:
            if body.get("abort_all") is True:
                return JSONResponse({"aborted": await _answer(engine.abort_all())})
            rid = body.get("rid")
            if not isinstance(rid, str) or not rid:
                return _error(400, "'rid' must be a request id string", "rid")
            return JSONResponse({"rid": rid, "aborted": bool(await _answer(engine.abort(rid)))})
        except TimeoutError:
            return _error(503, f"the {engine_type} engine is not answering")

    return Starlette(routes=[
        Route("/health", guarded(health), methods=["GET"]),
        Route("/health_generate", guarded(health), methods=["GET"]),
        Route("/metrics", guarded(metrics_text), methods=["GET"]),
        Route("/server_info", guarded(server_info), methods=["GET"]),
        Route("/get_server_info", guarded(server_info), methods=["GET"]),
        Route("/model_info", guarded(model_info), methods=["GET"]),
        Route("/get_model_info", guarded(model_info), methods=["GET"]),
        Route("/get_load", guarded(load), methods=["GET"]),
        Route("/flush_cache", guarded(flush_cache), methods=["GET", "POST"]),
        Route("/abort_request", guarded(abort_request), methods=["POST"]),
    ], middleware=auth_middleware(server_cfg), exception_handlers={HTTPException: http_error})
