"""A deployment found from one URL: the router's workers, each server's role, `/metrics` and the
settings where PD, HiCache and tool-call bugs live.

Given a router, a PD worker or a unified server, `discover` asks each root for
`/get_server_info` (`/server_info` where that is missing), `/workers` and `/metrics`. A router's
worker list (SGLang's router and the bundled engine's PD router answer `/workers` with
`{"workers": [{"url", "worker_type": "prefill" | "decode" | "regular", "bootstrap_port",
"is_healthy", ...}]}`) names the prefill, decode and regular servers behind it, and each of those
is asked the same, but for `/workers`. Each server's role is read from the server itself
(roles.py); the router's list gives it only where the server states none.

Settings are SGLang's `server_args` names (`SETTINGS`), taken as each server reports them:
one it does not report is "not reported", never a default filled in. A router may answer
`/get_server_info` by passing it on to one of its workers; those settings are not the router's
and are not shown as its own.

The pure functions take what the servers answered; `discover` asks them, with short timeouts
and a cap on every body. A server that does not answer, or answers HTML, not-JSON, a JSON of
the wrong shape or a body past the cap, is one that did not answer that question: recorded in
the endpoint's `problems`, never raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx

from dsv4bench.servers.dialect import SERVER_METRIC_PREFIXES, dialect_of
from dsv4bench.servers.kinds import KINDS, NOT_THERE, SERVER_INFO, UNKNOWN_KIND, recognise
from dsv4bench.servers.monitor import is_json_metrics, parse_metrics
from dsv4bench.history.redact import KeyScope
from dsv4bench.servers.roles import DECODE, PREFILL, ROLES, ROUTER, UNIFIED, UNKNOWN, WORKERS, Role, role_of
from dsv4bench.terminal import visible

DEFAULT_TIMEOUT_S = 5.0  # per question; they are asked side by side, so a dead server costs one
MAX_JSON_BYTES = 1 << 20  # SGLang's server_info is tens of kB, internal states and all
MAX_METRICS_BYTES = 16 << 20  # histograms per rank reach megabytes on a wide deployment
MAX_WORKERS = 64  # a longer list is cut here: more is a broken answer, not a deployment
MAX_TEXT = 80  # a reported string setting is shown up to this many characters

# SGLang's server_args names that matter for the incident's bugs, in display order. The last
# four are shown only where a server reports them.
SETTINGS: tuple[str, ...] = (
    "version",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "disaggregation_bootstrap_port",
    "disable_overlap_schedule",
    "enable_hierarchical_cache",
    "hicache_write_policy",
    "tool_call_parser",
    "reasoning_parser",
    "max_running_requests",
    "tp_size",
    "dp_size",
    "page_size",
    "chunked_prefill_size",
)
IF_REPORTED = frozenset({"tp_size", "dp_size", "page_size", "chunked_prefill_size"})
# A few words for each in a terminal line.
LABELS: dict[str, str] = {
    "version": "version",
    "disaggregation_mode": "PD",
    "disaggregation_transfer_backend": "transfer",
    "disaggregation_bootstrap_port": "bootstrap port",
    "disable_overlap_schedule": "overlap schedule",
    "enable_hierarchical_cache": "HiCache",
    "hicache_write_policy": "HiCache write",
    "tool_call_parser": "tool parser",
    "reasoning_parser": "reasoning parser",
    "max_running_requests": "max running",
    "tp_size": "tp",
    "dp_size": "dp",
    "page_size": "page",
    "chunked_prefill_size": "chunked prefill",
}
_PD_ONLY = frozenset({"disaggregation_transfer_backend", "disaggregation_bootstrap_port"})
NOT_REPORTED = "not reported"

# How a router lists a worker -> the role it serves in.
_LISTED_ROLES = {"prefill": PREFILL, "decode": DECODE, "regular": UNIFIED}
# SGLang's router in DP-aware mode lists each rank of a server as `URL@rank`.
_FOUND_ORDER = (PREFILL, DECODE, UNIFIED, ROUTER, UNKNOWN)
_DP_RANK = re.compile(r"@\d+$")
_BOOTSTRAP_IN_NAME = re.compile(r"(\d{1,5})\)?$")


# --- what a server answered --------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One GET: the status and the body, or why there is none (`error`, a few words)."""

    status: int | None = None
    body: bytes = b""
    error: str | None = None


