"""Locust mode's cost beside `agents`: turns and sessions per second, and per second of harness
CPU (what one core sustains), against the replay server (no planted faults) on loopback in its
own process; and how far a master with two workers goes on the same machine.

Each mode runs as child processes for the same wall time and the same users, in turn (agents,
locust, locust with 2 workers; --repeats times), so drift of the machine hits all alike. CPU is
the operating system's user + system seconds of every process of the mode (wait4 of each child,
which counts what it waited for: Locust under `dsv4bench locust`), start-up included; turns and
sessions are read back from each run folder's summary.json. Medians are printed, with the
ratio locust / agents of turns per CPU second.

    python scripts/bench_locust.py [--users 40 --seconds 30 --repeats 3]
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

from dsv4bench.engine.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "dsv4bench"]


def run_mode(cmds: list[list[str]], stagger_s: float = 0.0) -> tuple[float, float]:
    """Start every command (the first is waited on last), wait for all; (CPU seconds of all, wall s)."""
    t0 = time.monotonic()
    procs = []
    for cmd in cmds:
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(stagger_s)
    cpu = 0.0
    for proc in procs:
        _, status, ru = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) not in (0, 1):
            raise SystemExit(f"failed ({os.waitstatus_to_exitcode(status)}): {' '.join(procs[0].args)}")
        cpu += ru.ru_utime + ru.ru_stime
    return cpu, time.monotonic() - t0


def read_run(out: Path) -> dict[str, float]:
    [run_dir] = [d for d in out.iterdir() if d.is_dir()]
    s = json.loads((run_dir / "summary.json").read_text())
    return {"turns": s["turns"]["total"], "sessions": s["sessions"]["count"], "duration_s": s["duration_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=40, help="sessions in flight (agents --concurrency, Locust -u)")
    p.add_argument("--seconds", type=int, default=30, help="wall time of each run's load")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "tests/fixtures/replay_server.py", "--port", str(port), "--fault-rate", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        u, s = str(args.users), str(args.seconds)
        figures: dict[str, list[dict[str, float]]] = {"agents": [], "locust": [], "locust, 2 workers": []}
        for _ in range(args.repeats):
            for mode in figures:
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "runs"
                    if mode == "agents":
                        cmds = [
                            [
                                *CLI,
                                "agents",
                                "--url",
                                url,
                                "--concurrency",
                                u,
                                "--duration",
                                s,
                                "--quiet",
                                "--out",
                                str(out),
                            ]
                        ]
                    elif mode == "locust":
                        cmds = [
                            [
                                *CLI,
                                "locust",
                                "--host",
                                url,
                                "--headless",
                                "-u",
                                u,
                                "-r",
                                u,
                                "-t",
                                f"{s}s",
                                "--out",
                                str(out),
                                "-q",
                            ]
                        ]
                    else:
                        master_port = str(free_port())
                        cmds = [
                            [
                                *CLI,
                                "locust",
                                "--host",
                                url,
                                "--headless",
                                "-u",
                                u,
                                "-r",
                                u,
                                "-t",
                                f"{s}s",
                                "--out",
                                str(out),
                                "-q",
                                "--master",
                                "--expect-workers",
                                "2",
                                "--master-bind-port",
                                master_port,
                            ]
                        ]
                        cmds += [
                            [*CLI, "locust", "--worker", "--master-host", "127.0.0.1", "--master-port", master_port]
                            for _ in range(2)
                        ]
                    cpu, wall = run_mode(cmds)
                    r = read_run(out)
                    r.update(
                        cpu_s=cpu,
                        wall_s=wall,
                        turns_per_s=r["turns"] / r["duration_s"],
                        turns_per_cpu_s=r["turns"] / cpu,
                        sessions_per_cpu_s=r["sessions"] / cpu,
                    )
                    figures[mode].append(r)
                    print(
                        f"{mode}: {r['turns']} turns, {r['sessions']} sessions, {cpu:.1f} CPU s, "
                        f"{r['turns_per_s']:.1f} turns/s, {r['turns_per_cpu_s']:.1f} turns per CPU s",
                        flush=True,
                    )
        print(f"\nmedians of {args.repeats} ({args.users} users, {args.seconds} s, replay server on loopback):")
        print("| mode | turns/s | sessions/s | turns per harness CPU s | sessions per harness CPU s |")
        print("|---|---|---|---|---|")
        med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in figures.items()}
        for mode, m in med.items():
            print(
                f"| {mode} | {m['turns_per_s']:.1f} | {m['sessions'] / m['duration_s']:.2f} | "
                f"{m['turns_per_cpu_s']:.1f} | {m['sessions_per_cpu_s']:.2f} |"
            )
        ratios = [lo["turns_per_cpu_s"] / ag["turns_per_cpu_s"] for lo, ag in zip(figures["locust"], figures["agents"])]
        print(
            f"\nturns per CPU s, locust / agents, pair by pair: median {statistics.median(ratios):.2f} "
            f"({', '.join(f'{x:.2f}' for x in ratios)})"
        )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
