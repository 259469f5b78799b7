"""Peak memory of the harness against a hostile server: does an answer the size of a disk
take the harness's memory with it?

For each mode of tests/fixtures/hostile_server.py asked for (default: a normal answer, a 5 MB
SSE line, 10,000 tool calls, 1 MB of arguments), `dsv4bench agents` runs as a child process
against that server on loopback; its peak RSS comes from wait4() (that child only, not the
server). Prints one markdown table row per mode.

    python scripts/bench_hostile_memory.py [--modes normal,line_5mb,calls_10k] [--sessions 4] [--code DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from dsv4bench.engine.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_MODES = "normal,line_5mb,calls_10k,args_1mb"


def start_server(mode: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "fixtures" / "hostile_server.py"), "--port", str(port), "--modes", mode],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )
    root = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                return proc, root
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"hostile server did not start: {log.read_text()[-500:]}")


def measure(mode: str, sessions: int, max_turns: int, tmp: Path, source: Path = ROOT) -> dict:
    """One run of the CLI against one mode: peak RSS (MiB), wall seconds, verdict, turns."""
    server, root = start_server(mode, tmp / f"server-{mode}.log")
    out = tmp / mode
    cmd = [
        sys.executable,
        "-m",
        "dsv4bench",
        "agents",
        "--url",
        f"{root}/v1",
        "--sessions",
        str(sessions),
        "--concurrency",
        str(sessions),
        "--max-turns",
        str(max_turns),
        "--total-timeout",
        "30",
        "--canary-timeout",
        "5",
        "--quiet",
        "--out",
        str(out),
    ]
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=source,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(source)},
        )
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    finally:
        server.terminate()
        server.wait(10)
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or "Traceback" in err:
        return {
            "mode": mode,
            "peak_rss_mib": ru.ru_maxrss / 1024,
            "wall_s": wall,
            "verdict": f"exit {code}",
            "turns": "–",
            "flagged": "–",
        }
    [run_dir] = [d for d in out.iterdir() if d.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "mode": mode,
        "peak_rss_mib": ru.ru_maxrss / 1024,
        "wall_s": wall,
        "verdict": summary["verdict"],
        "turns": summary["turns"]["total"],
        "flagged": summary["counts"].get("stream_protocol", 0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated hostile modes (default {DEFAULT_MODES})")
    p.add_argument("--sessions", type=int, default=4, help="sessions per mode, all at once")
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument(
        "--code",
        type=Path,
        default=ROOT,
        help="run the harness of this source tree (e.g. an older commit from `git archive`); default this one",
    )
    a = p.parse_args()
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.node()}: {platform.platform()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; {a.sessions} sessions x {a.max_turns} turns per mode"
    )
    print("| mode | peak RSS | wall | verdict | turns | stream_protocol turns |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        for mode in a.modes.split(","):
            r = measure(mode, a.sessions, a.max_turns, Path(tmp), a.code.resolve())
            print(
                f"| {r['mode']} | {r['peak_rss_mib']:.0f} MiB | {r['wall_s']:.1f} s | {r['verdict']} | "
                f"{r['turns']} | {r['flagged']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
