"""What to run next: the commands a finding calls for, filled in with the run's own flags.

Each command is built from run.json's recorded command line (already redacted when it was
written: keys as `$DSV4BENCH_API_KEY`, URL passwords masked) and redacted once more as it is
printed (history/redact.py), so no secret reaches the report. Which commands follow from which
findings:

- corruption: `sweep` over rising concurrency, to find where it starts;
- corruption, without --raw: the same seed with `--raw`, to tell the server's parser from the model;
- answers that differ from a reference (`reference_mismatch`), or a server that reports HiCache
  on: the same seed against the server with HiCache off, then `--reference` to it;
- a wedge: `probe` and `watch` on the deployment's servers;
- a poisoned state without --recover-cmd: the run again with `--recover-cmd`, to time the way back.

A clean run calls for nothing. Pure: run.json and the summary in, (why, command) pairs out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dsv4bench.history.codes import CORRUPTION_CODES
from dsv4bench.history.redact import redact_argv, shell_line

# agents' flags that take no value (tests/report/test_next_steps.py holds this to the CLI).
AGENTS_SWITCHES = frozenset(
    {
        "--key-to-workers",
        "--thinking",
        "--no-thinking",
        "--stream",
        "--no-stream",
        "--raw",
        "--recheck-keep-cache",
        "--engine-pd",
        "--quiet",
        "-q",
    }
)
# agents' flags that `sweep` takes with the same meaning (the test holds each to sweep's options).
SWEEP_TAKES = frozenset(
    {
        "--url",
        "--model",
        "--api-key",
        "--sessions",
        "--duration",
        "--max-turns",
        "--scenario",
        "--seed",
        "--thinking",
        "--no-thinking",
        "--request-mix",
        "--stream",
        "--no-stream",
        "--max-tokens",
        "--context-length",
        "--temperature",
        "--ttft-timeout",
        "--total-timeout",
        "--on-corrupt",
        "--metrics",
        "--drain-timeout",
        "--engine-arg",
        "--engine-fault",
        "--engine-pd",
        "--engine-router",
    }
)
# What a rerun that only looks again needs none of: the load it gave, where it wrote, when it failed.
RERUN_DROPS = frozenset({"--kill", "--out", "--fail-on", "--serve-metrics", "--reference", "--recover-cmd"})
RECOVER_PLACEHOLDER = "<command that restarts the server>"
HICACHE_SETTING = "enable_hierarchical_cache"


@dataclass(frozen=True)
class NextStep:
    """One command to run next and why."""

    why: str
    command: str


def parse_flags(argv: list[str]) -> list[tuple[str, str | None]]:
    """`agents` arguments as (flag, value) pairs in order; a value-less switch has None, and a
    flag written with `=` keeps the value after it."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if eq or not arg.startswith("-"):
            out.append((flag, value) if eq else (arg, None))
            i += 1
        elif arg in AGENTS_SWITCHES or i + 1 >= len(argv):
            out.append((arg, None))
            i += 1
        else:
            out.append((arg, argv[i + 1]))
            i += 2
    return out


def _argv(flags: list[tuple[str, str | None]]) -> list[str]:
    return [part for flag, value in flags for part in ((flag,) if value is None else (flag, value))]


def agents_flags(run: dict[str, Any]) -> list[tuple[str, str | None]] | None:
    """The recorded `dsv4bench agents` command's flags; None when run.json holds none (a Locust
    run, a replay, a history from elsewhere)."""
    command = run.get("command")
    if not isinstance(command, str):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words[:2] != ["dsv4bench", "agents"] or any(w.split("=", 1)[0] == "--replay" for w in words):
        return None
    return parse_flags(words[2:])


def _line(command: str, flags: list[tuple[str, str | None]]) -> str:
    return shell_line(["dsv4bench", *command.split(), *redact_argv(_argv(flags))])


def _without(flags: list[tuple[str, str | None]], drop: frozenset[str]) -> list[tuple[str, str | None]]:
    return [(f, v) for f, v in flags if f not in drop]


