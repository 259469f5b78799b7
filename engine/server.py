"""The HTTP server: OpenAI and SGLang endpoints over an engine, as a Starlette app.

SGLang's native `/generate` (engine/native_api.py) goes the same way as the OpenAI generation
endpoints (`_Server._generate`): edge checks, the PD halves' room rule and health-probe header,
disconnects and aborts.

`build_app(engine, frontend, cfg)` needs only the engine interface, `ServingEngine`
(engine/serving_engine.py: `generate`, `abort`, `stats`, `flush_cache`, `alive`, `max_context`,
`eos_token_id`, and its EngineConfig as `cfg`, which feeds /get_server_info,
`sglang:num_used_tokens` and the planted faults).
The response `id` (`chatcmpl-...` / `cmpl-...`) is the engine rid, so `/abort_request` can
target it.

Disconnects: a streamed response is cancelled by Starlette when `http.disconnect` arrives
(uvicorn speaks ASGI spec 2.3, so Starlette listens for it); a non-streamed one is watched
here. Either way the engine's generator is closed, which aborts the request in the engine.

Health: `/health` and `/health_generate` share one handler, as in SGLang: a real one-token
probe request (rid prefix `HEALTH_CHECK_`: not counted in the request counters or the queue
gauges) must produce its token within `health_generate_timeout_s`, else 503. A probe waits its
turn like any request, so under saturation a poll may time out: a new request waits as long.
On a PD half the probe goes through that half alone (engine/pd/worker.py says how).

Hostile input: every POST body crosses engine/request_limits.py (size, nesting depth, integer
range, finite numbers, encodable strings) before anything reads it, so a client's bytes are a
JSON 4xx naming the field (`param`), never a 500. A request the engine fails on its own (its
sampling raised in the loop, say) is a 500 JSON, or an in-band error event ending a stream.

Authentication: with `api_key` every path needs `Authorization: Bearer KEY` except `/health`
and `/metrics`, open by default because Kubernetes probes and Prometheus scrapers usually
carry no key; `auth_health_metrics` closes them too. The PD halves are this app too, and
our PD router (engine/pd/http_router.py) uses the same middleware and the same rule.

Planted faults (engine/faults.py, engine/STRUCTURE.md "Faults") living here: `ghost-decode`
(engine/generations.py), `health-lies` (`/health` answers from the liveness flag) and `parser-split`
(streamed chat goes through engine/stream_parse_fault.py).
"""

from __future__ import annotations

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

from . import server_facts
from .faults import Fault
from .frontend import Frontend
from .prepared_request import PreparedRequest
from .metrics import CONTENT_TYPE, ServerMetrics
from .native_api import NativeAPI
from .outputs import TokenEventLike
from .request import HEALTH_PROBE_PREFIX, FinishReason, SamplingParams
from .request_limits import RequestError, parse_json, read_body
from .generations import Generation, Generations, SSEResponse, unless_disconnected
from .serving_engine import ServingEngine
from .stream_parse_fault import EagerParseChatOutput

log = logging.getLogger("dsv4bench.engine.server")

OPEN_PATHS = frozenset({"/health", "/metrics"})  # no API key needed (unless auth_health_metrics)
HEALTH_PROMPT = "<｜begin▁of▁sentence｜><｜User｜>ping<｜Assistant｜></think>"
PD_HALVES = ("prefill", "decode")  # ServerConfig.engine_type of a PD deployment's two halves
# Our PD router's /health probe through both halves (engine/pd/http_router.py): the halves give
# it a health-probe rid, so the gauges and counters leave it out as a unified server's own.
HEALTH_PROBE_HEADER = "x-dsv4bench-health-probe"


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
    # NOTE: off by default: Kubernetes probes and Prometheus scrapers usually carry no key.
    auth_health_metrics: bool = False  # with api_key, /health and /metrics need the key too

    @property
    def open_paths(self) -> frozenset[str]:
        """The paths served without the API key."""
        return frozenset() if self.auth_health_metrics else OPEN_PATHS


_PARSE_IN_THREAD_BYTES = 64 * 1024  # larger bodies are parsed and checked off the event loop


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(RequestError(status, message, param, code).body(), status_code=status)


