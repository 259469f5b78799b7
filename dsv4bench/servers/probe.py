"""`dsv4bench probe`: the one-shot wedge check from the incident, for each server root URL.

The manual probe during the incident was: read each server's queue gauges, hit `/health`,
send one request and see whether it hangs (here two: one streamed, for a server that starts a
stream and never ends it). This does that, concurrently per endpoint, each
endpoint judged by its role (roles.py, read from the server itself): a router or a unified
server gets a canary; a prefill or a decode server takes no chat, so it is judged by its
gauges, `/health` and `/health_generate`. The endpoints are the roots given and every server
their routers list (discovery.py): `probe ROUTER` probes the router and each of its workers,
and says what each reports of its settings. Each server is judged by what its kind offers
(servers/kinds.py): an endpoint its kind never had (vLLM's /health_generate) is not asked, and
where the kind may lack one, a 404, 405 or 501 says "not offered", never unhealthy.

The gauges are read twice, before and after the checks, and where a queue holds requests and
nothing hung, a third time `stuck_s` later: a queue that never shrinks while a request hangs,
or while no counter moves, is stuck. The canary, /health and /health_generate rules are
wedge.detect_wedge's, so probe and run verdicts never disagree.

States and exit codes (for scripts and CI; the highest wins):
- 0 `healthy`;
- 1 `wedged` (a wedge code) or `unhealthy` (the server says it is not well: /health not 200,
  /health_generate failing, a canary answered with HTTP 5xx);
- 2 `unreachable` (nothing answered) or `error` (a check got an answer it cannot judge by: a
  canary answered 4xx or something that is no completion, a prefill or decode server whose
  gauges cannot be read). We know least there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dsv4bench.servers.canary import (
    ERROR,
    FAILING,
    NOT_OFFERED,
    OK,
    TIMEOUT,
    UNREACHABLE,
    CanaryResult,
    HealthResult,
    check_canary,
    check_health,
)
from dsv4bench.wire.charset import response_text
from dsv4bench.servers.discovery import DEFAULT_TIMEOUT_S, Deployment, discover, settings_phrase
from dsv4bench.servers.monitor import parse_metrics
from dsv4bench.servers.dialect import counters, is_counter, is_queue_gauge, metric_name
from dsv4bench.history.redact import KeyScope
from dsv4bench.servers.roles import GAUGE_LABELS, ROLES, UNKNOWN, WORKERS, own_gauges_shown, role_gauges, role_of
from dsv4bench.servers.kinds import HEALTH, HEALTH_GENERATE, METRICS, NOT_THERE, UNKNOWN_KIND, kind
from dsv4bench.servers.wedge import WedgeConfig, detect_wedge, failures_rose
from dsv4bench.terminal import visible_text

DEFAULT_STUCK_S = 2.0
STATES = ("healthy", "unhealthy", "wedged", "error", "unreachable")
_EXIT = {"healthy": 0, "unhealthy": 1, "wedged": 1, "error": 2, "unreachable": 2}
_NS = 1_000_000_000


@dataclass
class EndpointProbe:
    """What one server answered, and the state we conclude from it."""

    root: str
    role: str = UNKNOWN  # router | unified | prefill | decode | unknown
    role_source: str = "not reported"
    kind: str = UNKNOWN_KIND  # what server it is (servers/kinds.py)
    kind_source: str = "not reported"
    not_offered: list[str] = field(default_factory=list)  # endpoints it does not offer: not judged
    metrics_error: str | None = None
    gauges: dict[str, float] = field(default_factory=dict)  # queue gauge series -> value at the last look
    health: HealthResult | None = None
    health_generate: HealthResult | None = None
    canary: CanaryResult | None = None  # None when none was sent
    canary_stream: CanaryResult | None = None  # the same, streamed
    canary_skipped: str | None = None  # why none was sent
    state: str = "healthy"  # see STATES
    codes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # the evidence, one line each
    errors: list[str] = field(default_factory=list)  # checks that got an answer they cannot judge by
    failures: list[str] = field(default_factory=list)  # failure counters that rose during the probe: evidence
    looks: list[tuple[int, dict[str, float]]] = field(default_factory=list, repr=False)  # (t_ns, queues + counters)

    def gauge_sum(self, names: tuple[str, ...]) -> float | None:
        vals = [v for k, v in self.gauges.items() if metric_name(k) in names]
        return sum(vals) if vals else None

    def shown_gauges(self) -> list[str]:
        """The role's gauges the server exports, then any other queue gauge holding requests."""
        present = {metric_name(k) for k in self.gauges}
        others = sorted({metric_name(k) for k, v in self.gauges.items() if v > 0} - set(role_gauges(self.role)))
        return own_gauges_shown(self.role, present) + others