def sweep_levels(concurrency: Any) -> str:
    """Levels from 1 up to the run's concurrency (at least 8), about four of them."""
    top = concurrency if isinstance(concurrency, int) and not isinstance(concurrency, bool) else 8
    top = max(top, 8)
    return ",".join(str(n) for n in sorted({1, max(1, top // 4), max(1, top // 2), top}))


def server_roots(run: dict[str, Any]) -> list[str]:
    """The deployment's server roots (discovery's endpoints), else the run's URL's root."""
    server = v if isinstance(v := run.get("server"), dict) else {}
    dep = v if isinstance(v := server.get("deployment"), dict) else {}
    roots = [e["root"] for e in dep.get("endpoints") or [] if isinstance(e, dict) and isinstance(e.get("root"), str)]
    if roots:
        return list(dict.fromkeys(roots))
    config = v if isinstance(v := run.get("config"), dict) else {}
    url = config.get("url")
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        parts = urlsplit(url)
        return [f"{parts.scheme}://{parts.netloc}"]
    return []


def hicache_on(run: dict[str, Any]) -> bool:
    """Whether a server of the run reports HiCache on (SGLang's /get_server_info)."""
    server = v if isinstance(v := run.get("server"), dict) else {}
    infos = [server.get("server_info")]
    dep = v if isinstance(v := server.get("deployment"), dict) else {}
    infos += [e.get("settings") for e in dep.get("endpoints") or [] if isinstance(e, dict)]
    return any(isinstance(i, dict) and i.get(HICACHE_SETTING) in (True, "true", "True") for i in infos)


def next_steps(run: dict[str, Any], summary: dict[str, Any]) -> list[NextStep]:
    """The commands this run's findings call for, most telling first; [] for a clean run."""
    counts = summary.get("counts") or {}
    corrupt = any(counts.get(c) for c in CORRUPTION_CODES)
    mismatch = bool(counts.get("reference_mismatch"))
    wedged = any(isinstance(f, dict) and f.get("codes") for f in (summary.get("wedge") or {}).values())
    persistence = v if isinstance(v := run.get("persistence"), dict) else {}
    poisoned = persistence.get("poisoned") is True
    config = v if isinstance(v := run.get("config"), dict) else {}
    flags = agents_flags(run)
    steps: list[NextStep] = []
    if flags is not None and poisoned and config.get("recover_cmd") is None:
        recover = [*_without(flags, frozenset({"--recover-cmd"})), ("--recover-cmd", RECOVER_PLACEHOLDER)]
        steps.append(
            NextStep(
                "The state stayed poisoned after the load: run again with your restart command to time how long "
                "fresh sessions take to be clean after it.",
                _line("agents", recover),
            )
        )
    if flags is not None and corrupt:
        sweep = [(f, v) for f, v in flags if f in SWEEP_TAKES and f != "--concurrency"]
        steps.append(
            NextStep(
                "Find the concurrency where corruption starts: the same tasks at rising concurrency.",
                _line("sweep", [("--concurrency", sweep_levels(config.get("concurrency"))), *sweep]),
            )
        )
    if flags is not None and corrupt and not config.get("raw"):
        steps.append(
            NextStep(
                "Tell the server's parser from the model: the same seed with --raw reads each raw completion with "
                "the family's reference parsers.",
                _line("agents", [*_without(flags, RERUN_DROPS), ("--raw", None)]),
            )
        )
    if flags is not None and (mismatch or (corrupt and hicache_on(run))):
        greedy = [*_without(flags, RERUN_DROPS | {"--temperature"}), ("--temperature", "0")]
        reference_dir = "runs/hicache-off"
        steps.append(
            NextStep(
                "Tell a HiCache race from the rest: first against the server restarted with HiCache off "
                "(SGLang's hierarchical cache flag left out), then with it on again, compared with that run.",
                _line("agents", [*greedy, ("--out", reference_dir)])
                + "\n"
                + _line("agents", [*greedy, ("--reference", reference_dir)]),
            )
        )
    roots = server_roots(run)
    if wedged and roots:
        metrics = [f"{r}/metrics" for r in roots]
        api_key = [(f, v) for f, v in flags or [] if f == "--api-key"]
        steps.append(
            NextStep(
                "The deployment wedged: check each server by its role now, then watch its queues.",
                _line("probe", [*api_key, *[(r, None) for r in roots]])
                + "\n"
                + _line("watch", [*api_key, *[(m, None) for m in metrics]]),
            )
        )
    return steps