class BearerAuth:
    """Pure ASGI middleware: `Authorization: Bearer <api_key>` on every path but `open_paths`.
    Every port of the engine (unified, PD router, prefill, decode) uses this one."""

    def __init__(self, app: ASGIApp, api_key: str, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app, self.key, self.open_paths = app, api_key.encode(), open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            if not self.authorized(Headers(scope=scope).get("authorization", "")):
                await _error(401, "Incorrect API key provided.", None, "invalid_api_key")(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def authorized(self, header: str) -> bool:
        """`header` is `Bearer KEY`; the scheme in any case (RFC 9110, 11.1), as SGLang reads it."""
        scheme, _, token = header.partition(" ")
        return secrets.compare_digest(token.encode(), self.key) and scheme.lower() == "bearer"


def auth_middleware(cfg: ServerConfig) -> list[Middleware]:
    """The API-key middleware for an app served with `cfg` (none without a key)."""
    return [Middleware(BearerAuth, api_key=cfg.api_key, open_paths=cfg.open_paths)] if cfg.api_key else []


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request's JSON body through the edge checks (engine/request_limits.py)."""
    try:
        raw = await read_body(request.stream(), request.headers.get("content-length"), max_bytes)
    except ClientDisconnect:
        raise RequestError(400, "the client disconnected while sending the body") from None
    if len(raw) > _PARSE_IN_THREAD_BYTES:
        return await run_in_threadpool(parse_json, raw)
    return parse_json(raw)


Handler = Callable[[Request], Awaitable[Response]]


def guarded(handler: Handler) -> Handler:
    """RequestError -> its 4xx; anything unexpected -> a logged 500. The server keeps serving."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            refusal = request_error(exc)
            if refusal is not None:
                return JSONResponse(refusal.body(), status_code=refusal.status)
            log.exception("unhandled error in %s %s", request.method, request.url.path)
            return _error(500, f"internal server error: {type(exc).__name__}", code="internal_error")

    return run


def request_error(exc: BaseException) -> RequestError | None:
    """`exc` if it is a RequestError, or the first one inside an exception group (what an
    anyio task group raises), else None."""
    if isinstance(exc, RequestError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = request_error(inner)
        if found is not None:
            return found
    return None


def model_list(model_name: str, max_context: int) -> dict[str, Any]:
    """`/v1/models`: the one model every server of the engine serves (the PD router's too)."""
    card = {
        "id": model_name,
        "object": "model",
        "created": 0,
        "owned_by": "dsv4bench",
        "root": model_name,
        "max_model_len": max_context,
    }
    return {"object": "list", "data": [card]}


class _Server:
    """The handlers, bound to one engine, front end and config."""

    def __init__(self, engine: ServingEngine, frontend: Frontend, cfg: ServerConfig) -> None:
        self.engine, self.frontend, self.cfg = engine, frontend, cfg
        self.native = NativeAPI(frontend)
        self.engine_cfg = engine.cfg
        self.metrics = ServerMetrics(engine.stats, cfg.model_name, cfg.engine_type, self.engine_cfg.page_size)
        faults = self.engine_cfg.faults
        self.generations = Generations(engine, self.metrics, ghost_decode=Fault.GHOST_DECODE in faults)
        self.health_lies = Fault.HEALTH_LIES in faults
        self.parser_split = Fault.PARSER_SPLIT in faults
        self.health_prompt_ids = frontend.tokenizer.encode(HEALTH_PROMPT)
        # A prefill or decode server of a PD deployment in separate processes (engine/pd/worker.py):
        # it takes only a PD router's requests (its health probe excepted: the half gives it a room).
        self.pd_half = cfg.engine_type in PD_HALVES

    async def read_json(self, request: Request) -> Any:
        return await read_json(request, self.cfg.max_body_bytes)

    # ---- OpenAI ----------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        stream = self.frontend.stream_chat
        if self.parser_split:  # the fault: streamed chat goes through the eager tool-call parse
            stream = functools.partial(self.frontend.stream_chat, output=EagerParseChatOutput)
        return await self._generate(request, self.frontend.prepare_chat, stream, self.frontend.complete_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(
            request,
            self.frontend.prepare_completion,
            self.frontend.stream_completion,
            self.frontend.complete_completion,
        )

    async def _generate(
        self,
        request: Request,
        prepare: Callable[[Any], PreparedRequest],
        stream: Callable[..., AsyncIterator[str]],
        collect: Callable[..., Awaitable[Any]],
    ) -> Response:
        arrival = time.monotonic()
        body = await self.read_json(request)
        req = await run_in_threadpool(prepare, body)
        if self.pd_half and req.bootstrap is None:
            raise RequestError(
                400,
                f"a {self.cfg.engine_type} server takes a PD router's requests: bootstrap_host, "
                "bootstrap_port and bootstrap_room are required",
                "bootstrap_room",
            )
        if self.pd_half and request.headers.get(HEALTH_PROBE_HEADER) == "1":
            req.rid = f"{HEALTH_PROBE_PREFIX}{req.rid}"
        if req.rid in self.generations.active:  # a client's own rid (/generate): the engine keys requests by it
            raise RequestError(400, f"request id {req.rid!r} is already in flight", "rid")
        if not self.engine.alive():
            raise RequestError(503, "the engine is not running", code="engine_unavailable")
        tags = {k: v for k, v in request.headers.items() if k.startswith("x-dsv4bench-")}
        log.info(
            "request %s prompt_tokens=%d max_tokens=%d stream=%s %s",
            req.rid,
            len(req.prompt_ids),
            req.params.max_tokens,
            req.stream,
            tags or "",
        )
        gen = self.generations.start(req, arrival)
        events = _FailedRequests(gen.events)
        if req.stream:
            return SSEResponse(self._sse(gen, stream(req, events)), gen)
        result = None
        try:
            if self.generations.ghost_decode:  # the fault: nobody watches for the client leaving
                result = await collect(req, events)
            else:
                result = await unless_disconnected(request, lambda: collect(req, events))
        finally:
            await gen.close(completed=result is not None)
        if result is None:
            raise RequestError(503, f"request {req.rid} was aborted", code="request_aborted")
        return JSONResponse(result)

    async def _sse(self, gen: Generation, payloads: AsyncIterator[str]) -> AsyncIterator[str]:
        completed = False
        try:
            async for data in payloads:
                yield f"data: {data}\n\n"
                completed = data == "[DONE]"
        except Exception as exc:  # the response has started: report in-band, end without [DONE]
            refusal = request_error(exc)
            if refusal is None:
                log.exception("request %s failed mid-stream", gen.req.rid)
                refusal = RequestError(500, f"internal server error: {type(exc).__name__}")
            yield f"data: {json.dumps(refusal.body())}\n\n"
        finally:
            with anyio.CancelScope(shield=True):
                await payloads.aclose()  # type: ignore[attr-defined]  # an async generator, typed as an iterator
                await gen.close(completed)

    async def models(self, request: Request) -> Response:
        return JSONResponse(model_list(self.cfg.model_name, self.engine.max_context))

    # ---- SGLang ----------------------------------------------------------------------------

    async def generate(self, request: Request) -> Response:
        """SGLang's native `/generate`."""
        return await self._generate(request, self.native.prepare, self.native.stream, self.native.collect)

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
        gen = self.engine.generate(
            f"{HEALTH_PROBE_PREFIX}{uuid.uuid4().hex}",
            self.health_prompt_ids,
            SamplingParams(max_tokens=1, temperature=0.0),
        )
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
        facts = server_facts.server_info(
            self.engine_cfg, self.cfg.engine_type, self.cfg.model_name, self.frontend.tokenizer, self.engine.max_context
        )
        bootstrap_port = getattr(self.engine, "bootstrap_port", None)  # a PD prefill server's
        if bootstrap_port is not None:
            facts["disaggregation_bootstrap_port"] = bootstrap_port
        return JSONResponse(facts)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse(
            server_facts.model_info(
                self.cfg.engine_type,
                self.cfg.model_name,
                self.frontend.tokenizer,
                self.engine.eos_token_id,
                self.engine.max_context,
            )
        )

    async def load(self, request: Request) -> Response:
        return JSONResponse(server_facts.load(self.engine.stats()))

    async def abort_request(self, request: Request) -> Response:
        body = await self.read_json(request)
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        if body.get("abort_all") is True:
            rids = list(self.generations.active)  # ghost-decode's forgotten generations too: abort_all is their way out
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


class _FailedRequests:
    """A generation's events, raising a 500 RequestError at an event that says the engine failed the
    request (`TokenEvent.error`: it raised in the loop, which went on serving the others)."""

    def __init__(self, events: AsyncIterator[TokenEventLike]) -> None:
        self.events = events

    def __aiter__(self) -> _FailedRequests:
        return self

    async def __anext__(self) -> TokenEventLike:
        event = await self.events.__anext__()
        error = getattr(event, "error", None)
        if error is not None:
            raise RequestError(500, f"the engine failed this request: {error}", code="engine_error")
        return event


async def http_error(request: Request, exc: Exception) -> Response:
    """404 / 405 and the like as OpenAI-style JSON errors (Starlette's own are plain text)."""
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    messages = {404: f"Not found: {request.url.path}", 405: f"Method {request.method} not allowed"}
    message = messages.get(status, exc.detail)
    response = _error(status, message, code="not_found" if status == 404 else None)
    response.headers.update(exc.headers or {})
    return response


def build_app(engine: ServingEngine, frontend: Frontend, server_cfg: ServerConfig) -> Starlette:
    """The Starlette app serving `engine` through `frontend`."""
    s = _Server(engine, frontend, server_cfg)
    routes = [
        Route("/v1/chat/completions", guarded(s.chat), methods=["POST"]),
        Route("/v1/completions", guarded(s.completions), methods=["POST"]),
        Route("/v1/models", guarded(s.models), methods=["GET"]),
        Route("/generate", guarded(s.generate), methods=["POST"]),
        Route("/health", guarded(s.health), methods=["GET"]),
        Route("/health_generate", guarded(s.health_generate), methods=["GET"]),
        Route("/server_info", guarded(s.server_info), methods=["GET"]),
        Route("/get_server_info", guarded(s.server_info), methods=["GET"]),
        Route("/model_info", guarded(s.model_info), methods=["GET"]),
        Route("/get_model_info", guarded(s.model_info), methods=["GET"]),
        Route("/get_load", guarded(s.load), methods=["GET"]),
        Route("/abort_request", guarded(s.abort_request), methods=["POST"]),
        Route("/flush_cache", guarded(s.flush_cache), methods=["GET", "POST"]),
        Route("/metrics", guarded(s.metrics_text), methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, middleware=auth_middleware(server_cfg), exception_handlers={HTTPException: http_error}
    )
    app.state.server = s
    return app