def json_of(answer: Answer) -> tuple[Any, str | None]:
    """(the JSON of a 200 answer, None), or (None, why it is not one)."""
    if answer.error is not None:
        return None, answer.error
    if answer.status != 200:
        return None, f"HTTP {answer.status}"
    try:
        return json.loads(answer.body), None
    except (ValueError, RecursionError):
        start = answer.body[:64].lstrip().lower()
        return None, "HTML, not JSON" if start.startswith((b"<!doctype", b"<html")) else "not JSON"


def metrics_of(answer: Answer) -> tuple[dict[str, float] | None, str | None]:
    """(the series of a serving engine's /metrics page, None), or (None, why it is not one)."""
    if answer.error is not None:
        return None, answer.error
    if answer.status != 200:
        return None, f"HTTP {answer.status}"
    text = answer.body.decode("utf-8", errors="replace")
    if is_json_metrics(text):  # TensorRT-LLM's iteration stats
        try:
            return parse_metrics(text), None
        except ValueError as e:
            return None, str(e)
    if not any(prefix in text for prefix in SERVER_METRIC_PREFIXES):
        return None, "no SGLang, vLLM or router metrics in it"
    try:
        return parse_metrics(text), None
    except Exception:  # noqa: BLE001 - a page the Prometheus parser chokes on is no page, not our crash
        return None, "not Prometheus text"


@dataclass(frozen=True)
class ListedWorker:
    """One worker as a router lists it."""

    url: str  # its root, as the router reaches it
    kind: str  # "prefill", "decode", "regular", or "unknown"
    bootstrap_port: int | None = None
    healthy: bool | None = None


def normalize_root(url: str) -> str | None:
    """An http(s) server root without a trailing slash or a DP rank suffix, or None if `url` is none."""
    url = _DP_RANK.sub("", url.strip()).rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # raises on a port that is not a number
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return None
    return url