@dataclass
class ProbeResult:
    endpoints: list[EndpointProbe]
    deployment: Deployment | None = None  # what discovery found, settings and all
    key: dict[str, Any] | None = None  # with --api-key: which hosts got it (redact.KeyScope.as_dict)

    def to_json(self) -> dict[str, Any]:
        eps = []
        for e in self.endpoints:
            d = asdict(e)
            del d["looks"]
            # Each check as its record (a canary's carries `ok`); {} for one not made.
            for name, check in (
                ("health", e.health),
                ("health_generate", e.health_generate),
                ("canary", e.canary),
                ("canary_stream", e.canary_stream),
            ):
                d[name] = check.as_dict() if check is not None else {}
            eps.append(d)
        out: dict[str, Any] = {"exit_code": probe_exit_code(self), "endpoints": eps}
        if self.deployment is not None:
            out["deployment"] = self.deployment.as_dict()
        if self.key is not None:
            out["key"] = self.key
        return out


def _kept(values: dict[str, float]) -> dict[str, float]:
    """What a look keeps: the queue gauges and the counters (any counter moving is progress)."""
    return {k: v for k, v in values.items() if is_queue_gauge(k) or is_counter(k)}


async def _scrape(client: httpx.AsyncClient, ep: EndpointProbe, timeout: float) -> dict[str, float] | None:
    """One look at root/metrics: appended to ep.looks; the full parse returned, or None. A look
    that fails after one succeeded is no evidence either way, and is dropped."""
    error = None
    try:
        with anyio.fail_after(timeout):
            r = await client.get(ep.root + "/metrics", timeout=timeout)
        if r.status_code != 200:
            error = f"HTTP {r.status_code}"
            if (
                r.status_code in NOT_THERE
                and kind(ep.kind).offered(METRICS) is not True
                and METRICS not in ep.not_offered
            ):
                ep.not_offered.append(METRICS)
        else:
            values = parse_metrics(response_text(r))
    except TimeoutError:
        error = f"timeout after {timeout:g} s"
    except (httpx.HTTPError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"[:200]
    if error is not None:
        if not ep.looks:
            ep.metrics_error = error
        return None
    ep.metrics_error = None
    ep.looks.append((time.monotonic_ns(), _kept(values)))
    ep.gauges = {k: v for k, v in sorted(values.items()) if is_queue_gauge(k)}
    return values


async def _first_look(client: httpx.AsyncClient, ep: EndpointProbe, timeout: float) -> None:
    """The gauges; and the role, from this scrape, where discovery found none."""
    values = await _scrape(client, ep, timeout)
    if ep.role == UNKNOWN and values is not None:
        role = role_of(None, values, None)
        ep.role, ep.role_source = role.name, role.source


async def _models(client: httpx.AsyncClient, root: str, timeout: float) -> tuple[str | None, int | None]:
    """(first model id, HTTP status of /v1/models); status None when nothing answered."""
    try:
        with anyio.fail_after(timeout):
            r = await client.get(root + "/v1/models", timeout=timeout)
    except (httpx.HTTPError, TimeoutError):
        return None, None
    try:
        data = r.json().get("data") if r.status_code == 200 else None
        return (str(data[0]["id"]) if data else None), r.status_code
    except (ValueError, AttributeError, KeyError, IndexError, TypeError):
        return None, r.status_code


async def _canary(client: httpx.AsyncClient, ep: EndpointProbe, timeout: float) -> None:
    if ep.role in WORKERS:
        ep.canary_skipped = f"a {ep.role} server takes its requests from the router"
        return
    model, status = await _models(client, ep.root, timeout)
    if ep.role == UNKNOWN and status is not None and status != 200:
        # The role is not stated and the server lists no models: it may be a worker, and a
        # chat it would refuse says nothing about it.
        ep.canary_skipped = f"role not stated and /v1/models answered HTTP {status}"
        return
    # SGLang serves any model name; "default" is used when /v1/models itself is broken. Not
    # streamed and streamed, side by side: a server can hang in either path alone.

    async def send(stream: bool) -> None:
        c = await check_canary(client, ep.root + "/v1", model or "default", timeout=timeout, stream=stream)
        setattr(ep, "canary_stream" if stream else "canary", c)

    async with anyio.create_task_group() as tg:
        tg.start_soon(send, False)
        tg.start_soon(send, True)


async def _checks(client: httpx.AsyncClient, ep: EndpointProbe, timeout: float) -> None:
    offers = kind(ep.kind)

    async def set_health(path: str, attr: str) -> None:
        h = await check_health(client, ep.root, path, timeout=timeout, offered=offers.offered(path))
        if h.result == NOT_OFFERED:
            ep.not_offered.append(path)
        setattr(ep, attr, h)

    async with anyio.create_task_group() as tg:
        tg.start_soon(set_health, HEALTH, "health")
        tg.start_soon(set_health, HEALTH_GENERATE, "health_generate")
        tg.start_soon(_canary, client, ep, timeout)


def _hung(ep: EndpointProbe) -> str | None:
    """What of this endpoint's own generation checks hung, if any."""
    if ep.canary is not None and ep.canary.result == TIMEOUT:
        return "the canary hung"
    if ep.canary_stream is not None and ep.canary_stream.result == TIMEOUT:
        return "the streamed canary hung"
    if ep.health_generate is not None and ep.health_generate.result == TIMEOUT:
        return "/health_generate hung"
    return None


def _nothing_answered(ep: EndpointProbe) -> bool:
    answered = [
        ep.metrics_error is None,
        ep.health is not None and ep.health.status is not None,
        ep.health_generate is not None and ep.health_generate.status is not None,
        ep.canary is not None and ep.canary.result in (OK, ERROR),
        ep.canary_stream is not None and ep.canary_stream.result in (OK, ERROR),
    ]
    return not any(answered)


def _holding(ep: EndpointProbe) -> bool:
    return bool(ep.looks) and any(v > 0 for k, v in ep.looks[-1][1].items() if is_queue_gauge(k))


def _judge_queues(ep: EndpointProbe, hang: str | None, stuck_s: float) -> set[str]:
    """queue_stuck where a gauge holds requests and never shrank from look to look, while a
    request hung (`hang`), or while no counter moved for at least stuck_s between the last two looks."""
    if not ep.looks:
        return set()
    t_last, last = ep.looks[-1]
    frozen_s = None
    if len(ep.looks) >= 3:
        t_prev, prev = ep.looks[-2]
        if counters(prev) == counters(last):
            frozen_s = (t_last - t_prev) / _NS
    codes: set[str] = set()
    for key, value in sorted(last.items()):
        if not is_queue_gauge(key) or value <= 0:
            continue
        seen = [look.get(key, 0.0) for _, look in ep.looks]
        if any(b < a for a, b in zip(seen, seen[1:])):
            continue  # shrinking: draining
        name = metric_name(key)
        if hang is not None:
            codes.add("queue_stuck")
            ep.reasons.append(f"queue_stuck: {name}={value:g}, not draining while {hang}")
        elif frozen_s is not None and frozen_s >= stuck_s:
            codes.add("queue_stuck")
            ep.reasons.append(f"queue_stuck: {name}={value:g}, no counter moved for {frozen_s:.1f} s")
    return codes


def _code_evidence(ep: EndpointProbe, codes: set[str]) -> list[str]:
    """Why the shared canary / health rules gave their codes, worded for this endpoint's block."""
    out = []
    hung = [c for c in (ep.canary, ep.canary_stream) if c is not None and c.result == TIMEOUT]
    for c in hung:
        if c.stream:
            out.append(f"canary_timeout: streamed canary: {c.error or f'no answer in {c.latency_s:.1f} s'}")
        else:
            out.append(f"canary_timeout: the canary got no answer in {c.latency_s:.1f} s")
    if "health_lies" in codes:
        if hung:
            what = "the streamed canary hung" if all(c.stream for c in hung) else "the canary hung"
        elif ep.health_generate is not None and ep.health_generate.result != TIMEOUT:
            what = f"/health_generate answered {ep.health_generate.status}"
        else:
            what = "/health_generate hung"
        out.append(f"health_lies: /health answered 200 while {what}")
    return out


def _classify(ep: EndpointProbe, deployment_hang: str | None, stuck_s: float) -> None:
    if _nothing_answered(ep):
        ep.state = "unreachable"
        health_error = ep.health.error if ep.health is not None else None
        canary_error = ep.canary.error if ep.canary is not None else None
        for what, error in (("metrics", ep.metrics_error), ("/health", health_error), ("canary", canary_error)):
            if error:
                ep.reasons.append(f"{what}: {error}")
        return
    # The canary and health rules are the run's (wedge.detect_wedge): probe and run agree.
    probes = [h for h in (ep.health, ep.health_generate) if h is not None]
    canaries = [c for c in (ep.canary, ep.canary_stream) if c is not None]
    found = detect_wedge([], 0, WedgeConfig(), health=probes, canaries=canaries)
    codes = {c for f in found.values() for c in f.codes}
    ep.reasons.extend(_code_evidence(ep, codes))
    if len(ep.looks) >= 2:
        ep.failures = failures_rose(ep.looks[0][1], ep.looks[-1][1])
    # A worker behind a router whose canary hung is part of that hang: its queues are judged by it.
    hang = _hung(ep) or (deployment_hang if ep.role in WORKERS else None)
    codes |= _judge_queues(ep, hang, stuck_s)
    ep.codes = sorted(codes)

    unwell = False
    for path, h in (("/health", ep.health), ("/health_generate", ep.health_generate)):
        if h is None or h.result == NOT_OFFERED:
            continue  # an endpoint the server does not offer says nothing of its health
        if h.result == FAILING:
            unwell = True
            ep.reasons.append(f"{path} answered {h.status}")
        elif h.result in (TIMEOUT, UNREACHABLE, ERROR) and "health_lies" not in codes:
            unwell = True
            ep.reasons.append(f"{path}: {h.error or h.result}")
    unjudged = False
    for name, c in (("canary", ep.canary), ("streamed canary", ep.canary_stream)):
        if c is None or c.result not in (ERROR, UNREACHABLE):
            continue
        status = c.http_status
        if isinstance(status, int) and status >= 500:
            unwell = True  # the server answered that it failed: not a hang, but not serving
            ep.reasons.append(f"the {name} was answered with HTTP {status}")
        else:
            unjudged = True  # 4xx, HTML, not JSON, no choices: the check itself did not work
        ep.errors.append(f"{name}: {c.error} (not a hang)")
    if ep.metrics_error is not None and (ep.role in WORKERS or (ep.role == UNKNOWN and ep.canary is None)):
        unjudged = True
        ep.errors.append(f"gauges: /metrics {ep.metrics_error}, and a {ep.role} server is judged by them")
    elif METRICS in ep.not_offered:
        pass  # judged by its canaries and /health alone; the gauges row says so
    elif ep.metrics_error is not None:
        ep.reasons.append(f"no gauges: /metrics {ep.metrics_error}")
    ep.state = "wedged" if ep.codes else "error" if unjudged else "unhealthy" if unwell else "healthy"


async def _each(
    eps: list[EndpointProbe], fn: Any, client_for: Callable[[str], httpx.AsyncClient], timeout: float
) -> None:
    """fn(client, ep, timeout) for every endpoint at once, each through `client_for(its root)`."""
    async with anyio.create_task_group() as tg:
        for ep in eps:
            tg.start_soon(fn, client_for(ep.root), ep, timeout)


async def probe_async(
    endpoints: list[str],
    timeout: float = 10.0,
    stuck_s: float = DEFAULT_STUCK_S,
    api_key: str | None = None,
    follow_workers: bool = True,
    key_to_workers: bool = False,
) -> ProbeResult:
    """Probe every endpoint, and with `follow_workers` every server their routers list,
    concurrently; each check is bounded by `timeout` seconds. The key goes to the endpoints
    given, and to the workers a router lists on other hosts only with `key_to_workers`."""
    scope = KeyScope(api_key, endpoints, key_to_workers)
    keyed_headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        httpx.AsyncClient(trust_env=False, headers=keyed_headers) as keyed,
        httpx.AsyncClient(trust_env=False) as keyless,
    ):

        def client_for(root: str) -> httpx.AsyncClient:
            return keyed if scope.allows(root) else keyless

        deployment = await discover(
            endpoints, keyless, timeout=min(timeout, DEFAULT_TIMEOUT_S), follow_workers=follow_workers, scope=scope
        )
        eps = [
            EndpointProbe(root=e.root, role=e.role, role_source=e.role_source, kind=e.kind, kind_source=e.kind_source)
            for e in deployment.endpoints
        ]
        await _each(eps, _first_look, client_for, timeout)
        await _each(eps, _checks, client_for, timeout)
        await _each(eps, _scrape, client_for, timeout)
        hang = _deployment_hang(eps)
        waiting = [ep for ep in eps if _holding(ep) and _hung(ep) is None and not (hang and ep.role in WORKERS)]
        if waiting and stuck_s > 0:
            # Work is held and nothing hung: is it moving? One more look, stuck_s later.
            await anyio.sleep(stuck_s)
            await _each(waiting, _scrape, client_for, timeout)
    for ep in eps:
        _classify(ep, hang, stuck_s)
    return ProbeResult(eps, deployment, scope.as_dict() if api_key else None)


