"""What `dsv4bench proxy` adds beside what a bare streaming relay adds: latency per chunk and to
the first chunk, and CPU per relayed turn, at 80 and 500 concurrent streams, in one run.

Three paths to one upstream, rounds alternating so each sees the same machine (within a round
the paths go in a seeded random order, so none always follows the one whose clean-up it would
meet; before each, the machine is let settle until the processes under test are idle, at most
SETTLE_S; the client does no garbage collection within a round):
- direct: the client talks to the upstream;
- relay: a bare aiohttp streaming relay (aiohttp server, aiohttp client, each chunk written as it
  is read) that audits nothing, in its own process: the floor any pass-through pays;
- proxy: `dsv4bench proxy` as a user runs it, in its own process, auditing every stream.

The upstream, in its own process, streams `--chunks` content deltas `--interval-ms` apart and
stamps each with the wall clock at which it wrote it. Per chunk: the time from that stamp to the
client's read; per request: the time to the first chunk, pooled over the rounds and, since a
round's machine moves every path's figure at once, also the proxy's less the relay's round by
round (their median and spread). It also counts the connections each
path opened to it per round: a pass-through that lets its upstream connections go between
rounds pays for new ones at the start of each. What a path adds is its figure less
direct's in the same run; the ratio proxy-added / relay-added is what issue 39 bounds (1.5x per
chunk at p50 and p90; +10 ms to the first chunk). CPU: user+system seconds of the relay's and
the proxy's processes (the proxy's forwarding process and its audit worker, together and apart)
over their rounds, per 1,000 turns. Figures go to bench-plan.md.

    python scripts/bench_proxy.py [--streams 80,500] [--chunks 64] [--interval-ms 20] [--rounds 3]
                                  [--order shuffled|fixed] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("direct", "relay", "proxy")
SETTLE_S = 3.0  # the longest wait for the machine to go quiet before a round
QUIET_CPU_S = 0.01  # CPU seconds the processes under test may use in 50 ms and count as quiet


def serve_upstream(port: int, chunks: int, interval_s: float) -> None:
    """The upstream: every chat completion streams `chunks` content deltas, `interval_s` apart."""
    from aiohttp import web

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

    known: dict[int, object] = {}  # every connection seen, kept so no id is reused
    fresh = 0  # connections first seen since the last count

    async def connections(_: web.Request) -> web.Response:
        nonlocal fresh
        count, fresh = fresh, 0
        return web.json_response({"opened": count})

    async def chat(request: web.Request) -> web.StreamResponse:
        nonlocal fresh
        if id(request.transport) not in known:
            known[id(request.transport)] = request.transport
            fresh += 1
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(event({"role": "assistant", "content": ""}))
        for i in range(chunks):
            await asyncio.sleep(interval_s)
            await resp.write(event({"content": f"word{i} "}))
        await resp.write(event({}, "stop"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/bench/connections", connections)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=2048)


def serve_relay(port: int, upstream: str) -> None:
    """The bare relay: every request forwarded with aiohttp, every chunk written as it comes."""
    import aiohttp
    from aiohttp import web

    session: aiohttp.ClientSession | None = None
    hop = {"host", "content-length", "transfer-encoding", "connection"}

    async def relay(request: web.Request) -> web.StreamResponse:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in hop]
        async with session.request(request.method, upstream + request.path_qs, headers=headers, data=body) as up:
            resp = web.StreamResponse(
                status=up.status, headers=[(k, v) for k, v in up.headers.items() if k.lower() not in hop]
            )
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def close_session(_: web.Application) -> None:
        if session is not None:  # else aiohttp prints every pooled connection at exit
            await session.close()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", relay)
    app.on_cleanup.append(close_session)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=2048)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (the proxy's audit worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def settle(pids: list[int]) -> None:
    """Wait until `pids` use under QUIET_CPU_S of CPU in 50 ms (at most SETTLE_S): the round
    before has been cleaned up after (connections closed, the proxy's audit caught up)."""
    deadline = time.monotonic() + SETTLE_S
    last = sum(map(cpu_seconds, pids))
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = sum(map(cpu_seconds, pids))
        if now - last < QUIET_CPU_S:
            return
        last = now


def opened_since(up_root: str) -> int:
    """Connections the upstream saw opened since it was last asked."""
    import urllib.request

    with urllib.request.urlopen(f"{up_root}/bench/connections", timeout=10) as r:
        return json.loads(r.read())["opened"]


def learned_hold(out: Path, timeout: float) -> str:
    """What the proxy learned of the upstream's idle connections (its `upstream_keepalive`
    event), waited for up to `timeout`: until then it keeps its default hold."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for events in out.glob("*/events.jsonl"):
            for line in events.read_text().splitlines():
                if '"upstream_keepalive"' in line:
                    e = json.loads(line)
                    return f"{e['keepalive_s']:g} s ({e['how']})"
        time.sleep(0.2)
    return "not learned yet"


def wait_ready(url: str, proc: subprocess.Popen, what: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start")


async def one_stream(session, base_url: str, chunk_ms: list[float]) -> float:
    """One streamed request: ms to its first chunk; each chunk's delay appended to chunk_ms."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "go"}], "stream": True}
    start = time.perf_counter()
    first = None
    buf = b""
    async with session.post(f"{base_url}/chat/completions", json=body) as resp:
        async for piece in resp.content.iter_any():
            now_ns = time.time_ns()
            if first is None:
                first = time.perf_counter()
            buf += piece
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                if ev.startswith(b"data: {"):
                    chunk_ms.append((now_ns - json.loads(ev[6:])["sent_ns"]) / 1e6)
    return ((first or time.perf_counter()) - start) * 1e3


async def one_round(base_url: str, streams: int) -> tuple[list[float], list[float]]:
    import aiohttp

    chunk_ms: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        firsts = await asyncio.gather(*(one_stream(session, base_url, chunk_ms) for _ in range(streams)))
    return chunk_ms, list(firsts)


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else (xs[0] if xs else float("nan"))


def spawn(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], env=env, **kw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="80,500", help="concurrent streams per round, comma-separated levels")
    p.add_argument("--chunks", type=int, default=64, help="content chunks per stream")
    p.add_argument("--interval-ms", type=float, default=20.0, help="gap between the upstream's chunks")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each path per level, alternating")
    p.add_argument(
        "--order",
        choices=("shuffled", "fixed"),
        default="shuffled",
        help="the paths' order within a round: seeded random (default), or direct, relay, proxy every time",
    )
    p.add_argument("--seed", type=int, default=1, help="the seed of the shuffled order")
    p.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--serve-relay", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_upstream is not None:
        return serve_upstream(a.serve_upstream, a.chunks, a.interval_ms / 1e3)
    if a.serve_relay is not None:
        return serve_relay(int(a.serve_relay[0]), a.serve_relay[1])
    try:
        levels = [int(s) for s in a.streams.split(",") if s.strip()]
    except ValueError:
        p.error(f"--streams takes comma-separated counts, not {a.streams!r}")
    if not levels or min(levels) < 1 or a.rounds < 1 or a.chunks < 1:
        p.error("--streams, --rounds and --chunks take positive counts")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    up_port, relay_port, proxy_port = free_port(), free_port(), free_port()
    up_root = f"http://127.0.0.1:{up_port}"
    upstream = spawn(
        [__file__, "--serve-upstream", str(up_port), "--chunks", str(a.chunks), "--interval-ms", str(a.interval_ms)],
        env,
    )
    relay = spawn([__file__, "--serve-relay", str(relay_port), up_root], env)
    out = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    urls = {
        "direct": f"{up_root}/v1",
        "relay": f"http://127.0.0.1:{relay_port}/v1",
        "proxy": f"http://127.0.0.1:{proxy_port}/v1",
    }
    proxy = None
    stdout = ""
    results: dict[int, dict[str, tuple[list[float], list[float], float]]] = {}
    cpu_per_level: dict[int, dict[str, float]] = {}
    opened_per_level: dict[int, dict[str, list[int]]] = {}
    paired: dict[int, list[float]] = {}  # per round: the proxy's median first chunk less the relay's
    hold = "not asked"
    try:
        wait_ready(urls["direct"], upstream, "the upstream")
        wait_ready(urls["relay"], relay, "the relay")
        proxy = spawn(
            ["-m", "dsv4bench", "proxy", "--upstream", urls["direct"], "--port", str(proxy_port), "--out", str(out)]
            + ["--quiet", "--max-connections", str(max(levels) + 64)],
            env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_ready(urls["proxy"], proxy, "the proxy")
        # The proxy's CPU is its own and its audit worker's, each also printed apart.
        pids = {"relay": [relay.pid], "proxy": [proxy.pid], "proxy: forwarding": [proxy.pid]}
        pids["proxy: audit worker"] = children(proxy.pid)
        pids["proxy"] = [proxy.pid, *pids["proxy: audit worker"]]
        for url in urls.values():  # warm every path's connections and code
            asyncio.run(one_round(url, 8))
        print("  waiting for the proxy to learn its upstream's keep-alive", file=sys.stderr, flush=True)
        hold = learned_hold(out, timeout=30.0)
        quiet = sorted({upstream.pid, relay.pid, *pids["proxy"]})
        rng = random.Random(a.seed)
        for level in levels:
            got = {name: ([], [], 0.0) for name in PATHS}
            cpu = dict.fromkeys(pids, 0.0)
            opened = {name: [] for name in PATHS}
            round_firsts = {name: [] for name in PATHS}  # each round's median first chunk
            for r in range(a.rounds):
                order = list(PATHS)
                if a.order == "shuffled":
                    rng.shuffle(order)
                for name in order:
                    mine = [k for k in pids if k.startswith(name)]
                    settle(quiet)
                    opened_since(up_root)
                    before = {k: sum(map(cpu_seconds, pids[k])) for k in mine}
                    gc.collect()
                    gc.disable()  # the client's own pauses are no path's
                    try:
                        chunks, firsts = asyncio.run(one_round(urls[name], level))
                    finally:
                        gc.enable()
                    for k in mine:
                        cpu[k] += sum(map(cpu_seconds, pids[k])) - before[k]
                    opened[name].append(opened_since(up_root))
                    round_firsts[name].append(statistics.median(firsts))
                    kept = got[name]
                    got[name] = (kept[0] + chunks, kept[1] + firsts, 0.0)
                print(f"  {level} streams: round {r + 1} of {a.rounds} done", file=sys.stderr, flush=True)
            results[level] = got
            cpu_per_level[level] = cpu
            opened_per_level[level] = opened
            paired[level] = [p - r for p, r in zip(round_firsts["proxy"], round_firsts["relay"])]
    finally:
        if proxy is not None:
            proxy.send_signal(2)
            stdout, _ = proxy.communicate(timeout=120)
        for proc in (relay, upstream):
            proc.terminate()
            proc.wait(10)
    print(
        f"{a.rounds} rounds per path per level ({a.order} order), {a.chunks} chunks {a.interval_ms:g} ms apart, "
        f"{os.cpu_count()} CPUs (client, upstream, relay and proxy share them); "
        f"the proxy's upstream hold: {hold}"
    )
    for level, got in results.items():
        turns = level * a.rounds
        print(f"\n{level} concurrent streams ({turns} turns per path)")
        print(f"{'ms':<26}{'direct':>9}{'relay':>9}{'proxy':>9}{'relay+':>9}{'proxy+':>9}{'ratio':>8}")
        rows = [
            ("per chunk, p50", lambda g: statistics.median(g[0])),
            ("per chunk, p90", lambda g: pct(g[0], 90)),
            ("to the first chunk, p50", lambda g: statistics.median(g[1])),
        ]
        for what, stat in rows:
            v = {name: stat(got[name]) for name in PATHS}
            ra, pa = v["relay"] - v["direct"], v["proxy"] - v["direct"]
            ratio = pa / ra if ra > 0 else float("inf")
            print(f"{what:<26}{v['direct']:>9.2f}{v['relay']:>9.2f}{v['proxy']:>9.2f}{ra:>9.2f}{pa:>9.2f}{ratio:>8.2f}")
        d = sorted(paired[level])
        print(
            f"to the first chunk, proxy less relay, round by round: median {statistics.median(d):+.2f} ms "
            f"(quartiles {pct(d, 25):+.2f} / {pct(d, 75):+.2f}, range {d[0]:+.2f} / {d[-1]:+.2f})"
        )
        for name, used in cpu_per_level[level].items():
            print(f"CPU s per 1,000 turns, {name}: {used / turns * 1000:.2f}")
        for name, counts in opened_per_level[level].items():
            print(f"upstream connections opened per round, {name}: {' '.join(map(str, counts))}")
    print(f"\nproxy's audit: {stdout.strip().splitlines()[-1] if stdout.strip() else '(no verdict line)'}")


if __name__ == "__main__":
    main()
