"""Client CPU per SSE chunk, dsv4bench's turn beside the peers, side by side in one run.

A loopback server (tests/fixtures/stream_server.py, its own process, pinned to core 0) streams
`--chunks` SSE events per answer as fast as it can to `--concurrency` concurrent streams; each
client variant runs in a process of its own, pinned to core 1, in turn (A B C ... A B C ...),
and its CPU (time.process_time of the load alone: imports and the first round of requests are
left out) is divided by the SSE events it read. Variants:

  aiohttp   an aiohttp loop like SGLang's bench_serving: read a line, strip `data: `, json.loads
  httpx     httpx's AsyncClient, aiter_lines + json.loads, nothing else
  sglang    SGLang's own bench_serving client (async_request_openai_chat_completions)
  ours      chat_turn + every checker of the turn (run_checks), over driver.make_client's client
  before    the same as `ours` with the dsv4bench of `--before-rev` (git archive, read-only)
  fallback  the same as `ours` over the path a run takes when aiohttp's internals changed
            (transport.seam_problems found some): httpx's own transport, httpcore

    python scripts/bench_client.py [--variants aiohttp,httpx,sglang,ours,before] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVER_CORE, CLIENT_CORE = 0, 1
WARMUP_ROUNDS = 1  # rounds of `concurrency` turns before the CPU clock starts


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and core < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {core})


def _body() -> dict[str, Any]:
    return {
        "model": "stream-bench",
        "messages": [{"role": "user", "content": "Read the server's entry point."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 1024,
    }


async def _load(one_turn: Any, concurrency: int, rounds: int) -> tuple[float, int]:
    """`concurrency` streams, each a warm-up turn, then (all warmed up) `rounds` counted turns:
    (CPU seconds of the counted turns, SSE events they read)."""
    counted = [0]
    warm = [0]
    go = asyncio.Event()

    async def worker() -> None:
        try:
            for _ in range(WARMUP_ROUNDS):
                await one_turn()
        finally:  # a failed turn ends the wait too: gather below raises its error
            warm[0] += 1
            if warm[0] == concurrency:
                go.set()
        await go.wait()
        for _ in range(rounds):
            n = await one_turn()  # NOTE: not `counted[0] += await ...`, which reads counted[0] before the await
            counted[0] += n

    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    await go.wait()
    start = time.process_time()
    await asyncio.gather(*workers)
    return time.process_time() - start, counted[0]


async def run_aiohttp(url: str, concurrency: int, rounds: int) -> tuple[float, int]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + 8)) as session:

        async def one_turn() -> int:
            n, text = 0, ""
            async with session.post(url, json=_body()) as resp:
                async for line in resp.content:
                    line = line.strip()
                    if not line:
                        continue
                    n += 1
                    chunk = line.decode("utf-8").removeprefix("data: ")
                    if chunk != "[DONE]":
                        data = json.loads(chunk)
                        choices = data.get("choices") or []
                        if choices:
                            text += (choices[0].get("delta") or {}).get("content") or ""
            return n

        return await _load(one_turn, concurrency, rounds)


async def run_httpx(url: str, concurrency: int, rounds: int) -> tuple[float, int]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one_turn() -> int:
            n, text = 0, ""
            async with client.stream("POST", url, json=_body()) as resp:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    n += 1
                    chunk = line[6:]
                    if chunk != "[DONE]":
                        data = json.loads(chunk)
                        choices = data.get("choices") or []
                        if choices:
                            text += (choices[0].get("delta") or {}).get("content") or ""
            return n

        return await _load(one_turn, concurrency, rounds)


def _import_sglang_serving() -> Any:
    """sglang.benchmark.serving, with the two imports its request function never uses stubbed:
    Hugging Face `datasets` (not installed here) and sglang.srt's disaggregation utils (which pull
    in torchvision)."""
    import types

    for name, attrs in {
        "datasets": {"load_dataset": None},
        "sglang.srt.disaggregation.utils": {"FAKE_BOOTSTRAP_HOST": "2.2.2.2"},
    }.items():
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__dict__.update(attrs)
            sys.modules[name] = stub
    import sglang.benchmark.serving as serving

    serving.args = argparse.Namespace(
        disable_stream=False, disable_ignore_eos=False, print_requests=False, cache_report=False, header=None
    )
    return serving


async def run_sglang(url: str, concurrency: int, rounds: int) -> tuple[float, int]:
    serving = _import_sglang_serving()
    body = _body()
    req = serving.RequestFuncInput(
        prompt=body["messages"],
        api_url=url,
        prompt_len=10,
        output_len=1024,
        model="stream-bench",
        lora_name="",
        image_data=None,
        extra_request_body={},
    )

    async def one_turn() -> int:
        out = await serving.async_request_openai_chat_completions(req)
        if not out.success:
            raise RuntimeError(f"sglang client failed: {out.error[:500]}")
        return len(out.text_chunks) + 1  # tokens after the first; every answer's events are counted below

    return await _load(one_turn, concurrency, rounds)


async def run_ours(url: str, concurrency: int, rounds: int) -> tuple[float, int]:
    from dsv4bench.agents import get_family
    from dsv4bench.checks import run_checks
    from dsv4bench.wire.client import chat_turn
    from dsv4bench.harness.config import RunConfig
    from dsv4bench.harness.driver import make_client
    from dsv4bench.harness.session import AgentSession, SessionConfig
    from dsv4bench.wire.turn_answer import Deadlines
    from dsv4bench.harness.turn_judge import turn_context

    config = RunConfig(url=url.rsplit("/chat/completions", 1)[0], concurrency=concurrency)
    sess = AgentSession("s00000", get_family("coding"), 0, SessionConfig(model="stream-bench"))  # its tools judge
    deadlines = Deadlines()
    async with make_client(config) as client:

        async def one_turn() -> int:
            body = _body()
            out = await chat_turn(client, url, body, deadlines)
            r = out.response
            if r is None or r.protocol_errors or out.error:
                raise RuntimeError(f"our turn failed: {out.error} {r and r.protocol_errors}")
            verdicts, errors = run_checks(turn_context(sess, body, out))
            if verdicts or errors:
                raise RuntimeError(f"checkers found something on a clean answer: {verdicts} {errors}")
            return r.chunks + r.saw_done

        return await _load(one_turn, concurrency, rounds)


async def run_fallback(url: str, concurrency: int, rounds: int) -> tuple[float, int]:
    from dsv4bench.wire import transport

    # As if the seam check had found aiohttp changed: it is not run again, and no warning is given.
    transport._seam_verdict = {"(bench_client --variants fallback)": "forced"}
    return await run_ours(url, concurrency, rounds)


VARIANTS = {
    "aiohttp": run_aiohttp,
    "httpx": run_httpx,
    "sglang": run_sglang,
    "ours": run_ours,
    "before": run_ours,
    "fallback": run_fallback,
}


def child(args: argparse.Namespace) -> None:
    _pin(CLIENT_CORE)
    url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
    cpu, events = asyncio.run(VARIANTS[args.child](url, args.concurrency, args.rounds))
    if args.child == "sglang":
        events = args.concurrency * args.rounds * args.chunks  # its output keeps tokens, not events
    print(json.dumps({"cpu_s": cpu, "events": events}))


def export_before(rev: str, into: Path) -> Path:
    """The dsv4bench package of `rev`, laid out as the installed one (agents/ as dsv4bench.agents)."""
    data = subprocess.run(
        ["git", "archive", rev, "dsv4bench", "agents"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    (into / "agents").rename(into / "dsv4bench" / "agents")
    return into


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="aiohttp,httpx,sglang,ours,before")
    p.add_argument("--chunks", type=int, default=205)
    p.add_argument("--concurrency", type=int, default=80)
    p.add_argument("--rounds", type=int, default=6, help="turns per stream after the warm-up")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--before-rev", default="HEAD")
    p.add_argument("--port", type=int, default=0)
    p.add_argument(
        "--interval-ms",
        type=float,
        default=0.0,
        help="the server's pause between two events of a stream (0: as fast as it can; more: one "
        "event a read, as from a paced server, where each read's own cost shows)",
    )
    p.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    from dsv4bench.engine.launcher import free_port

    port = args.port or free_port()
    variants = args.variants.split(",")
    server = subprocess.Popen(
        [
            sys.executable,
            "tests/fixtures/stream_server.py",
            "--port",
            str(port),
            "--chunks",
            str(args.chunks),
            "--interval-ms",
            str(args.interval_ms),
        ],
        cwd=ROOT,
        preexec_fn=lambda: _pin(SERVER_CORE),
    )
    results: dict[str, list[float]] = {v: [] for v in variants}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            before = export_before(args.before_rev, Path(tmp)) if "before" in variants else None
            time.sleep(1.0)
            print(
                f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}; server on core {SERVER_CORE}, "
                f"clients on core {CLIENT_CORE}; {args.concurrency} streams x {args.chunks} events, "
                f"{args.rounds} counted turns per stream, {args.interval_ms:g} ms between events",
                flush=True,
            )
            for rep in range(args.repeats):
                for v in variants:
                    env = {**os.environ}
                    if v == "before":
                        env["PYTHONPATH"] = str(before)
                    cmd = [
                        sys.executable,
                        __file__,
                        "--child",
                        v,
                        "--port",
                        str(port),
                        "--chunks",
                        str(args.chunks),
                        "--concurrency",
                        str(args.concurrency),
                        "--rounds",
                        str(args.rounds),
                    ]
                    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
                    if out.returncode != 0:
                        raise SystemExit(f"{v} failed:\n{out.stdout}\n{out.stderr[-3000:]}")
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    results[v].append(r["cpu_s"] / r["events"] * 1e6)
                    print(f"  round {rep + 1} {v}: {results[v][-1]:.2f} us/event ({r['events']} events)", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    base = results.get("aiohttp")
    print(f"\n| client | CPU per chunk (median of {args.repeats}) | / aiohttp loop (median of pairs) |")
    print("|---|---|---|")
    for v in variants:
        med = statistics.median(results[v])
        ratio = f"{statistics.median(a / b for a, b in zip(results[v], base)):.2f}x" if base else "-"
        print(f"| {v} | {med:.2f} us | {ratio} |")


if __name__ == "__main__":
    main()