def _deployment_hang(eps: list[EndpointProbe]) -> str | None:
    """A canary that hung on a router or unified server: the workers behind it hang with it."""
    for ep in eps:
        for c in (ep.canary, ep.canary_stream):
            if c is not None and c.result == TIMEOUT:
                return f"the {'streamed ' if c.stream else ''}canary on {_host(ep.root)} hung"
    return None


def probe(
    endpoints: list[str],
    timeout: float = 10.0,
    stuck_s: float = DEFAULT_STUCK_S,
    api_key: str | None = None,
    follow_workers: bool = True,
    key_to_workers: bool = False,
) -> ProbeResult:
    """Synchronous wrapper around probe_async (the CLI and tests call this)."""
    return anyio.run(probe_async, endpoints, timeout, stuck_s, api_key, follow_workers, key_to_workers)


def probe_exit_code(result: ProbeResult) -> int:
    return max((_EXIT[e.state] for e in result.endpoints), default=0)


# --- rendering: one block per endpoint, fit for an 80-column terminal ---------------------------

_COLORS = {"healthy": "green", "unhealthy": "yellow", "wedged": "bold red", "error": "yellow", "unreachable": "yellow"}


def _host(root: str) -> str:
    parts = urlsplit(root)
    return parts.netloc + parts.path.rstrip("/") if parts.netloc else root


