"""The HTTP server: OpenAI and SGLang endpoints over an engine, as a Starlette app.

`build_app(engine, frontend, cfg)` needs only the engine interface (`generate`, `abort`,
`stats`, `flush_cache`, `alive`, `max_context`, `eos_token_id`; an EngineConfig as `config` or
`cfg`, if present, feeds /get_server_info, `sglang:num_used_tokens` and the planted faults).
The response `id` (`chatcmpl-...` / `cmpl-...`) is the engine rid, so `/abort_request` can
target it.

Disconnects: a streamed response is cancelled by Starlette when `http.disconnect` arrives
(uvicorn speaks ASGI spec 2.3, so Starlette listens for it); a non-streamed one is watched
here. Either way the engine's generator is closed, which aborts the request in the engine.

Health: `/health` and `/health_generate` share one handler, as in SGLang: a real one-token
probe request (rid prefix `HEALTH_CHECK_`: not counted in the request counters or the queue
gauges) must produce its token within `health_generate_timeout_s`, else 503. A probe waits its
turn like any request, so under saturation a poll may time out: a new request waits as long.

Planted faults (engine/faults.py, engine/STRUCTURE.md "Faults") living here: `ghost-decode`
(engine/runs.py), `health-lies` (`/health` answers from the liveness flag) and `parser-split`
(streamed chat goes through engine/stream_parse_fault.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .frontend import Frontend, PreparedRequest, RequestError
from .metrics import CONTENT_TYPE, ServerMetrics
from .request import HEALTH_PROBE_PREFIX, FinishReason, SamplingParams
from .runs import Run, Runs, SSEResponse, unless_disconnected
from .stream_parse_fault import EagerParseChatOutput

log = logging.getLogger("dsv4bench.engine.server")

OPEN_PATHS = frozenset({"/health", "/metrics"})  # no API key needed
HEALTH_PROMPT = "<｜begin▁of▁sentence｜><｜User｜>ping<｜Assistant｜></think>"
VERSION = "0.1.0"


@dataclass(frozen=True)
class ServerConfig:
    """How the server listens and answers."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    model_name: str = "dsv4-mini"
    engine_type: str = "unified"  # "prefill" / "decode" in PD mode; a metrics label
    max_body_bytes: int = 32 * 1024 * 1024
    health_generate_timeout_s: float = 10.0


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(RequestError(status, message, param, code).body(), status_code=status)


class _BearerAuth:
    """Pure ASGI middleware: `Authorization: Bearer <api_key>` on every path but OPEN_PATHS."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = Headers(scope=scope).get("authorization", "").encode()
            if not secrets.compare_digest(given, self.expected):
                await _error(401, "Incorrect API key provided.", None, "invalid_api_key")(scope, receive, send)
                return
        await self.app(scope, receive, send)


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """RequestError -> its 4xx; anything unexpected -> a logged 500. The server keeps serving."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except Exception as exc:
            log.exception("unhandled error in %s %s", request.method, request.url.path)
            return _error(500, f"internal server error: {type(exc).__name__}", code="internal_error")

    return run