def _port(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536 else None


def _listed_kind(worker_type: Any) -> tuple[str, int | None]:
    """SGLang's router says "prefill" / "decode" / "regular"; older releases "prefill(8998)" or
    serde's {"Prefill": {"bootstrap_port": 8998}}."""
    if isinstance(worker_type, dict) and len(worker_type) == 1:
        ((name, inner),) = worker_type.items()
        port = _port(inner.get("bootstrap_port")) if isinstance(inner, dict) else None
        return _listed_kind(name)[0], port
    if not isinstance(worker_type, str):
        return "unknown", None
    name = worker_type.strip().lower()
    kind = next((k for k in _LISTED_ROLES if name.startswith(k)), "unknown")
    m = _BOOTSTRAP_IN_NAME.search(name) if kind == "prefill" and name != "prefill" else None
    return kind, _port(int(m.group(1))) if m else None


def listed_workers(payload: Any) -> list[ListedWorker] | None:
    """The workers of a router's `/workers` answer; None when it is no worker list. Entries that
    name no http(s) URL are left out; a server listed once per DP rank is one worker."""
    entries = payload.get("workers", payload.get("urls")) if isinstance(payload, dict) else payload
    if not isinstance(entries, list):
        return None
    found: dict[str, ListedWorker] = {}
    for entry in entries:
        raw = entry.get("url") if isinstance(entry, dict) else entry
        root = normalize_root(raw) if isinstance(raw, str) else None
        if root is None or root in found:
            continue
        kind, port = _listed_kind(entry.get("worker_type")) if isinstance(entry, dict) else ("unknown", None)
        if isinstance(entry, dict):
            port = _port(entry.get("bootstrap_port")) or port
            healthy = entry.get("is_healthy")
        else:
            healthy = None
        found[root] = ListedWorker(root, kind, port, healthy if isinstance(healthy, bool) else None)
        if len(found) == MAX_WORKERS:
            break
    return list(found.values())


def settings_of(info: Any) -> dict[str, Any]:
    """The SETTINGS a `/get_server_info` answer reports, each a JSON scalar (null included:
    SGLang reports an unset parser so); a value of another type is not a report of it."""
    if not isinstance(info, dict):
        return {}
    out: dict[str, Any] = {}
    for key in SETTINGS:
        value = info.get(key, ...)
        if value is None or isinstance(value, (bool, int, float)):
            out[key] = value
        elif isinstance(value, str):
            out[key] = value[:MAX_TEXT]
    return out


def own_voice(info: Any, role: Role) -> bool:
    """Whether a server_info is the server's own. A router states itself (the bundled router's
    `engine_type`, SGLang's router's `router_manager`); one that reads like a worker's was
    passed on from a worker."""
    if role.name != ROUTER or not isinstance(info, dict):
        return True
    return info.get("engine_type") == ROUTER or "router_manager" in info


# --- the deployment ----------------------------------------------------------------------------


@dataclass
class Endpoint:
    """One server of the deployment: its role, where its metrics are, what it reports of itself."""

    root: str
    role: str = UNKNOWN
    role_source: str = NOT_REPORTED
    kind: str = UNKNOWN_KIND  # what server it is (servers/kinds.py): what it is judged by
    kind_source: str = NOT_REPORTED
    listed_as: str | None = None  # the router's worker_type for it; None when no router lists it
    listed_healthy: bool | None = None
    listed_bootstrap_port: int | None = None
    metrics_url: str | None = None  # root/metrics when it serves an engine's or a router's metrics
    metrics_dialect: dict[str, str] | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # SETTINGS it reported
    answered: bool = False  # it answered at least one question
    problems: list[str] = field(default_factory=list)  # "/metrics: HTTP 404", one per question unanswered

    def shown_settings(self) -> list[tuple[str, Any]]:
        """(name, value or NOT_REPORTED) for the settings that matter to its role."""
        rows = []
        for key in SETTINGS:
            if key == "disaggregation_bootstrap_port" and self.role == DECODE:
                continue  # SGLang's decode reports the default: no port of its own
            if self.role == ROUTER and key != "version":
                continue  # a router schedules nothing, caches nothing: its workers' settings are the ones
            if key in self.settings:
                rows.append((key, self.settings[key]))
            elif key == "disaggregation_bootstrap_port" and self.listed_bootstrap_port is not None:
                rows.append((key, f"{self.listed_bootstrap_port} (router's list)"))
            elif self._expected(key):
                rows.append((key, NOT_REPORTED))
        return rows

    def _expected(self, key: str) -> bool:
        """Whether a setting not reported is worth saying so: the ones of its role."""
        if key in IF_REPORTED or self.role == ROUTER or not self.answered:
            return False
        if KINDS.get(self.kind, KINDS[UNKNOWN_KIND]).offered(SERVER_INFO) is False:
            return False  # SGLang's settings: a kind without /get_server_info never reports them
        if key == "disaggregation_bootstrap_port":
            return self.role == PREFILL
        if key in _PD_ONLY:
            return self.role in WORKERS
        if key == "hicache_write_policy":
            return self.settings.get("enable_hierarchical_cache") is not False
        return True


def show_setting(key: str, value: Any) -> str:
    """A setting's value in words: the overlap schedule as on/off, booleans as on/off, null as none."""
    if value == NOT_REPORTED:
        return NOT_REPORTED
    if key == "disable_overlap_schedule" and isinstance(value, bool):
        return "off" if value else "on"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if key == "disaggregation_mode" and value == "null":
        return "off (null)"
    return str(value)


def settings_phrase(ep: Endpoint) -> str:
    """'PD prefill · transfer mooncake · ... ; not reported: bootstrap port', for a terminal."""
    rows = ep.shown_settings()
    said = [f"{LABELS[k]} {show_setting(k, v)}" for k, v in rows if v != NOT_REPORTED]
    missing = [LABELS[k] for k, v in rows if v == NOT_REPORTED]
    text = " · ".join(said)
    if missing:
        text += ("; " if text else "") + "not reported: " + ", ".join(missing)
    return text or "none reported"


@dataclass
class Deployment:
    """The servers found from the roots given: those first, then each worker a router lists."""

    given: list[str]
    endpoints: list[Endpoint]
    found_via: list[str] = field(default_factory=list)  # the routers whose /workers named servers

    @property
    def roots(self) -> list[str]:
        return [e.root for e in self.endpoints]

    @property
    def metrics_urls(self) -> list[str]:
        return [e.metrics_url for e in self.endpoints if e.metrics_url]

    @property
    def found(self) -> list[Endpoint]:
        """The servers a router named that were not given."""
        return [e for e in self.endpoints if e.root not in self.given]

    def endpoint(self, root: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.root == root.rstrip("/")), None)

    def roles(self) -> dict[str, Role]:
        """Each root's role, as the run's final checks key them."""
        return {e.root: Role(e.role, e.role_source) for e in self.endpoints}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Deployment | None:
        """The record as run.json keeps it; None for one that is not (an older run, a broken file)."""
        if not isinstance(data, dict) or not isinstance(data.get("endpoints"), list):
            return None
        endpoints = []
        for e in data["endpoints"]:
            if not isinstance(e, dict) or not isinstance(e.get("root"), str):
                continue
            ep = Endpoint(e["root"])
            for name, kind in (
                ("role", str),
                ("role_source", str),
                ("kind", str),
                ("kind_source", str),
                ("listed_as", str),
                ("listed_healthy", bool),
                ("listed_bootstrap_port", int),
                ("metrics_url", str),
                ("metrics_dialect", dict),
                ("answered", bool),
                ("problems", list),
            ):
                if isinstance(e.get(name), kind):
                    setattr(ep, name, e[name])
            ep.role = ep.role if ep.role in ROLES else UNKNOWN
            ep.problems = [p for p in ep.problems if isinstance(p, str)]
            ep.settings = settings_of(e.get("settings"))
            endpoints.append(ep)
        given, via = (_strings(data.get(k)) for k in ("given", "found_via"))
        return cls(given, endpoints, via)

    def describe(self) -> list[str]:
        """The deployment in a few lines for the terminal: per server its role, root, metrics,
        and its settings on the next line."""
        via = f" (from {', '.join(self.found_via)} /workers)" if self.found_via else ""
        lines = [f"deployment: {len(self.endpoints)} server{'s' if len(self.endpoints) != 1 else ''}{via}"]
        for ep in self.endpoints:
            metrics = "/metrics" if ep.metrics_url else "no /metrics"
            state = "" if ep.answered else ": not answering"
            lines.append(f"  {ep.role:<8} {ep.root}  {metrics}{state}")
            lines.append(f"           {settings_phrase(ep) if ep.answered else '; '.join(ep.problems[:2])}")
        # Roots a router listed, settings and problems quote the servers: no control sequence or
        # bidi override of theirs may reach the terminal these lines are printed on.
        return [visible(line) for line in lines]


