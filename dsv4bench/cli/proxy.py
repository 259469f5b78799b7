"""`dsv4bench proxy`: a user's own agent audited live through an OpenAI-compatible pass-through
(dsv4bench/modes/proxy.py); Ctrl-C or --duration ends the history and writes the report."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import socket
import sys
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING, Optional

import httpx
import typer
from dsv4bench.terminal import markup_safe

from dsv4bench.harness.config import FAIL_ON_CHOICES, ConfigError, check_http_url, check_out_dir, parse_fail_on
from dsv4bench.history.events import RunEndReason
from dsv4bench.history.redact import MASK, redact_argv, shell_line
from dsv4bench.history.verdict import exit_code
from dsv4bench.cli.common import app, err, fail, print_verdict

if TYPE_CHECKING:
    from dsv4bench.modes.proxy import AuditProxy, ProxyLimits


@app.command()
def proxy(
    upstream: str = typer.Option(
        ..., help="The server to audit: its root or OpenAI base URL, e.g. http://127.0.0.1:30000/v1."
    ),
    port: int = typer.Option(8800, help="Port to listen on (0: any free port, printed at start)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on; 0.0.0.0 lets other machines in."),
    duration: Optional[float] = typer.Option(
        None, help="Seconds to serve before writing the report; default: until Ctrl-C."
    ),
    out_dir: Path = typer.Option(Path("runs"), "--out", help="Folder under which the run folder is created."),
    api_key: Optional[str] = typer.Option(
        None,
        envvar="DSV4BENCH_API_KEY",
        help="Bearer token added upstream to requests that carry none of their own (such a request goes without its Accept-Encoding, and the key is masked in the answer, so an upstream that echoes it never shows it to a client); written nowhere.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No line per finding; print the verdict line only."),
    fail_on: Optional[str] = typer.Option(
        None, help="Exit 1 on these verdicts: corruption,errors (and, with either, on INCOMPLETE)."
    ),
    capture: bool = typer.Option(
        False,
        "--capture",
        help="Keep every turn's full request body and headers (credentials masked), not only a failing turn's: the run folder becomes a capture that `dsv4bench agents --replay` sends again. A body over 2 MiB keeps its size and its first 4096 characters only.",
    ),
    max_body: str = typer.Option(
        "16MiB",
        help="Largest request body taken (bytes, or with KiB/MiB/GiB); a larger one is answered 413, sent nowhere, and noted in events.jsonl.",
    ),
    read_timeout: float = typer.Option(
        30.0,
        help="Seconds a client has to send a request's head (from connecting, or from the last answer's end) and again for its body; a late one is closed (408).",
    ),
    max_connections: int = typer.Option(
        256,
        help="Client connections served at once; a request on one more is answered 503. Idle connections close after 5 s.",
    ),
    trust_forwarded: bool = typer.Option(
        False,
        "--trust-forwarded",
        help="Name a client by the last address in its X-Forwarded-For (for a proxy in front of this one); by default the connection's own address.",
    ),
) -> None:
    """An OpenAI-compatible pass-through to point your own agent at: every answer reaches it byte for
    byte as the upstream sent it, and every chat completion is checked and recorded as `agents`
    records its own turns. Ctrl-C or --duration ends the run and writes the report."""
    try:
        check_http_url("--upstream", upstream)
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port must be a port number (0-65535), got {port}")
        if duration is not None and not (math.isfinite(duration) and duration > 0):
            raise ConfigError(f"--duration must be a positive number of seconds, got {duration}")
        body_cap = parse_size("--max-body", max_body)
        if not (math.isfinite(read_timeout) and read_timeout > 0):
            raise ConfigError(f"--read-timeout must be a positive number of seconds, got {read_timeout}")
        if max_connections < 1:
            raise ConfigError(f"--max-connections must be at least 1, got {max_connections}")
        fail_codes = parse_fail_on(fail_on)
        bad = [f for f in fail_codes if f not in FAIL_ON_CHOICES]
        if bad:
            raise ConfigError(f"--fail-on takes {', '.join(FAIL_ON_CHOICES)}; got {', '.join(bad)}")
        check_out_dir(out_dir)
    except ConfigError as e:
        raise fail(str(e))
    try:
        from dsv4bench.modes.proxy import MIN_MASKED_KEY, AuditProxy, ProxyLimits, upstream_base
        from dsv4bench.modes.proxy_audit import WorkerAudit
    except ImportError as e:
        raise fail(f"dsv4bench proxy needs starlette, uvicorn and httptools ({e}): pip install 'dsv4bench[proxy]'")
    from dsv4bench.servers.preflight import ServerError, server_facts
    from dsv4bench.report import build_report

    _, base = upstream_base(upstream)
    try:
        httpx.get(
            f"{base}/models",
            timeout=10,
            trust_env=False,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
        )
    except httpx.HTTPError as e:
        raise fail(f"--upstream {upstream}: cannot reach it ({type(e).__name__}: {e or 'no answer'})")
    try:
        facts = server_facts(base, api_key)
    except ServerError as e:  # reachable, but not telling: the proxy forwards all the same
        facts = {"base_url": base, "problem": str(e)}
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise fail(f"--port {port}: cannot listen on {host}:{port} ({e.strerror or e})")
    listening = sock.getsockname()[1]
    config = {
        "upstream": redact_argv([upstream])[0],
        "host": host,
        "port": listening,
        "duration": duration,
        "api_key": MASK if api_key else None,
        "fail_on": list(fail_codes),
        "capture": capture,
        "max_body": body_cap,
        "read_timeout": read_timeout,
        "max_connections": max_connections,
        "trust_forwarded": trust_forwarded,
    }
    limits = ProxyLimits(
        max_body=body_cap, read_timeout=read_timeout, max_connections=max_connections, trust_forwarded=trust_forwarded
    )
    # The audit (reading, judging, writing the history) runs in a process of its own, so the
    # forwarding loop pays only a list append per step and a pipe write per loop pass
    # (modes/proxy_audit.py).
    run = WorkerAudit(
        out_dir,
        {
            "command": shell_line(["dsv4bench", *redact_argv(sys.argv[1:])]),
            "config": config,
            "server": facts,
            "proxy": {"upstream": config["upstream"], "capture": capture},
        },
        api_key=api_key,
        capture=capture,
        quiet=quiet,
    )
    shown = f"[{host}]" if ":" in host else host
    err.print(
        markup_safe(
            f"proxy http://{shown}:{listening}/v1 -> {config['upstream']}: point your agent's base URL "
            f"at it; {'--duration ' + format(duration, 'g') + ' s or ' if duration else ''}Ctrl-C writes "
            f"the report ({run.run_dir})"
        ),
        highlight=False,
        soft_wrap=True,
    )
    if api_key and len(api_key) < MIN_MASKED_KEY:
        err.print(
            f"--api-key is shorter than {MIN_MASKED_KEY} characters: an answer that echoes it is passed on "
            "unmasked (so short a key could be any word of an answer)",
            highlight=False,
            soft_wrap=True,
        )
    reason = RunEndReason.INTERRUPTED
    try:
        with startup_heap_frozen():
            reason = asyncio.run(_serve(AuditProxy(upstream, run, api_key, limits), host, sock, duration, limits))
    except KeyboardInterrupt:
        reason = RunEndReason.INTERRUPTED  # the history so far is kept and reported
    except BaseException:
        reason = RunEndReason.ERROR
        raise
    finally:
        sock.close()
        run.end(reason)
    if not run.run_dir.is_dir():
        raise fail(f"the proxy's audit wrote no run folder ({run.dead or 'no reason given'})")
    summary = build_report(run.run_dir)
    print_verdict(summary, run.run_dir)
    if run.dead is not None:  # our own failure: the verdict above covers only what was audited
        raise fail(f"the proxy's audit stopped before the run ended ({run.dead}): its history is incomplete")
    raise typer.Exit(exit_code(summary, fail_codes))


@contextlib.contextmanager
def startup_heap_frozen() -> Iterator[None]:
    """Within: what the process made before (the imports, the app) is frozen, so no full collection
    walks it again; it lives as long as the proxy anyway. Unfrozen, each full collection walked it
    all, 27-53 ms with every stream of the process waiting (bench-plan.md, "`dsv4bench proxy`");
    what the requests make is short-lived and collected as before."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def _serve(
    proxy: AuditProxy, host: str, sock: socket.socket, duration: float | None, limits: ProxyLimits
) -> RunEndReason:
    """Serve until --duration has passed ("duration") or Ctrl-C; uvicorn re-raises the
    interrupt as KeyboardInterrupt once it has shut down."""
    import uvicorn

    from dsv4bench.modes.proxy import build_app, uvicorn_config

    server = uvicorn.Server(uvicorn_config(build_app(proxy), host, limits=limits))
    timed_out = False

    def time_up() -> None:
        nonlocal timed_out
        timed_out = True
        server.should_exit = True

    if duration is not None:
        asyncio.get_running_loop().call_later(duration, time_up)
    learning = asyncio.get_running_loop().create_task(proxy.learn_upstream_idle())
    try:
        await server.serve(sockets=[sock])
    finally:
        learning.cancel()
    return RunEndReason.DURATION if timed_out else RunEndReason.INTERRUPTED


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
}


def parse_size(flag: str, text: str) -> int:
    """A size in bytes from `16777216`, `16MiB`, `512 KiB` or `1GB`; ConfigError for anything else."""
    number = text.strip().rstrip("bBiIkKmMgG ")
    unit = text.strip()[len(number) :].strip().lower()
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if unit not in _UNITS or not math.isfinite(value) or value * _UNITS[unit] < 1:
        raise ConfigError(f"{flag} must be a size in bytes, e.g. 16777216 or 16MiB; got {text!r}")
    return int(value * _UNITS[unit])
