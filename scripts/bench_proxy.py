"""What `dsv4bench proxy` adds: latency per chunk and per request at 80 concurrent streams, through
the proxy and straight to the server, side by side in one run.

The upstream is a fast loopback SSE server in its own process that stamps each chunk with the
wall clock at which it wrote it; the proxy is `dsv4bench proxy` as a user runs it, in its own
process, auditing every stream. Rounds alternate direct and proxied so both see the same
machine. Per chunk: the time from the upstream's stamp to the client's read; per request: the
time to the first chunk and to the end. The medians of each, and the difference, are printed
(figures go to bench-plan.md).

    python scripts/bench_proxy.py [--streams 80] [--chunks 64] [--interval-ms 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def serve_upstream(port: int, chunks: int, interval_s: float) -> None:
    """The upstream: every chat completion streams `chunks` content deltas, `interval_s` apart."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    def event(delta: dict, finish: str | None = None) -> bytes:
        body = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "bench",
            "sent_ns": time.time_ns(),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(body)}\n\n".encode()

    async def chat(_: Request) -> Response:
        async def gen():
            yield event({"role": "assistant", "content": ""})
            for i in range(chunks):
                await asyncio.sleep(interval_s)
                yield event({"content": f"word{i} "})
            yield event({}, "stop")
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def free_port() -> int:
    from dsv4bench.engine.launcher import free_port as pick

    return pick()


def wait_ready(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {proc.returncode}")
        try:
            if httpx.get(f"{url}/models", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start")


async def one_stream(client: httpx.AsyncClient, base_url: str, chunk_ms: list[float]) -> tuple[float, float]:
    """One streamed request: (ms to its first chunk, ms to its end); each chunk's delay appended."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "go"}], "stream": True}
    start = time.perf_counter()
    first = None
    buf = b""
    async with client.stream("POST", f"{base_url}/chat/completions", json=body) as resp:
        async for piece in resp.aiter_raw():
            now_ns = time.time_ns()
            if first is None:
                first = time.perf_counter()
            buf += piece
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                if ev.startswith(b"data: {"):
                    chunk_ms.append((now_ns - json.loads(ev[6:])["sent_ns"]) / 1e6)
    end = time.perf_counter()
    return ((first or end) - start) * 1e3, (end - start) * 1e3


async def one_round(base_url: str, streams: int) -> tuple[list[float], list[float], list[float]]:
    chunk_ms: list[float] = []
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as client:
        results = await asyncio.gather(*(one_stream(client, base_url, chunk_ms) for _ in range(streams)))
    return chunk_ms, [r[0] for r in results], [r[1] for r in results]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=80, help="concurrent streams per round")
    p.add_argument("--chunks", type=int, default=64, help="content chunks per stream")
    p.add_argument("--interval-ms", type=float, default=20.0, help="gap between the upstream's chunks")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each, direct and proxied alternating")
    p.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the upstream's own process
    a = p.parse_args()
    if a.serve_upstream is not None:
        return serve_upstream(a.serve_upstream, a.chunks, a.interval_ms / 1e3)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    up_port, proxy_port = free_port(), free_port()
    upstream = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve-upstream",
            str(up_port),
            "--chunks",
            str(a.chunks),
            "--interval-ms",
            str(a.interval_ms),
        ],
        env=env,
    )
    out = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    direct_url = f"http://127.0.0.1:{up_port}/v1"
    proxy = None
    stdout = ""
    try:
        wait_ready(direct_url, upstream, "the upstream")
        proxy = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dsv4bench",
                "proxy",
                "--upstream",
                direct_url,
                "--port",
                str(proxy_port),
                "--out",
                str(out),
                "--quiet",
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        proxied_url = f"http://127.0.0.1:{proxy_port}/v1"
        wait_ready(proxied_url, proxy, "the proxy")
        asyncio.run(one_round(direct_url, 8))  # warm both paths' connections and code
        asyncio.run(one_round(proxied_url, 8))
        got: dict[str, tuple[list[float], list[float], list[float]]] = {"direct": ([], [], []), "proxy": ([], [], [])}
        for _ in range(a.rounds):
            for name, url in (("direct", direct_url), ("proxy", proxied_url)):
                for kept, new in zip(got[name], asyncio.run(one_round(url, a.streams))):
                    kept.extend(new)
    finally:
        if proxy is not None:
            proxy.send_signal(2)
            stdout, _ = proxy.communicate(timeout=120)
        upstream.terminate()
        upstream.wait(10)
    med = {name: [statistics.median(xs) for xs in got[name]] for name in got}
    print(
        f"{a.streams} concurrent streams x {a.rounds} rounds each, {a.chunks} chunks {a.interval_ms:g} ms apart, "
        f"{os.cpu_count()} CPUs (client, upstream and proxy share them)"
    )
    print(f"{'median, ms':<28}{'direct':>10}{'proxy':>10}{'added':>10}")
    for i, what in enumerate(("per chunk (write to read)", "per request: first chunk", "per request: whole stream")):
        print(f"{what:<28}{med['direct'][i]:>10.2f}{med['proxy'][i]:>10.2f}{med['proxy'][i] - med['direct'][i]:>10.2f}")
    p90 = {name: statistics.quantiles(got[name][0], n=10)[-1] for name in got}
    print(f"{'p90 per chunk':<28}{p90['direct']:>10.2f}{p90['proxy']:>10.2f}{p90['proxy'] - p90['direct']:>10.2f}")
    print(f"proxy's audit: {stdout.strip().splitlines()[-1] if stdout.strip() else '(no verdict line)'}")


if __name__ == "__main__":
    main()