def _secs(v: Any) -> str:
    return f"{v:.2f} s" if isinstance(v, (int, float)) else "?"


def _health_cell(path: str, h: HealthResult | None) -> str:
    if h is None:
        return f"{path} -"
    if h.result == NOT_OFFERED:
        return f"{path} not offered"
    if h.status is not None:
        return f"{path} {h.status}"
    if h.result == TIMEOUT:
        return f"{path} no answer"
    if h.result == UNREACHABLE:
        return f"{path} refused"
    return f"{path} error"


def _one_canary(c: CanaryResult) -> Text:
    if c.result == OK:
        return Text(f"ok in {_secs(c.latency_s)}", style="green")
    if c.result == TIMEOUT and c.stream and c.http_status is not None:
        return Text(f"{c.error}: hung", style="red")
    if c.result == TIMEOUT:
        return Text(f"no answer in {_secs(c.latency_s)}: hung", style="red")
    if c.result == UNREACHABLE:
        return Text(f"could not connect: {c.error}", style="yellow")
    return Text(f"error: {c.error} (not a hang)", style="yellow")


def _canary_cell(ep: EndpointProbe) -> Text:
    if ep.canary is None and ep.canary_stream is None:
        return Text(f"not sent: {ep.canary_skipped or 'no check made'}", style="dim")
    text = Text()
    if ep.canary is not None:
        text.append_text(_one_canary(ep.canary))
    if ep.canary_stream is not None:
        text.append(" · streamed " if ep.canary is not None else "streamed ", style="dim")
        text.append_text(_one_canary(ep.canary_stream))
    return text


