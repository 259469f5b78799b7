"""What keeps other web pages from steering `dsv4bench locust` through Locust's web UI.

Locust's Flask app answers every origin (flask-cors, `Access-Control-Allow-Origin: *`) and its
`/swarm` form carries no token, so any page the operator opens could start a test against a
host of its choosing, with the API key on every request, or read the UI's statistics and the
report. Here, hooked on Locust's own Flask app from the locustfile's `init` (no Locust code is
patched):

- no `Access-Control-*` header leaves the UI (a WSGI middleware around the app, since
  flask-cors's after_request hook runs after any of ours): its own page needs none;
- a request a browser marks as coming from another origin is refused with 403 before any view
  runs (`before_request`): an `Origin` header that is not the UI's own, or, with none,
  `Sec-Fetch-Site: cross-site` or `same-site` (a same-site request always comes from another
  origin: another port or scheme). The one exception is a top-level navigation to the UI's
  page (a link followed from elsewhere), which reads nothing back for the page it came from.
  A request with neither header (curl, scripts) is no browser's and goes through;
- the UI's own origin is the address the browser used (the Host header), and when the UI is
  bound to loopback (the default) that address must be a loopback one, so a page on a DNS name
  rebound to 127.0.0.1 is refused too. `localhost`, `127.0.0.1` and `[::1]` spellings of the
  same port count as one origin;
- the start form (`/swarm`) keeps only the fields Locust's page sends and dsv4bench's per-test
  settings: Locust copies any other field that names one of its options into them, so a field
  could replace the run's plan (`dsv4bench_plan`: run folder, metrics URLs) or Locust's own
  output paths. The others are dropped, and said once in the log and the dsv4bench tab.

Locust's master and workers talk over ZeroMQ, never through the web UI, so nothing here
touches them.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

from dsv4bench.report.escape import escape_text
from dsv4bench.locust.plan import UI_SETTINGS

log = logging.getLogger("dsv4bench.locust")

SWARM_ENDPOINT = "locust.swarm"
# What Locust's start form sends (its page, 2.x), besides the custom arguments it shows.
LOCUST_FORM_FIELDS = frozenset(
    {"user_count", "spawn_rate", "host", "run_time", "profile", "user_classes", "shape_class"}
)
FORM_FIELDS = LOCUST_FORM_FIELDS | frozenset(UI_SETTINGS)
SAFE_METHODS = frozenset({"GET", "HEAD"})
DEFAULT_PORTS = {"http": 80, "https": 443}
SEEN_LIMIT = 100  # distinct refusals logged; a hostile page that loops must not flood the log
WARNINGS_KEPT = 10  # UI warnings the dsv4bench tab shows, latest last


def is_loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _host_port(scheme: str, authority: str) -> tuple[str, int | None] | None:
    """(hostname, port) of `scheme://authority`, None when unreadable."""
    try:
        parts = urlsplit(f"{scheme}://{authority}")
        hostname, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not hostname or parts.path or parts.query or parts.username is not None:
        return None
    return hostname.rstrip(".").lower(), port or DEFAULT_PORTS.get(scheme)


def _origin(origin: str) -> tuple[str, str, int | None] | None:
    """(scheme, hostname, port) of an Origin header, None for `null` or anything unreadable."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or parts.path not in ("", "/") or parts.query:
        return None
    found = _host_port(parts.scheme, parts.netloc)
    return (parts.scheme, *found) if found is not None else None


def _same_host(a: str, b: str) -> bool:
    return a == b or (is_loopback(a) and is_loopback(b))


class RequestHeaders(Protocol):
    """What refusal reads of a request's headers: Flask's (werkzeug's Headers, no Mapping) or a dict."""

    def get(self, key: str) -> str | None: ...