def _strings(value: Any) -> list[str]:
    """The strings of a list read from a file; [] for anything that is not a list."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


@dataclass
class RootAnswers:
    """What one root answered (None where it did not), and why not."""

    info: Any = None
    workers: Any = None
    metrics: dict[str, float] | None = None
    version: str | None = None  # /version's {"version": ...} (vLLM, TensorRT-LLM)
    metrics_json: bool = False  # /metrics answered a JSON list (TensorRT-LLM's iteration stats)
    problems: list[str] = field(default_factory=list)


def endpoint_of(root: str, answers: RootAnswers, listed: ListedWorker | None = None) -> Endpoint:
    """One server's record from what it answered and how a router lists it."""
    ep = Endpoint(root, problems=list(answers.problems))
    ep.answered = any(a is not None for a in (answers.info, answers.metrics, answers.workers, answers.version))
    role = role_of(answers.info, answers.metrics, answers.workers)
    listed_role = _LISTED_ROLES.get(listed.kind) if listed is not None else None
    if not role.known and listed_role is not None:
        role = Role(listed_role, "the router's /workers worker_type")
    elif role.known and listed is not None and listed_role not in (None, role.name):
        ep.problems.append(f"the router lists it as {listed.kind}, it says {role.name} ({role.source})")
    ep.role, ep.role_source = role.name, role.source
    found, ep.kind_source = recognise(answers.info, answers.metrics, answers.workers, answers.metrics_json)
    ep.kind = found.name
    if ep.role == UNKNOWN and found.serves_alone:
        ep.role, ep.role_source = UNIFIED, f"a {found.title} server ({ep.kind_source})"
    if listed is not None:
        ep.listed_as, ep.listed_healthy, ep.listed_bootstrap_port = listed.kind, listed.healthy, listed.bootstrap_port
    if answers.metrics is not None or answers.metrics_json:
        ep.metrics_url = f"{root}/metrics"
        ep.metrics_dialect = asdict(dialect_of(answers.metrics or {}))
    elif role.name == ROUTER:
        ep.problems.append("a router may serve its own metrics on another port (SGLang's: --prometheus-port)")
    if own_voice(answers.info, role):
        ep.settings = settings_of(answers.info)
    else:
        ep.problems.append("/get_server_info: a worker's, passed on by the router; not its own")
    if answers.version is not None and "version" not in ep.settings:
        ep.settings["version"] = answers.version[:MAX_TEXT]
    return ep


