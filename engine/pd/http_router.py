"""Our PD router over HTTP: what `engine serve --pd` puts in front of its prefill and decode
processes by default, speaking SGLang's PD request protocol as SGLang's router does
(engine/sglang_router.py starts that one instead).

Each generation request (`/v1/chat/completions`, `/v1/completions`, SGLang's native
`/generate`) gets a fresh random 63-bit `bootstrap_room` and the prefill server's
`bootstrap_host` and `bootstrap_port`, and goes to both halves at once; the client gets the
decode's answer, streamed or not. A client that leaves closes both upstream connections, which
aborts the request on each half in whatever queue it is (SGLang's router never calls
/abort_request either). A decode that answers an error gets that error back to the client,
and the prefill's half is closed with it.

`/health` is one short generation through both halves within `health_timeout_s` (a request
the halves leave out of their gauges), so a deployment that cannot produce a token is 503;
with the planted `health-lies` fault it answers from the halves' own /health. `/workers` lists
the two halves as SGLang's router does; `/metrics` has the router's own gauges (requests in
flight) under `engine_type="router"`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .. import server_facts
from ..config import EngineConfig
from ..faults import Fault
from ..generations import unless_disconnected
from ..metrics import CONTENT_TYPE, ServerMetrics
from ..request_limits import RequestError
from ..server import HEALTH_PROBE_HEADER, ServerConfig, auth_middleware, guarded, http_error, model_list, read_json
from ..server_loop import EngineStats
from ..tokenizer import DSV4Tokenizer

log = logging.getLogger("dsv4bench.engine.pd")

HEALTH_PROBE = {"prompt": "ping", "max_tokens": 1, "temperature": 0}


@dataclass(frozen=True)
class Halves:
    """Where the two halves answer, and the prefill's bootstrap port."""

    prefill: str  # root URL
    decode: str
    bootstrap_port: int

    @property
    def bootstrap_host(self) -> str:
        return urlsplit(self.prefill).hostname or "127.0.0.1"


