"""The harness's own CPU cost: per agent turn and per SSE chunk.

Two views, each the median of --repeats runs:
  end-to-end  `dsv4bench agents` as a child process against the replay server on loopback
              (no planted faults); CPU (user+sys) of the harness process from wait4(),
              less the CPU of starting the CLI (`dsv4bench --version`), divided by the turns
              and the SSE chunks it recorded.
  in-process  the pure parts alone on recorded-shaped data: the delta assembler per chunk,
              the checkers per turn, the session core per turn.

    python scripts/bench_harness.py [--sessions 200 --concurrency 80 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from fixture_loader import load_fixture

from dsv4bench.engine.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]


def child_cpu(cmd: list[str]) -> tuple[float, float]:
    """Run cmd; return (CPU seconds user+sys of that child, wall seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"command failed: {' '.join(cmd)}")
    return ru.ru_utime + ru.ru_stime, time.monotonic() - t0


def end_to_end(args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "tests/fixtures/replay_server.py", "--port", str(port), "--fault-rate", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        startup = statistics.median(child_cpu([sys.executable, "-m", "dsv4bench", "--version"])[0] for _ in range(3))
        per_turn, per_chunk, rows = [], [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cpu, wall = child_cpu(
                    [
                        sys.executable,
                        "-m",
                        "dsv4bench",
                        "agents",
                        "--url",
                        url,
                        "--quiet",
                        "--concurrency",
                        str(args.concurrency),
                        "--sessions",
                        str(args.sessions),
                        "--out",
                        tmp,
                    ]
                )
                turns_file = next(Path(tmp).glob("*/turns.jsonl"))
                turns = [json.loads(x) for x in turns_file.read_text().splitlines()]
                chunks = sum((t.get("response") or {}).get("chunks", 0) for t in turns)
            work = cpu - startup
            per_turn.append(work / len(turns) * 1e3)
            per_chunk.append(work / chunks * 1e6)
            rows.append((cpu, wall, len(turns), chunks))
            print(f"  run: cpu {cpu:.2f} s, wall {wall:.2f} s, {len(turns)} turns, {chunks} chunks", flush=True)
        return {
            "startup_cpu_s": startup,
            "cpu_ms_per_turn": statistics.median(per_turn),
            "cpu_us_per_chunk": statistics.median(per_chunk),
            "turns": statistics.median(r[2] for r in rows),
            "chunks": statistics.median(r[3] for r in rows),
            "wall_s": statistics.median(r[1] for r in rows),
        }
    finally:
        server.terminate()
        server.wait(10)


def in_process(repeats: int) -> dict[str, float]:
    from dsv4bench.agents import family_for_session, run_expert_session
    from dsv4bench.checks import run_checks
    from dsv4bench.history.records import TurnContext
    from dsv4bench.wire.sse import DeltaAssembler

    plan_chunks = load_fixture("replay_server").plan_chunks

    # Realistic streams: every step of expert sessions across the families, as the replay server sends them.
    streams, contexts = [], []
    for i in range(30):
        fam = family_for_session("mixed", i)
        _, steps, _ = run_expert_session(fam, i)
        for step in steps:
            chunks = [json.dumps(c) for c in plan_chunks(f"r{i}", step, fam.tool_schemas(), "")] + ["[DONE]"]
            streams.append(chunks)
    n_chunks = sum(len(s) for s in streams)
    asm_us, chk_us = [], []
    for _ in range(repeats):
        t0 = time.process_time()
        responses = []
        for s in streams:
            a = DeltaAssembler()
            for c in s:
                a.feed(c)
            responses.append(a.finish())
        asm_us.append((time.process_time() - t0) / n_chunks * 1e6)
        contexts = [TurnContext(response=r, tools=family_for_session("mixed", 0).tool_schemas()) for r in responses]
        t0 = time.process_time()
        for ctx in contexts:
            run_checks(ctx)
        chk_us.append((time.process_time() - t0) / len(contexts) * 1e6)
    return {
        "streams": len(streams),
        "chunks": n_chunks,
        "assembler_us_per_chunk": statistics.median(asm_us),
        "checkers_us_per_turn": statistics.median(chk_us),
    }


def turn_overhead(repeats: int) -> dict[str, float]:
    """Harness CPU per turn outside the stream, at the last turn (turn 12) of expert coding
    sessions: what the driver does around chat_turn (AgentRun._turn), the stream itself
    replaced by the assembled answer the replay server would send. Median over sessions and
    repeats, per stage, in microseconds."""
    from dsv4bench.agents import get_family, run_expert_session
    from dsv4bench.checks import run_checks
    from dsv4bench.checks.parser_view import kept_oracles
    from dsv4bench.history.run_folder import HistoryWriter
    from dsv4bench.harness.progress import LiveStats
    from dsv4bench.history.records import TurnStatus
    from dsv4bench.harness.session import AgentSession, SessionConfig, request_summary
    from dsv4bench.wire.sse import DeltaAssembler
    from dsv4bench.wire.turn_answer import TurnOutcome, encode_body, finish
    from dsv4bench.harness.turn_judge import turn_context, turn_headers, turn_record

    plan_chunks = load_fixture("replay_server").plan_chunks

    fam = get_family("coding")
    stages: dict[str, list[float]] = {k: [] for k in ("request", "encode", "checks", "record", "observe", "total")}
    with tempfile.TemporaryDirectory() as tmp:
        history = HistoryWriter(Path(tmp) / "run", {"run": "bench"})
        stats = LiveStats()
        for _ in range(repeats):
            for seed in range(20):
                _, steps, _ = run_expert_session(fam, seed)
                sess = AgentSession(f"s{seed}", fam, seed, SessionConfig(model="replay-dsv4"))
                for n, step in enumerate(steps):
                    clock = [time.process_time_ns()]

                    def lap(stage: str) -> None:
                        clock.append(time.process_time_ns())
                        if n == len(steps) - 1:
                            stages[stage].append((clock[-1] - clock[-2]) / 1e3)

                    body = sess.next_request()
                    turn_headers("bench", sess)
                    lap("request")
                    encode_body(body)
                    lap("encode")
                    asm = DeltaAssembler()  # the stream, not counted: chat_turn's part
                    for c in plan_chunks(f"r{seed}", step, fam.tool_schemas(), ""):
                        asm.feed(json.dumps(c))
                    asm.feed("[DONE]")
                    outcome = TurnOutcome.starting()
                    outcome.response, outcome.http_status = asm.finish(), 200
                    finish(outcome)
                    clock.append(time.process_time_ns())
                    ctx = turn_context(sess, body, outcome)
                    verdicts, errors = run_checks(ctx)
                    lap("checks")
                    summary = request_summary(body, sess.keys)
                    rec = turn_record("bench", sess, body, summary, outcome, verdicts, errors, kept_oracles(ctx))
                    history.turn(rec)
                    stats.add_turn(rec)
                    lap("record")
                    sess.observe(TurnStatus.OK, outcome.response, verdicts)
                    lap("observe")
                    if n == len(steps) - 1:
                        stages["total"].append(
                            sum(stages[k][-1] for k in ("request", "encode", "checks", "record", "observe"))
                        )
                    assert not verdicts and not errors, (verdicts, errors)
        history.close()
    return {k: statistics.median(v) for k, v in stages.items()} | {"turns": len(steps), "samples": len(stages["total"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=80)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--turn-only", action="store_true", help="only the per-turn cost outside the stream")
    args = p.parse_args()
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    to = turn_overhead(args.repeats)
    print(
        f"per turn outside the stream, turn {to['turns']:.0f} of {to['turns']:.0f} (median of {to['samples']:.0f}): "
        + ", ".join(f"{k} {to[k]:.0f} us" for k in ("request", "encode", "checks", "record", "observe", "total")),
        flush=True,
    )
    if args.turn_only:
        return
    ip = in_process(args.repeats)
    print(
        f"in-process: assembler {ip['assembler_us_per_chunk']:.1f} us/chunk, checkers {ip['checkers_us_per_turn']:.0f} us/turn "
        f"({ip['streams']} turns, {ip['chunks']} chunks)"
    )
    e2e = end_to_end(args)
    print(
        f"end-to-end: {e2e['cpu_ms_per_turn']:.2f} ms CPU/turn, {e2e['cpu_us_per_chunk']:.1f} us CPU/chunk "
        f"(median of {args.repeats}; {e2e['turns']:.0f} turns, {e2e['chunks']:.0f} chunks, wall {e2e['wall_s']:.1f} s, "
        f"CLI start-up {e2e['startup_cpu_s']:.2f} s CPU subtracted)"
    )


if __name__ == "__main__":
    main()