def deployment_of(given: Sequence[str], answers: dict[str, RootAnswers]) -> tuple[Deployment, list[ListedWorker]]:
    """The deployment of the `given` roots, and the workers their routers list that were not
    asked yet (answers has no entry for them): ask those, and call again."""
    listings: dict[str, ListedWorker] = {}
    via = []
    for root in given:
        a = answers.get(root)
        workers = listed_workers(a.workers) if a is not None else None
        if workers:
            via.append(root)
            for w in workers:
                listings.setdefault(w.url, w)
    roots = list(dict.fromkeys([*given, *listings]))
    endpoints = [endpoint_of(r, answers[r], listings.get(r)) for r in roots if r in answers]
    # The servers found after the ones given, in request order (a router lists them as it likes).
    n = len(given)
    endpoints[n:] = sorted(endpoints[n:], key=lambda e: _FOUND_ORDER.index(e.role))
    return Deployment(list(given), endpoints, via), [w for r, w in listings.items() if r not in answers]


# --- asking ------------------------------------------------------------------------------------


async def fetch(
    client: httpx.AsyncClient, url: str, timeout: float, limit: int, headers: dict[str, str] | None = None
) -> Answer:
    """GET `url` within `timeout` seconds in all (a server that trickles its body is cut off
    too), reading at most `limit` bytes of it; `headers`: the key, where it may go."""
    try:
        with anyio.fail_after(timeout):
            async with client.stream("GET", url, timeout=timeout, headers=headers) as r:
                if r.status_code != 200:
                    return Answer(r.status_code)
                body = bytearray()
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        return Answer(r.status_code, error=f"answer over {limit >> 20} MiB")
                return Answer(r.status_code, bytes(body))
    except (TimeoutError, httpx.TimeoutException):
        return Answer(error=f"no answer in {timeout:g} s")
    except httpx.ConnectError:
        return Answer(error="could not connect")
    except httpx.HTTPError as e:
        return Answer(error=f"{type(e).__name__}"[:80])


def _stats_list(body: bytes) -> bool:
    """Whether a /metrics body is a JSON list of objects (TensorRT-LLM's iteration stats, `[]` idle)."""
    if body.lstrip()[:1] != b"[":
        return False
    try:
        stats = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(stats, list) and all(isinstance(s, dict) for s in stats)