class _Router:
    def __init__(
        self,
        halves: Halves,
        cfg: EngineConfig,
        tokenizer: DSV4Tokenizer,
        max_context: int,
        server_cfg: ServerConfig,
        health_timeout_s: float,
    ) -> None:
        self.halves, self.cfg, self.tokenizer, self.max_context = halves, cfg, tokenizer, max_context
        self.server_cfg, self.health_timeout_s = server_cfg, health_timeout_s
        self.health_lies = Fault.HEALTH_LIES in cfg.faults
        headers = {"Authorization": f"Bearer {server_cfg.api_key}"} if server_cfg.api_key else {}
        # NOTE: no pool limit: every client connection is one upstream pair, as in SGLang's router;
        # no keep-alive either, so a connection ends with its request and none outlives the router.
        self.client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(None, connect=5.0),
            trust_env=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )
        self.active = 0
        self.counts: Counter[str] = Counter()
        self.metrics = ServerMetrics(self.stats, server_cfg.model_name, "router", cfg.page_size)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=self.active,
            num_requests_total=self.counts["requests"],
            num_aborted_total=self.counts["aborted"],
        )

    # ---- generation -------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self._route(request, "/v1/chat/completions")

    async def completions(self, request: Request) -> Response:
        return await self._route(request, "/v1/completions")

    async def generate(self, request: Request) -> Response:
        return await self._route(request, "/generate")

    def _with_room(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            **body,
            "bootstrap_host": self.halves.bootstrap_host,
            "bootstrap_port": self.halves.bootstrap_port,
            "bootstrap_room": secrets.randbits(63),
        }

    async def _route(self, request: Request, path: str) -> Response:
        body = await read_json(request, self.server_cfg.max_body_bytes)
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        body = self._with_room(body)
        arrival = time.monotonic()
        prefill = asyncio.ensure_future(self.client.post(self.halves.prefill + path, json=body))
        try:
            decode = await self.client.send(
                self.client.build_request("POST", self.halves.decode + path, json=body), stream=True
            )
        except httpx.HTTPError as e:
            await _cancel(prefill)
            raise RequestError(
                503, f"the decode server is not answering: {type(e).__name__}", code="engine_unavailable"
            )
        self.active += 1
        self.counts["requests"] += 1
        done = _Upstream(self, decode, prefill, arrival)
        if decode.status_code != 200 or not body.get("stream"):
            content = await unless_disconnected(request, decode.aread)
            await done.close(completed=content is not None and decode.status_code == 200)
            if content is None:
                raise RequestError(503, "the client disconnected", code="request_aborted")
            return Response(content, status_code=decode.status_code, media_type=decode.headers.get("content-type"))
        return _ProxyStream(done)

    # ---- SGLang's endpoints -------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if self.health_lies:  # the fault: the halves' liveness stands in for a generation
            return Response(status_code=200 if await self._halves_alive() else 503)
        return Response(status_code=200 if await self._probe() else 503)

    async def _halves_alive(self) -> bool:
        try:
            answers = await asyncio.gather(
                *(
                    self.client.get(f"{root}/health", timeout=self.health_timeout_s)
                    for root in (self.halves.prefill, self.halves.decode)
                )
            )
        except httpx.HTTPError:
            return False
        return all(r.status_code == 200 for r in answers)

    async def _probe(self) -> bool:
        """One one-token completion through both halves within the health timeout."""
        body = self._with_room(HEALTH_PROBE)
        headers = {HEALTH_PROBE_HEADER: "1"}
        halves = [
            asyncio.ensure_future(self.client.post(root + "/v1/completions", json=body, headers=headers))
            for root in (self.halves.prefill, self.halves.decode)
        ]
        try:
            done, late = await asyncio.wait(halves, timeout=self.health_timeout_s)
        finally:
            for task in halves:  # past the deadline: closing the requests aborts them on the halves
                await _cancel(task)
        return not late and all(t.exception() is None and t.result().status_code == 200 for t in done)

    async def workers(self, request: Request) -> Response:
        alive = [await self._alive(root) for root in (self.halves.prefill, self.halves.decode)]
        listed = [
            {
                "url": self.halves.prefill,
                "worker_type": "prefill",
                "bootstrap_port": self.halves.bootstrap_port,
                "is_healthy": alive[0],
            },
            {"url": self.halves.decode, "worker_type": "decode", "is_healthy": alive[1]},
        ]
        return JSONResponse({"workers": listed, "total": 2, "stats": {"prefill_count": 1, "decode_count": 1}})

    async def _alive(self, root: str) -> bool:
        try:
            return (await self.client.get(f"{root}/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def server_info(self, request: Request) -> Response:
        facts = server_facts.server_info(
            self.cfg, "router", self.server_cfg.model_name, self.tokenizer, self.max_context
        )
        return JSONResponse(
            {
                **facts,
                "prefill_urls": [self.halves.prefill],
                "decode_urls": [self.halves.decode],
                "disaggregation_bootstrap_port": self.halves.bootstrap_port,
            }
        )

    async def model_info(self, request: Request) -> Response:
        return JSONResponse(
            server_facts.model_info(
                "router", self.server_cfg.model_name, self.tokenizer, self.tokenizer.eos_token_id, self.max_context
            )
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse(model_list(self.server_cfg.model_name, self.max_context))

    async def to_both(self, request: Request) -> Response:
        """`/abort_request` and `/flush_cache`: to both halves; the decode's answer is the router's
        (it knows the client's request ids; an abort there reaches the prefill through the room)."""
        raw = await request.body()
        try:
            answers = await asyncio.gather(
                *(
                    self.client.request(
                        request.method,
                        root + request.url.path,
                        content=raw,
                        headers={"content-type": "application/json"},
                        timeout=10.0,
                    )
                    for root in (self.halves.prefill, self.halves.decode)
                )
            )
        except httpx.HTTPError as e:
            raise RequestError(503, f"a PD server is not answering: {type(e).__name__}") from None
        decode = answers[1]
        return Response(decode.content, status_code=decode.status_code, media_type=decode.headers.get("content-type"))

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def _cancel(task: asyncio.Future) -> None:
    """Cancel an upstream request unless it is done, and wait until its connection is closed
    (a task left to the loop's end would leave its socket open)."""
    if not task.done():
        task.cancel()
    with anyio.CancelScope(shield=True):
        await asyncio.gather(task, return_exceptions=True)


class _Upstream:
    """One routed request's two upstream answers; closing it closes both, once."""

    def __init__(self, router: _Router, decode: httpx.Response, prefill: asyncio.Future, arrival: float) -> None:
        self.router, self.decode, self.prefill, self.arrival = router, decode, prefill, arrival
        self.first_byte_at: float | None = None
        self.closed = False

    async def close(self, completed: bool) -> None:
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            await self.decode.aclose()  # a decode still answering hears the client leave
            await _cancel(self.prefill)  # and so does a prefill
            self.router.active -= 1
            if completed:
                self.router.metrics.observe_request(time.monotonic() - self.arrival)
            else:
                self.router.counts["aborted"] += 1


class _ProxyStream(StreamingResponse):
    """The decode's SSE passed through; closed (both halves) when done or when the client
    leaves, even before the body started (Starlette then cancels without closing anything)."""

    def __init__(self, upstream: _Upstream) -> None:
        self.upstream = upstream
        super().__init__(
            self._body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _body(self) -> AsyncIterator[bytes]:
        completed = False
        try:
            async for chunk in self.upstream.decode.aiter_raw():
                if self.upstream.first_byte_at is None:
                    self.upstream.first_byte_at = time.monotonic()
                    self.upstream.router.metrics.observe_first_token(
                        self.upstream.first_byte_at - self.upstream.arrival
                    )
                completed = completed or b"[DONE]" in chunk
                yield chunk
        except httpx.HTTPError:
            pass  # the decode broke off: the stream ends without [DONE], as the client then sees
        finally:
            await self.upstream.close(completed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.upstream.close(completed=False)  # a no-op when the body closed it


def build_router_app(
    halves: Halves,
    cfg: EngineConfig,
    tokenizer: DSV4Tokenizer,
    max_context: int,
    server_cfg: ServerConfig,
    health_timeout_s: float,
) -> Starlette:
    r = _Router(halves, cfg, tokenizer, max_context, server_cfg, health_timeout_s)
    routes = [
        Route("/v1/chat/completions", guarded(r.chat), methods=["POST"]),
        Route("/v1/completions", guarded(r.completions), methods=["POST"]),
        Route("/v1/models", guarded(r.models), methods=["GET"]),
        Route("/generate", guarded(r.generate), methods=["POST"]),
        Route("/health", guarded(r.health), methods=["GET"]),
        Route("/health_generate", guarded(r.health), methods=["GET"]),
        Route("/workers", guarded(r.workers), methods=["GET"]),
        Route("/server_info", guarded(r.server_info), methods=["GET"]),
        Route("/get_server_info", guarded(r.server_info), methods=["GET"]),
        Route("/model_info", guarded(r.model_info), methods=["GET"]),
        Route("/get_model_info", guarded(r.model_info), methods=["GET"]),
        Route("/abort_request", guarded(r.to_both), methods=["POST"]),
        Route("/flush_cache", guarded(r.to_both), methods=["GET", "POST"]),
        Route("/metrics", guarded(r.metrics_text), methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, middleware=auth_middleware(server_cfg), exception_handlers={HTTPException: http_error}
    )
    app.state.router = r
    return app