def _gauge_cell(ep: EndpointProbe) -> Text:
    if not ep.gauges and METRICS in ep.not_offered:
        return Text("not offered: judged by its canaries and /health", style="dim")
    if not ep.gauges:
        return Text(f"none read{f': /metrics {ep.metrics_error}' if ep.metrics_error else ''}", style="dim")
    parts = []
    for name in ep.shown_gauges():
        value = ep.gauge_sum((name,)) or 0.0
        label = GAUGE_LABELS.get(name, name)
        parts.append((f"{label} {value:g}", "bold red" if value > 0 and ep.codes else ""))
    text = Text()
    for i, (part, style) in enumerate(parts):
        if i:
            text.append(" · ", style="dim")
        text.append(part, style=style)
    return text


def _kind_cell(ep: EndpointProbe) -> Text:
    """Its kind and how it was recognised, and the endpoints it does not offer."""
    text = Text(kind(ep.kind).title)
    text.append(f" ({ep.kind_source})", style="dim")
    if ep.not_offered:
        text.append(f" · not offered: {', '.join(sorted(set(ep.not_offered)))}", style="dim")
    return text


def _found_cell(result: ProbeResult, ep: EndpointProbe) -> Text | None:
    """How discovery came to it (a router listed it) and what it reports of its settings."""
    found = result.deployment.endpoint(ep.root) if result.deployment is not None else None
    if found is None or not (found.answered or found.listed_as):
        return None
    text = Text()
    if found.listed_as is not None:
        health = {True: ", healthy", False: ", not healthy", None: ""}[found.listed_healthy]
        text.append(f"listed by the router as {found.listed_as}{health}", style="dim")
        text.append(" · " if found.answered else "", style="dim")
    if found.answered:
        text.append(settings_phrase(found))
    return text