async def ask(
    client: httpx.AsyncClient, root: str, timeout: float, router_too: bool, headers: dict[str, str] | None = None
) -> RootAnswers:
    """/get_server_info (else /server_info), /metrics and, with `router_too`, /workers of one root
    (`headers` on each: the key, where it may go)."""
    got = RootAnswers()

    async def info() -> None:
        answer = await fetch(client, f"{root}/get_server_info", timeout, MAX_JSON_BYTES, headers)
        path = "/get_server_info"
        if answer.status in (404, 405):  # newer SGLang serves only /server_info
            answer, path = await fetch(client, f"{root}/server_info", timeout, MAX_JSON_BYTES, headers), "/server_info"
        value, problem = json_of(answer)
        if problem is None and not isinstance(value, dict):
            problem = "not a JSON object"
        if problem is None:
            got.info = value
        elif answer.status not in NOT_THERE:  # a server without it (vLLM, TensorRT-LLM) has no problem
            got.problems.append(f"{path}: {problem}")

    async def version() -> None:
        # vLLM and TensorRT-LLM state their release here, not in a /get_server_info.
        value, _ = json_of(await fetch(client, f"{root}/version", timeout, MAX_JSON_BYTES, headers))
        if isinstance(value, dict) and isinstance(value.get("version"), str):
            got.version = value["version"]

    async def workers() -> None:
        value, problem = json_of(await fetch(client, f"{root}/workers", timeout, MAX_JSON_BYTES, headers))
        if problem is None and listed_workers(value) is not None:
            got.workers = value
        # A server that is no router has no /workers: not a problem of it.

    async def metrics() -> None:
        answer = await fetch(client, f"{root}/metrics", timeout, MAX_METRICS_BYTES, headers)
        # A JSON list is TensorRT-LLM's iteration stats, even an empty one (no iteration since the last look).
        got.metrics_json = answer.status == 200 and _stats_list(answer.body)
        values, problem = metrics_of(answer)
        if problem is None:
            got.metrics = values
        elif got.metrics_json and answer.body.strip() == b"[]":
            pass  # an idle TensorRT-LLM: no iteration since the last look, and no problem
        else:
            got.problems.append(f"/metrics: {problem}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(info)
        tg.start_soon(version)
        tg.start_soon(metrics)
        if router_too:
            tg.start_soon(workers)
    got.problems.sort()
    return got


async def discover(
    roots: Sequence[str],
    client: httpx.AsyncClient | None = None,
    api_key: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    follow_workers: bool = True,
    key_to_workers: bool = False,
    scope: KeyScope | None = None,
) -> Deployment:
    """Ask the `roots`, then (`follow_workers`) the workers their routers list, side by side;
    never raises for what a server answers. `client`: one to ask through (tests give a mock
    transport); it should carry no key of its own: the key goes per request, to the servers
    `scope` allows (by default the roots given, and the workers they list only with
    `key_to_workers`: a router may list any host)."""
    given = list(dict.fromkeys(r.rstrip("/") for r in roots))
    if scope is None:
        scope = KeyScope(api_key, given, key_to_workers)
    if client is None:
        async with httpx.AsyncClient(trust_env=False) as own:
            return await discover(given, own, timeout=timeout, follow_workers=follow_workers, scope=scope)
    answers: dict[str, RootAnswers] = {}

    async def ask_into(root: str, router_too: bool) -> None:
        answers[root] = await ask(client, root, timeout, router_too, scope.headers(root))

    async with anyio.create_task_group() as tg:
        for root in given:
            tg.start_soon(ask_into, root, True)
    deployment, unasked = deployment_of(given, answers)
    if unasked and follow_workers:
        async with anyio.create_task_group() as tg:
            for w in unasked:
                tg.start_soon(ask_into, w.url, False)
        deployment, _ = deployment_of(given, answers)
    return deployment


def discover_sync(
    roots: Sequence[str],
    api_key: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    follow_workers: bool = True,
    scope: KeyScope | None = None,
) -> Deployment:
    """`discover` for a caller outside an event loop (the CLI)."""
    return anyio.run(
        lambda: discover(roots, api_key=api_key, timeout=timeout, follow_workers=follow_workers, scope=scope)
    )
