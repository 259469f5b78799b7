"""How many agent sessions one harness process drives before its own clock goes wrong.

For each session count: the real driver (`AgentRun`: sessions, chat_turn over make_client's
client, every checker, the history written) plays closed-pool agent sessions for
`--duration` seconds in this process, pinned to core 1, against tests/fixtures/stream_server.py
in its own process, pinned to core 0. The server paces each stream like a loaded server
(`--ttft-ms` before the first token, then one chunk every `--interval-ms`) and stamps the moment
it sends a turn's first token into that chunk (CLOCK_MONOTONIC, the harness's clock). Measured
after a `--warmup` of seconds:

  loop lag      how late a task sleeping 10 ms wakes up (p50 / p99 / max), and of the ticks
                more than 5 ms late, how many this process spent mostly off the CPU (another
                process had its core: on a shared machine that is not the harness's doing)
  TTFT error    the harness's first-token stamp less the server's send stamp, per turn (p50 / p99);
                the harness stamps a read with the kernel's receive time (transport.py), the
                bare loop below when it parsed the token, as SGLang's client does
  chunks/s      SSE chunks the harness took in per second of wall time, and per second of its
                CPU (= per harness core, when the process is CPU bound)
  GC            the harness's garbage collections: young ones (count, longest) and full ones
  ramp          from the load's start until every session had started, its world built
                (counted from the start, not after the warm-up: worlds are built one at a
                time, between turns)

A count holds when lag p99 < 5 ms and TTFT error p99 < 5 ms.

`--clients ours,aiohttp` measures, beside the harness, the floor of any asyncio client at the
same count: a bare aiohttp loop like SGLang's `bench_serving` (read a line, strip `data: `,
`json.loads`, stamp the first content token), with no sessions, checkers or history. Where the
floor itself breaks the bounds, no harness in one Python process can hold them.

    python scripts/bench_scale.py [--sessions 500,1000,2000] [--duration 30] [--clients ours,aiohttp]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVER_CORE, HARNESS_CORE = 0, 1
LAG_TICK_S = 0.010
BOUND_MS = 5.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def lag_monitor(t0: float, warmup: float, lags: list[float], ran: list[float], cpu: list[float]) -> None:
    """Ticks of LAG_TICK_S after the warm-up: how late each woke (ms), and the share of it this
    process was on a CPU; `cpu` gets the process time at the first counted tick."""
    while True:
        before, cpu_before = time.monotonic(), time.process_time()
        await anyio.sleep(LAG_TICK_S)
        now = time.monotonic()
        if before - t0 >= warmup:
            if not cpu:
                cpu.append(time.process_time())
            lags.append((now - before - LAG_TICK_S) * 1e3)
            ran.append((time.process_time() - cpu_before) / (now - before))


def figures(
    sessions: int,
    turns: int,
    statuses: dict[str, int],
    errors_seen: list[str],
    wall: float,
    lags: list[float],
    ran: list[float],
    errors: list[float],
    chunks: int,
    cpu_s: float,
) -> dict[str, Any]:
    return {
        "sessions": sessions,
        "turns": turns,
        "statuses": statuses,
        "errors": errors_seen,
        "wall_s": wall,
        "lag_p50_ms": pct(lags, 0.5),
        "lag_p99_ms": pct(lags, 0.99),
        "lag_max_ms": max(lags, default=float("nan")),
        # Ticks more than 5 ms late, and of them those where this process ran less than half
        # the tick: the core was taken by another process (a shared machine), not by the harness.
        "late_ticks": sum(1 for x in lags if x > BOUND_MS),
        "late_ticks_descheduled": sum(1 for x, r in zip(lags, ran) if x > BOUND_MS and r < 0.5),
        "ticks": len(lags),
        "ttft_err_p50_ms": pct(errors, 0.5),
        "ttft_err_p99_ms": pct(errors, 0.99),
        "chunks_per_s": chunks / wall,
        "chunks_per_cpu_s": chunks / max(1e-9, cpu_s),
        "cpu_share": cpu_s / wall,
        "turns_per_s": turns / wall,
    }


async def drive_aiohttp(url: str, sessions: int, duration: float, warmup: float) -> dict[str, Any]:
    """The floor: `sessions` bare aiohttp streams back to back, no harness around them."""
    import aiohttp

    lags: list[float] = []
    ran: list[float] = []
    cpu: list[float] = []
    t0 = time.monotonic()
    stop = t0 + duration
    counted_from_ns = int((t0 + warmup) * 1e9)
    firsts: list[tuple[int, str]] = []  # (first-token stamp, response id) of counted turns
    tally = {"turns": 0, "chunks": 0}
    body = {
        "model": "stream-bench",
        "messages": [{"role": "user", "content": "Read the server's entry point."}],
        "stream": True,
        "max_tokens": 1024,
    }

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=sessions + 8)) as session:

        async def one_stream() -> None:
            while time.monotonic() < stop:
                start, first, rid, n = time.monotonic_ns(), None, None, 0
                async with session.post(url + "/chat/completions", json=body) as resp:
                    async for line in resp.content:
                        line = line.strip()
                        if not line:
                            continue
                        n += 1
                        chunk = line.decode("utf-8").removeprefix("data: ")
                        if chunk != "[DONE]":
                            data = json.loads(chunk)
                            choices = data.get("choices") or []
                            if first is None and choices and (choices[0].get("delta") or {}).get("content"):
                                first, rid = time.monotonic_ns(), data.get("id")
                if start >= counted_from_ns:
                    tally["turns"] += 1
                    tally["chunks"] += n
                    if first is not None:
                        firsts.append((first, rid))

        async with anyio.create_task_group() as tg:
            tg.start_soon(lag_monitor, t0, warmup, lags, ran, cpu)
            async with anyio.create_task_group() as load:
                for _ in range(sessions):
                    load.start_soon(one_stream)
            load_end, cpu_end = time.monotonic(), time.process_time()
            tg.cancel_scope.cancel()
        stamps = await (await session.get(url.removesuffix("/v1") + "/stamps")).json()
    errors = [(ns - stamps[rid]) / 1e6 for ns, rid in firsts if rid in stamps]
    return figures(
        sessions,
        tally["turns"],
        {"ok": tally["turns"]},
        [],
        load_end - (t0 + warmup),
        lags,
        ran,
        errors,
        tally["chunks"],
        cpu_end - cpu[0] if cpu else 0.0,
    )


async def drive(url: str, sessions: int, duration: float, warmup: float, out: Path) -> dict[str, Any]:
    from dsv4bench.harness.config import RunConfig
    from dsv4bench.harness.driver import AgentRun
    from dsv4bench.history.run_folder import HistoryWriter, read_history
    from dsv4bench.harness.progress import LiveStats

    config = RunConfig(url=url, concurrency=sessions, duration=duration, quiet=True, out=out)
    run_dir = out / "run"
    history = HistoryWriter(run_dir, {"run": "scale"}, None)
    driver = AgentRun(config, "stream-bench", history, LiveStats(), "scale")
    lags: list[float] = []
    ran: list[float] = []  # per tick: the share of the tick's wall time this process was on a CPU
    cpu: list[float] = []
    t0 = time.monotonic()
    # (generation, ms) of each garbage collection after the warm-up: the loop waits for each
    collections: list[tuple[int, float]] = []
    began: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began and time.monotonic() - t0 >= warmup:
            collections.append((info["generation"], (time.perf_counter() - began[0]) * 1e3))

    gc.callbacks.append(on_gc)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lag_monitor, t0, warmup, lags, ran, cpu)
            await driver.run()
            load_end = time.monotonic()
            cpu_end = time.process_time()
            tg.cancel_scope.cancel()
    finally:
        gc.callbacks.remove(on_gc)
    history.close()
    counted_from_ns = int((t0 + warmup) * 1e9)
    played = read_history(run_dir)
    turns = [t for t in played.turns if t.timings.start_ns >= counted_from_ns]
    # The ramp: from the load's start until `sessions` sessions had started (their worlds built,
    # one at a time, in steps between other sessions' turns; `session_start` is written then).
    opened = sorted(e["t_ns"] for e in played.events if e["kind"] == "session_start")
    ramp_s = (opened[sessions - 1] / 1e9 - t0) if len(opened) >= sessions else None
    async with httpx.AsyncClient() as client:
        stamps = (await client.get(url.removesuffix("/v1") + "/stamps")).json()
    errors = [
        (t.timings.first_token_ns - stamps[t.response_id]) / 1e6
        for t in turns
        if t.timings.first_token_ns and t.response_id in stamps
    ]
    chunks = sum(t.response.chunks for t in turns if t.response is not None)
    statuses = {s: sum(1 for t in turns if t.status.value == s) for s in {t.status.value for t in turns}}
    errors_seen = sorted({(t.error or "")[:120] for t in turns if t.error})[:3]
    clock = driver.clock.as_event()
    r = figures(
        sessions,
        len(turns),
        statuses,
        errors_seen,
        load_end - (t0 + warmup),
        lags,
        ran,
        errors,
        chunks,
        cpu_end - cpu[0] if cpu else 0.0,
    )
    r["harness_stalls"], r["harness_longest_stall_s"] = clock["stalls"], clock["longest_stall_s"]
    r["ramp_s"], r["sessions_started"] = ramp_s, len(opened)
    full = [ms for gen, ms in collections if gen == 2]
    r["gc_full"], r["gc_full_max_ms"] = len(full), max(full, default=0.0)
    r["gc_young"] = sum(1 for gen, _ in collections if gen < 2)
    r["gc_young_max_ms"] = max((ms for gen, ms in collections if gen < 2), default=0.0)
    return r


def child(args: argparse.Namespace) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {HARNESS_CORE})
    url = f"http://127.0.0.1:{args.port}/v1"
    if args.client == "aiohttp":
        r = anyio.run(drive_aiohttp, url, args.child, args.duration, args.warmup)
    else:
        from dsv4bench.loop import fair_loop

        # "ours" on the loop `agents` runs on; "ours-default-loop" on asyncio's, for the side by side
        run = fair_loop.run if args.client == "ours" else anyio.run
        with tempfile.TemporaryDirectory() as tmp:
            r = run(drive, url, args.child, args.duration, args.warmup, Path(tmp))
    print(json.dumps(r))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", default="500,1000,2000")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per session count")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds of load before anything is counted")
    p.add_argument("--interval-ms", type=float, default=50.0, help="between two chunks of a stream")
    p.add_argument("--ttft-ms", type=float, default=500.0, help="before a stream's first chunk")
    p.add_argument("--chunks", type=int, default=100, help="SSE events of a tool-call answer")
    p.add_argument("--agent-turns", type=int, default=12, help="the server answers text only at this turn")
    p.add_argument("--port", type=int, default=0)
    p.add_argument(
        "--clients",
        default="ours",
        help="ours (the harness), ours-default-loop (the harness on asyncio's "
        "default loop: fair_loop.py), aiohttp (the floor: a bare loop), comma-separated",
    )
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--client", default="ours", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    print(
        f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}; server on core {SERVER_CORE}, "
        f"harness on core {HARNESS_CORE}; server: TTFT {args.ttft_ms:g} ms, a chunk every {args.interval_ms:g} ms, "
        f"{args.chunks} chunks per tool-call answer, text at turn {args.agent_turns}; {args.duration:g} s per count, "
        f"the first {args.warmup:g} s not counted",
        flush=True,
    )
    clients = args.clients.split(",")
    if not set(clients) <= {"ours", "ours-default-loop", "aiohttp"}:
        p.error("--clients: a list of ours, ours-default-loop and aiohttp")
    rows = []
    for n in [int(x) for x in args.sessions.split(",")]:
        for client in clients:
            r = measure(args, n, client)
            r["client"], r["holds"] = client, r["lag_p99_ms"] < BOUND_MS and r["ttft_err_p99_ms"] < BOUND_MS
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(
        "\n| client | sessions | turns/s | chunks/s | chunks per CPU-s | CPU share | loop lag p50 / p99 / max "
        "| late ticks (descheduled) | TTFT error p50 / p99 | harness stalls (longest) | GC young / full (longest) "
        "| all sessions started after | holds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        stalls = (
            f"{r['harness_stalls']} ({r['harness_longest_stall_s'] * 1e3:.0f} ms)" if "harness_stalls" in r else "-"
        )
        ramp = (
            "-"
            if "ramp_s" not in r
            else f"not all: {r['sessions_started']:,} in the run"
            if r["ramp_s"] is None
            else f"{r['ramp_s']:.1f} s"
        )
        collections = (
            f"{r['gc_young']} ({r['gc_young_max_ms']:.0f} ms) / {r['gc_full']} ({r['gc_full_max_ms']:.0f} ms)"
            if "gc_young" in r
            else "-"
        )
        print(
            f"| {r['client']} | {r['sessions']:,} | {r['turns_per_s']:.0f} | {r['chunks_per_s']:,.0f} | "
            f"{r['chunks_per_cpu_s']:,.0f} | {r['cpu_share']:.0%} | "
            f"{r['lag_p50_ms']:.1f} / {r['lag_p99_ms']:.1f} / {r['lag_max_ms']:.0f} ms | "
            f"{r['late_ticks']} of {r['ticks']} ({r['late_ticks_descheduled']}) | "
            f"{r['ttft_err_p50_ms']:.2f} / {r['ttft_err_p99_ms']:.2f} ms | {stalls} | {collections} | "
            f"{ramp} | {'yes' if r['holds'] else 'no'} |"
        )
    for client in clients:
        held = [r["sessions"] for r in rows if r["holds"] and r["client"] == client]
        print(f"{client}: largest count that holds: {max(held) if held else 'none'}")


def measure(args: argparse.Namespace, n: int, client: str) -> dict[str, Any]:
    """One count and client: a fresh server on its core, the client in a child on the other."""
    from dsv4bench.engine.launcher import free_port

    port = free_port()
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
            "--ttft-ms",
            str(args.ttft_ms),
            "--agent-turns",
            str(args.agent_turns),
        ],
        cwd=ROOT,
        preexec_fn=lambda: os.sched_setaffinity(0, {SERVER_CORE}) if hasattr(os, "sched_setaffinity") else None,
    )
    try:
        time.sleep(1.0)
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                str(n),
                "--client",
                client,
                "--port",
                str(port),
                "--duration",
                str(args.duration),
                "--warmup",
                str(args.warmup),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise SystemExit(f"{client}, {n} sessions failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
