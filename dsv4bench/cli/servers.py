"""`dsv4bench probe` and `dsv4bench watch`: look at running servers (no load of their own) for
the incident's wedge, each server judged by its role."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import anyio
import typer

from dsv4bench.harness.config import ConfigError, check_http_url
from dsv4bench.cli.common import app, err, fail
from dsv4bench.history.redact import API_KEY_ENV

# probe and watch read the same key, from the same environment variable as the load commands.
SERVERS_API_KEY = typer.Option(None, envvar=API_KEY_ENV, help="Bearer token for the servers.")


@app.command()
def probe(
    urls: list[str] = typer.Argument(
        ...,
        help="Server roots, e.g. http://127.0.0.1:8000 (a router: its workers are found at its /workers) or http://127.0.0.1:8000 http://127.0.0.1:30000 http://127.0.0.1:30002 (router, prefill, decode).",
    ),
    timeout: float = typer.Option(10.0, help="Seconds each check (metrics, health, canary) may take."),
    stuck_s: float = typer.Option(
        2.0, "--stuck-s", help="Seconds a queue holding requests is watched, when nothing hangs, for a counter to move."
    ),
    api_key: Optional[str] = SERVERS_API_KEY,
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the findings as JSON here."),
    workers: bool = typer.Option(
        True, "--workers/--no-workers", help="Also probe every server a router lists at its /workers."
    ),
    key_to_workers: bool = typer.Option(
        False,
        "--key-to-workers",
        help="Send --api-key to the servers a router lists too, not only to the URLs given (a router's /workers may name any host).",
    ),
) -> None:
    """One-shot wedge check of each endpoint by its role (read from the server): gauges,
    /health and /health_generate everywhere, a canary on a router or unified server; a router's
    workers are found and probed too, each with the settings it reports.
    Exit 0 healthy, 1 wedged or unhealthy, 2 unreachable or not judged."""
    from dsv4bench.servers.probe import probe_main

    _check_urls("probe", urls, "server roots")
    if not math.isfinite(timeout) or timeout <= 0:
        raise fail("--timeout must be a positive number")
    if not math.isfinite(stuck_s) or stuck_s < 0:
        raise fail("--stuck-s must be a number of seconds, 0 or more")
    raise typer.Exit(
        probe_main(
            [u.rstrip("/") for u in urls],
            timeout,
            json_out,
            stuck_s,
            api_key,
            follow_workers=workers,
            key_to_workers=key_to_workers,
        )
    )


@app.command()
def watch(
    metrics_url: list[str] = typer.Argument(..., help="Prometheus /metrics URLs (router, prefill, decode)."),
    duration: float = typer.Option(60.0, help="Seconds to watch, then exit."),
    interval: float = typer.Option(1.0, help="Seconds between scrapes."),
    stuck_s: float = typer.Option(
        5.0, "--stuck-s", help="Seconds a queue must stay above 0 with no counter moving to be marked."
    ),
    api_key: Optional[str] = SERVERS_API_KEY,
) -> None:
    """Live view per endpoint and role: its gauges with current values and sparklines, its
    state in words; marks a wedge as it forms. Exit 1 wedge, 0 healthy, 2 unreachable."""
    from dsv4bench.servers.watch import watch_main

    _check_urls("watch", metrics_url, "/metrics URLs")
    if not all(math.isfinite(x) and x > 0 for x in (duration, interval, stuck_s)):
        raise fail("--duration, --interval and --stuck-s must be positive numbers")
    raise typer.Exit(anyio.run(watch_main, list(metrics_url), duration, interval, stuck_s, err, api_key))


def _check_urls(command: str, urls: list[str], what: str) -> None:
    """Every URL an http(s) URL that parses, or the one-line error naming `command`."""
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise fail(f"{command} takes http(s) {what}; got {', '.join(bad)}")
    try:
        for u in urls:
            check_http_url(command, u)
    except ConfigError as e:
        raise fail(str(e))
