"""The HTTP server: OpenAI and SGLang endpoints over an engine, as a Starlette app.

`build_app(engine, frontend, cfg)` needs only the engine interface (`generate`, `abort`,
`stats`, `flush_cache`, `alive`, `max_context`, `eos_token_id`; an EngineConfig as `config` or
`cfg`, if present, feeds /get_server_info and `sglang:num_used_tokens`). Request ids: the response `id` (`chatcmpl-...` / `cmpl-...`) is the engine
rid, so `/abort_request` can target it.

Disconnects: a streamed response is cancelled by Starlette when `http.disconnect` arrives
(uvicorn speaks ASGI spec 2.3, so Starlette listens for it); a non-streamed one is watched
here. Either way the engine's generator is closed, which aborts the request in the engine.
"""

from __future__ import annotations

import dataclasses
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
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .frontend import Frontend, PreparedRequest, RequestError, TokenEventLike
from .metrics import CONTENT_TYPE, ServerMetrics
from .request import FinishReason, SamplingParams

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


class _SSEResponse(StreamingResponse):
    """A StreamingResponse that always closes its body iterator and its run, even when the
    client left while the body was suspended at a `yield` or had not started (Starlette then
    cancels without closing anything)."""

    def __init__(self, content: AsyncIterator[str], run: _Run) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await self.run.close(completed=False)  # a no-op when the body closed it


class _Run:
    """One engine generation: its generator, timing for the metrics, and cleanup."""

    def __init__(self, server: _Server, req: PreparedRequest, arrival: float) -> None:
        self.server, self.req, self.arrival = server, req, arrival
        self.gen = server.engine.generate(req.rid, req.prompt_ids, req.params)
        self.first_token_at: float | None = None
        self.closed = False
        server.active[req.rid] = arrival

    @property
    def events(self) -> AsyncIterator[TokenEventLike]:
        return _Timed(self)

    async def close(self, completed: bool) -> None:
        """Close the engine generator (aborts the request if still running); record latency.
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            await self.gen.aclose()
        self.server.active.pop(self.req.rid, None)
        if completed:
            self.server.metrics.observe_request(time.monotonic() - self.arrival)


class _Timed:
    """Iterates a run's events and notes the first token for the TTFT histogram."""

    def __init__(self, run: _Run) -> None:
        self.run = run

    def __aiter__(self) -> _Timed:
        return self

    async def __anext__(self) -> TokenEventLike:
        event = await self.run.gen.__anext__()
        if self.run.first_token_at is None and event.token_ids:
            self.run.first_token_at = time.monotonic()
            self.run.server.metrics.observe_first_token(self.run.first_token_at - self.run.arrival)
        return event


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
        self.active: dict[str, float] = {}  # rid -> arrival, for abort_all and logs

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
        return await self._generate(request, self.frontend.prepare_chat, self.frontend.stream_chat,
                                    self.frontend.complete_chat)

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
        run = _Run(self, req, arrival)
        if req.stream:
            return _SSEResponse(self._sse(run, stream(req, run.events)), run)
        result = None
        try:
            async with anyio.create_task_group() as tg:
                async def work() -> None:
                    nonlocal result
                    result = await collect(req, run.events)
                    tg.cancel_scope.cancel()

                async def watch_disconnect() -> None:
                    while (await request.receive())["type"] != "http.disconnect":
                        pass
                    log.info("request %s: client disconnected", req.rid)
                    tg.cancel_scope.cancel()

                tg.start_soon(work)
                tg.start_soon(watch_disconnect)
        finally:
            await run.close(completed=result is not None)
        if result is None:
            raise RequestError(503, f"request {req.rid} was aborted", code="request_aborted")
        return JSONResponse(result)

    async def _sse(self, run: _Run, payloads: AsyncIterator[str]) -> AsyncIterator[str]:
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
        return Response(status_code=200 if self.engine.alive() else 503)

    async def health_generate(self, request: Request) -> Response:
        """200 when the engine produces one token within the timeout, else 503."""
        if not self.engine.alive():
            return Response(status_code=503)
        ok = False
        gen = self.engine.generate(f"health-{uuid.uuid4().hex}", self.frontend.tokenizer.encode(HEALTH_PROMPT),
                                   SamplingParams(max_tokens=1, temperature=0.0))
        try:
            with anyio.move_on_after(self.cfg.health_generate_timeout_s):
                async for event in gen:
                    if event.token_ids or event.finish_reason is not None:
                        ok = event.finish_reason is not FinishReason.ABORT
                        break
        finally:
            with anyio.CancelScope(shield=True):
                await gen.aclose()
        return Response(status_code=200 if ok else 503)

    async def server_info(self, request: Request) -> Response:
        engine_cfg = self.engine_cfg
        facts = dataclasses.asdict(engine_cfg) if dataclasses.is_dataclass(engine_cfg) else {}
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
            rids = list(self.active)
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