def _row(grid: Table, label: str | Text, cell: str | Text) -> None:
    """A row of the probe's grid. Its cells quote what servers said (roots a router listed,
    settings, gauge names, error bodies): each goes through `visible_text` so no control
    sequence or bidi override of theirs reaches the terminal."""
    grid.add_row(
        visible_text(Text(label) if isinstance(label, str) else label),
        visible_text(Text(cell) if isinstance(cell, str) else cell),
    )


def render_probe(result: ProbeResult, console: Console) -> None:
    """Per endpoint: `role  root: state (codes)`, then its settings, gauges, health, canary and
    the evidence."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, min_width=8)
    grid.add_column(overflow="fold")
    for ep in result.endpoints:
        codes = f" ({', '.join(ep.codes)})" if ep.codes else ""
        head = Text(f"{ep.root}: ")
        head.append(f"{ep.state}{codes}", style=_COLORS.get(ep.state, ""))
        _row(grid, Text(ep.role if ep.role in ROLES else "unknown", style="bold"), head)
        _row(grid, "  server", _kind_cell(ep))
        found = _found_cell(result, ep)
        if found is not None:
            _row(grid, "  config", found)
        _row(grid, "  gauges", _gauge_cell(ep))
        _row(
            grid,
            "  health",
            Text(f"{_health_cell('/health', ep.health)} · {_health_cell('/health_generate', ep.health_generate)}"),
        )
        _row(grid, "  canary", _canary_cell(ep))
        for i, reason in enumerate(ep.reasons):
            _row(grid, "  why" if i == 0 else "", Text(reason))
        # The canary's own error is on its row already.
        errors = [e for e in ep.errors if not e.startswith(("canary: ", "streamed canary: "))]
        for i, error in enumerate(errors):
            _row(grid, "  check" if i == 0 else "", Text(error, style="yellow"))
        if ep.failures:
            _row(grid, "  failed", Text(f"{', '.join(ep.failures)} during the probe"))
    console.print(grid)
    counts = {s: sum(e.state == s for e in result.endpoints) for s in STATES}
    words = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    console.print(f"{words or 'no endpoints'} (exit {probe_exit_code(result)})", highlight=False)
    if result.key is not None:
        console.print(visible_text(Text(key_line(result.key))))


def key_line(key: dict[str, Any]) -> str:
    """Which hosts the API key went to, and which were probed without it, in one line."""
    sent = ", ".join(key.get("key_sent_to") or []) or "none"
    line = f"API key sent to: {sent}"
    if key.get("key_withheld_from"):
        line += (
            f"; not sent to {', '.join(key['key_withheld_from'])} (found at a router's /workers, not named: "
            "--key-to-workers sends it there too)"
        )
    return line


def probe_main(
    endpoints: list[str],
    timeout: float,
    json_out: Path | None,
    stuck_s: float = DEFAULT_STUCK_S,
    api_key: str | None = None,
    console: Console | None = None,
    follow_workers: bool = True,
    key_to_workers: bool = False,
) -> int:
    """CLI body of `dsv4bench probe`: blocks to stdout, optional JSON file, exit code returned."""
    result = probe(endpoints, timeout, stuck_s, api_key, follow_workers, key_to_workers)
    render_probe(result, console or Console())
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    return probe_exit_code(result)