def refusal(
    method: str,
    path: str,
    headers: RequestHeaders,
    scheme: str,
    host_header: str,
    bound_host: str,
    index_path: str = "/",
) -> str | None:
    """Why the UI refuses this request, or None. `host_header` is the address the browser used,
    `bound_host` the interface the UI listens on (`--web-host`), `index_path` the UI's page."""
    own = _host_port(scheme, host_header)
    if own is None:
        return "an unreadable Host header"
    if is_loopback(bound_host) and not is_loopback(own[0]):
        # A DNS name that points at 127.0.0.1 makes another site's page "same-origin" with us.
        return f"Host {own[0]} is not a loopback address, and the UI listens on loopback"
    origin, site = headers.get("Origin"), (headers.get("Sec-Fetch-Site") or "").strip().lower()
    foreign = None
    if origin is not None:
        theirs = _origin(origin.strip())
        if theirs is None or theirs[0] != scheme or theirs[2] != own[1] or not _same_host(theirs[1], own[0]):
            foreign = "a request from another origin"
    elif site in ("cross-site", "same-site"):
        foreign = f"a {site} request"
    if foreign is None:
        return None
    if (
        method in SAFE_METHODS
        and path == index_path
        and headers.get("Sec-Fetch-Mode") == "navigate"
        and headers.get("Sec-Fetch-Dest") == "document"
    ):
        return None  # a link to the UI followed from another page: the UI opens, nothing goes back
    return foreign


def _cut(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ignored_fields(names: Iterable[str]) -> list[str]:
    """The start form's fields that are dropped (module docstring), in their order, once each."""
    return list(dict.fromkeys(n for n in names if n not in FORM_FIELDS))


class StripCors:
    """WSGI middleware: no `Access-Control-*` header in any response (the UI's page is served
    from the same origin as its data and needs none; flask-cors would grant every origin)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            kept = [(k, v) for k, v in headers if not k.lower().startswith("access-control-")]
            return start_response(status, kept, exc_info)

        return self.app(environ, start)


class Guard:
    """The before_request hook and what it has told the operator (`warnings`, for the tab)."""

    def __init__(self, bound_host: str, base_path: str = "") -> None:
        self.bound_host = bound_host
        self.index_path = f"{base_path}/"
        self.warnings: list[str] = []
        self._seen: set[Any] = set()

    def _warn_once(self, key: Any, message: str) -> None:
        if key in self._seen or len(self._seen) >= SEEN_LIMIT:
            return
        self._seen.add(key)
        message = escape_text(message)  # a path or Origin is another site's text, bound for a terminal
        log.warning("dsv4bench: %s", message)
        self.warnings = [*self.warnings, message][-WARNINGS_KEPT:]

    def before_request(self) -> Any:
        from flask import Response, request
        from werkzeug.datastructures import ImmutableMultiDict

        why = refusal(
            request.method,
            request.path,
            request.headers,
            request.scheme,
            request.host,
            self.bound_host,
            self.index_path,
        )
        if why is not None:
            origin = request.headers.get("Origin")
            self._warn_once(
                ("refused", request.method, request.path, why, origin),
                f"refused {request.method} {_cut(request.path)}: {why} (Origin {_cut(origin or '-')}); "
                "the web UI answers only its own page",
            )
            response = Response(
                f"Forbidden: {why}. The dsv4bench web UI answers only its own page.\n",
                status=403,
                mimetype="text/plain",
            )
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["Cache-Control"] = "no-store"
            return response
        if request.endpoint == SWARM_ENDPOINT and request.method == "POST":
            dropped = ignored_fields(request.form.keys())
            if dropped:
                request.form = ImmutableMultiDict(
                    [(k, v) for k, v in request.form.items(multi=True) if k in FORM_FIELDS]
                )
                self._warn_once(
                    ("form", tuple(dropped)),
                    f"the start form's field(s) {_cut(', '.join(repr(n) for n in dropped))} were ignored: the run's "
                    "plan, where its files go and what it scrapes come only from the command line",
                )
        return None


def install(environment: Any) -> Guard:
    """The guard on Locust's web UI (from the locustfile's init, before the UI serves)."""
    web_ui = environment.web_ui
    base_path = (getattr(environment.parsed_options, "web_base_path", None) or "").rstrip("/")
    guard = Guard(str(getattr(web_ui, "host", "") or ""), base_path)
    web_ui.app.before_request(guard.before_request)
    web_ui.app.wsgi_app = StripCors(web_ui.app.wsgi_app)
    return guard