class _Server:
    """The handlers, bound to one engine, front end and config."""

    def __init__(self, engine: Any, frontend: Frontend, cfg: ServerConfig) -> None:
        self.engine, self.frontend, self.cfg = engine, frontend, cfg
        self.engine_cfg = getattr(engine, "config", None) or getattr(engine, "cfg", None)  # an EngineConfig
        self.metrics = ServerMetrics(engine.stats, cfg.model_name, cfg.engine_type,
                                     getattr(self.engine_cfg, "page_size", None))
        faults = getattr(self.engine_cfg, "faults", frozenset())
        self.runs = Runs(engine, self.metrics, ghost_decode="ghost-decode" in faults)
        self.health_lies = "health-lies" in faults
        self.parser_split = "parser-split" in faults
        self.health_prompt_ids = frontend.tokenizer.encode(HEALTH_PROMPT)

    async def read_json(self, request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.cfg.max_body_bytes):
            raise RequestError(413 if length.isdigit() else 400, "request body too large or bad Content-Length")
        data = bytearray()
        try:
            async for part in request.stream():
                data += part
                if len(data) > self.cfg.max_body_bytes:
                    raise RequestError(413, f"request body exceeds {self.cfg.max_body_bytes} bytes")
        except ClientDisconnect:
            raise RequestError(400, "the client disconnected while sending the body") from None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise RequestError(400, f"We could not parse the JSON body of your request: {exc}") from None

    # ---- OpenAI ----------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        stream = self.frontend.stream_chat
        if self.parser_split:  # the fault: streamed chat goes through the eager tool-call parse
            stream = functools.partial(self.frontend.stream_chat, output=EagerParseChatOutput)
        return await self._generate(request, self.frontend.prepare_chat, stream, self.frontend.complete_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, self.frontend.prepare_completion, self.frontend.stream_completion,
                                    self.frontend.complete_completion)

    async def _generate(self, request: Request, prepare: Callable[[Any], PreparedRequest],
                        stream: Callable[..., AsyncIterator[str]], collect: Callable[..., Awaitable[Any]]) -> Response:
        arrival = time.monotonic()
        body = await self.read_json(request)
        req = await run_in_threadpool(prepare, body)
        if not self.engine.alive():
            raise RequestError(503, "the engine is not running", code="engine_unavailable")
        tags = {k: v for k, v in request.headers.items() if k.startswith("x-dsv4bench-")}
        log.info("request %s prompt_tokens=%d max_tokens=%d stream=%s %s", req.rid, len(req.prompt_ids),
                 req.params.max_tokens, req.stream, tags or "")
        run = self.runs.start(req, arrival)
        if req.stream:
            return SSEResponse(self._sse(run, stream(req, run.events)), run)
        result = None
        try:
            if self.runs.ghost_decode:  # the fault: nobody watches for the client leaving
                result = await collect(req, run.events)
            else:
                result = await unless_disconnected(request, lambda: collect(req, run.events))
        finally:
            await run.close(completed=result is not None)
        if result is None:
            raise RequestError(503, f"request {req.rid} was aborted", code="request_aborted")
        return JSONResponse(result)

    async def _sse(self, run: Run, payloads: AsyncIterator[str]) -> AsyncIterator[str]:
        completed = False
        try:
            async for data in payloads:
                yield f"data: {data}\n\n"
                completed = data == "[DONE]"
        except Exception as exc:  # the response has started: report in-band, end without [DONE]
            log.exception("request %s failed mid-stream", run.req.rid)
            yield f"data: {json.dumps(RequestError(500, f'internal server error: {type(exc).__name__}').body())}\n\n"
        finally:
            with anyio.CancelScope(shield=True):
                await payloads.aclose()  # type: ignore[attr-defined]
                await run.close(completed)

    async def models(self, request: Request) -> Response:
        card = {"id": self.cfg.model_name, "object": "model", "created": 0, "owned_by": "dsv4bench",
                "root": self.cfg.model_name, "max_model_len": self.engine.max_context}
        return JSONResponse({"object": "list", "data": [card]})

    # ---- SGLang ----------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if self.health_lies:
            # The fault: the liveness flag stands in for a generation, so a loop that is alive
            # but cannot produce a token still answers 200.
            return Response(status_code=200 if self.engine.alive() else 503)
        return await self.health_generate(request)

    async def health_generate(self, request: Request) -> Response:
        """200 when a one-token probe request produces its token within the timeout; 503 when
        the engine is not running, the probe is aborted, or nothing comes in time."""
        if not self.engine.alive():
            return Response(status_code=503)
        ok = await unless_disconnected(request, self._probe)
        return Response(status_code=200 if ok else 503)

    async def _probe(self) -> bool:
        gen = self.engine.generate(f"{HEALTH_PROBE_PREFIX}{uuid.uuid4().hex}", self.health_prompt_ids,
                                   SamplingParams(max_tokens=1, temperature=0.0))
        try:
            with anyio.move_on_after(self.cfg.health_generate_timeout_s):
                async for event in gen:
                    if event.token_ids or event.finish_reason is not None:
                        return event.finish_reason is not FinishReason.ABORT
            return False
        except RuntimeError:  # the loop died since alive() was asked
            return False
        finally:
            with anyio.CancelScope(shield=True):
                await gen.aclose()  # aborts a probe still queued

    async def server_info(self, request: Request) -> Response:
        engine_cfg = self.engine_cfg
        facts = dataclasses.asdict(engine_cfg) if dataclasses.is_dataclass(engine_cfg) else {}
        if "faults" in facts:
            facts["faults"] = sorted(facts["faults"])
        model = facts.pop("model", {})
        info = {**facts, "model_path": self.cfg.model_name, "served_model_name": self.cfg.model_name,
                "context_length": self.engine.max_context, "vocab_size": self.frontend.tokenizer.vocab_size,
                "engine_type": self.cfg.engine_type, "version": VERSION, "model_config": model}
        return JSONResponse(info)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": self.cfg.model_name, "tokenizer_path": str(self.frontend.tokenizer.path),
                             "is_generation": True, "model_type": "dsv4-mini", "architectures": ["DSV4Mini"],
                             "eos_token_id": self.engine.eos_token_id, "context_length": self.engine.max_context})

    async def abort_request(self, request: Request) -> Response:
        body = await self.read_json(request)
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        if body.get("abort_all") is True:
            rids = list(self.runs.active)  # ghost-decode's forgotten runs too: abort_all is their way out
            return JSONResponse({"aborted": [rid for rid in rids if self.engine.abort(rid)]})
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise RequestError(400, "'rid' must be a request id string", "rid")
        return JSONResponse({"rid": rid, "aborted": bool(self.engine.abort(rid))})

    async def flush_cache(self, request: Request) -> Response:
        if await run_in_threadpool(self.engine.flush_cache):  # the engine may wait for its loop
            return JSONResponse({"message": "Cache flushed."})
        return _error(400, "Cache not flushed: requests are running.", code="cache_busy")

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    messages = {404: f"Not found: {request.url.path}", 405: f"Method {request.method} not allowed"}
    message = messages.get(status, exc.detail)
    response = _error(status, message, code="not_found" if status == 404 else None)
    response.headers.update(exc.headers or {})
    return response


def build_app(engine: Any, frontend: Frontend, server_cfg: ServerConfig) -> Starlette:
    """The Starlette app serving `engine` through `frontend`."""
    s = _Server(engine, frontend, server_cfg)
    routes = [
        Route("/v1/chat/completions", _guarded(s.chat), methods=["POST"]),
        Route("/v1/completions", _guarded(s.completions), methods=["POST"]),
        Route("/v1/models", _guarded(s.models), methods=["GET"]),
        Route("/health", _guarded(s.health), methods=["GET"]),
        Route("/health_generate", _guarded(s.health_generate), methods=["GET"]),
        Route("/get_server_info", _guarded(s.server_info), methods=["GET"]),
        Route("/get_model_info", _guarded(s.model_info), methods=["GET"]),
        Route("/abort_request", _guarded(s.abort_request), methods=["POST"]),
        Route("/flush_cache", _guarded(s.flush_cache), methods=["GET", "POST"]),
        Route("/metrics", _guarded(s.metrics_text), methods=["GET"]),
    ]
    middleware = [Middleware(_BearerAuth, api_key=server_cfg.api_key)] if server_cfg.api_key else []
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_error})
    app.state.server = s
    return app
