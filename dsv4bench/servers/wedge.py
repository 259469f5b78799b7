"""The wedge detector: after load stops, did every server drain, and does it still serve?

Pure: takes the monitor's metrics samples (`MetricSample`, see monitor.py), /health results and
canary results (`HealthResult`, `CanaryResult`, see canary.py) and returns a `WedgeFinding` per
endpoint, whose `as_dict()` is what run.json keeps. The incident it exists for: after an
80-session agent was killed, PD transfer/bootstrap queues sat at ~60 forever, new requests
hung, and `/health` still said 200.

Verdicts (the wedge family of codes.py):
- `queue_stuck`: a queue gauge is > 0 at the end of the drain window and has not decreased for
  at least `min_stuck_s` while no counter (`*_total`) moved: nothing is being worked on. A gauge
  still above zero that moved within its last `min_stuck_s` earns no code, only a detail line
  saying it was not judged: the window was too short to tell a wedge from a slow drain.
- `ghost_requests`: for at least `min_stuck_s` within the drain window, a running gauge stays
  > 0 and takes in no work (it never rises and no queue ahead of it shrinks) while tokens are
  generated. Every session has ended when the load stops, so that is decoding for nobody. It
  may fall meanwhile (ghosts end one by one at max_tokens), and it counts even when the ghosts
  ended before the window closed: a clean server aborts a gone client's request at once.
- `canary_timeout`: the last canary request after the drain window, streamed or not, got no
  answer in time, or its stream started (headers, even a first chunk) and was not ended. A
  canary that got an answer that is no completion (an HTTP error, HTML, non-JSON) or no
  connection is an error of the check: it goes into the finding's `check_errors` (and
  `details`), never into the codes.
- `health_lies`: that canary hung while the same server's latest `/health` answered 200; for a
  server that gets no canary (a prefill or decode server), its `/health_generate` hung, or
  answered 503 (the server saying it could not generate: SGLang's does so once its own probe
  times out, which a patient check sees), while its `/health` answered 200.

Failure counters that rose in the drain window (bootstrap or transfer failures, the router's
retries: dialect.failures) are evidence beside the codes, never a code: a failed transfer
that was retried is no wedge, but next to a stuck transfer queue it says where to look.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from dsv4bench.servers.canary import OK, TIMEOUT, UNREACHABLE, CanaryResult, HealthResult
from dsv4bench.servers.dialect import RUNNING, counters, failures, generation_tokens, is_queue_gauge, metric_name
from dsv4bench.servers.monitor import MetricSample

_NS = 1_000_000_000


@dataclass(frozen=True)
class WedgeConfig:
    """How long servers get to drain, and how long a flat gauge must stay flat to count."""

    drain_timeout_s: float = 30.0
    min_stuck_s: float = 5.0


@dataclass
class WedgeFinding:
    """One endpoint's verdict: its codes ([] is healthy), its queue gauges at the end of the
    drain window, when it drained (None: not within the window) and the evidence, one line each."""

    codes: list[str] = field(default_factory=list)
    gauges: dict[str, float] = field(default_factory=dict)
    drain_s: float | None = None
    details: list[str] = field(default_factory=list)
    # Checks that got an answer they cannot use: reported as what they are, also in `details`.
    check_errors: list[str] = field(default_factory=list)
    # The run's canary on this endpoint, for the report's canary column: set by run.py, not here.
    canary: CanaryResult | None = None

    def as_dict(self) -> dict[str, Any]:
        """The run.json record: `check_errors` only when there are some, `canary` only when set."""
        out: dict[str, Any] = {
            "codes": self.codes,
            "gauges": self.gauges,
            "drain_s": self.drain_s,
            "details": self.details,
        }
        if self.check_errors:
            out["check_errors"] = self.check_errors
        if self.canary is not None:
            c = self.canary
            out["canary"] = {
                "ok": c.ok,
                "result": c.result,
                "http_status": c.http_status,
                "latency_s": c.latency_s,
                "error": c.error,
            }
        return out


def _origin(url: str) -> str:
    """Scheme + host + port: a /health root and a canary's /v1 base name the same server."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _in_flight(values: dict[str, float]) -> float:
    return sum(v for k, v in values.items() if is_queue_gauge(k))


def _flat_since(series: list[tuple[int, dict[str, float]]], key: str) -> int:
    """Index where the trailing run of samples begins over which `key` never decreased and no
    counter changed; the run ends at the last sample."""
    i = len(series) - 1
    while i > 0:
        prev, cur = series[i - 1][1], series[i][1]
        if cur.get(key, 0.0) < prev.get(key, 0.0) or counters(cur) != counters(prev):
            break
        i -= 1
    return i


def _judge_gauge(
    endpoint: str, series: list[tuple[int, dict[str, float]]], key: str, cfg: WedgeConfig
) -> tuple[str, str] | None:
    """The queue_stuck a gauge above zero in the last sample earns, with its evidence line,
    or None while it may still be draining."""
    t_end, last = series[-1]
    flat_s = (t_end - series[_flat_since(series, key)][0]) / _NS
    if flat_s >= cfg.min_stuck_s:
        return "queue_stuck", f"{key}={last[key]:g} on {endpoint}, no progress for {flat_s:.1f} s"
    return None


def _took_work(prev: dict[str, float], cur: dict[str, float], key: str) -> bool:
    """Whether the running gauge `key` took in work between two scrapes: it rose, or a queue
    ahead of it shrank (a request admitted, or a slow drain moving on)."""
    return cur.get(key, 0.0) > prev.get(key, 0.0) or any(
        cur.get(k, 0.0) < v for k, v in prev.items() if k != key and is_queue_gauge(k)
    )


def _judge_ghosts(endpoint: str, series: list[tuple[int, dict[str, float]]], key: str, cfg: WedgeConfig) -> str | None:
    """The ghost_requests evidence line for the running gauge `key`, or None: its longest run
    of scrapes above zero that took in no work, if that run lasted `min_stuck_s` while tokens
    were generated."""
    best: tuple[float, float, float] | None = None  # seconds, tokens, the gauge at its start
    start: int | None = None
    for i, (t, cur) in enumerate(series):
        if cur.get(key, 0.0) <= 0:
            start = None
            continue
        if start is None or _took_work(series[i - 1][1], cur, key):
            start = i
            continue
        t0, first = series[start]
        span_s, gained = (t - t0) / _NS, generation_tokens(cur) - generation_tokens(first)
        if span_s >= cfg.min_stuck_s and gained > 0 and (best is None or span_s > best[0]):
            best = (span_s, gained, first[key])
    if best is None:
        return None
    span_s, gained, held = best
    now = series[-1][1].get(key, 0.0)
    return (
        f"{key}={held:g} on {endpoint} stayed above 0 for {span_s:.1f} s after load stop, taking in no work, "
        f"while {gained:g} tokens were generated for no client ({now:g} when the drain window closed)"
    )


def _held_gauges(values: dict[str, float]) -> list[str]:
    return [k for k, v in sorted(values.items()) if is_queue_gauge(k) and v > 0]


def _judge_metrics(
    endpoint: str, series: list[tuple[int, dict[str, float]]], load_stopped_ns: int, cfg: WedgeConfig
) -> WedgeFinding:
    found = WedgeFinding()
    if not series:
        return found
    last = series[-1][1]
    found.gauges = {k: v for k, v in sorted(last.items()) if is_queue_gauge(k)}
    for t, values in series:
        if _in_flight(values) == 0:
            found.drain_s = round((t - load_stopped_ns) / _NS, 3)
            break
    codes: set[str] = set()
    ghosts: set[str] = set()
    for key in sorted({k for _, values in series for k in values if metric_name(k) in RUNNING}):
        line = _judge_ghosts(endpoint, series, key, cfg)
        if line is not None:
            codes.add("ghost_requests")
            ghosts.add(key)
            found.details.append(line)
    for key in _held_gauges(last):
        judged = _judge_gauge(endpoint, series, key, cfg)
        if judged is not None:
            codes.add(judged[0])
            found.details.append(judged[1])
        elif key not in ghosts:  # no verdict either way: say so, so a CLEAN here reads as the short window it is
            found.details.append(
                f"{key}={last[key]:g} on {endpoint} when the drain window closed, but it had moved "
                f"in its last {cfg.min_stuck_s:g} s: neither drained nor stuck (a longer "
                "--drain-timeout would tell)"
            )
    found.codes = sorted(codes)
    rose = failures_rose(series[0][1], last)
    if rose:
        found.details.append(f"failures counted on {endpoint} after load stop: {', '.join(rose)}")
    return found


def failures_rose(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """`name +n` for each failure counter series that rose from one scrape to a later one (a
    counter that fell was reset by a restart: no count)."""
    was = failures(before)
    return [f"{k} +{v - was.get(k, 0.0):g}" for k, v in sorted(failures(after).items()) if v > was.get(k, 0.0)]


def _latest(health: list[HealthResult], origin: str, path: str) -> HealthResult | None:
    """The latest probe of `path` (/health or /health_generate) on the server at `origin`."""
    same = [h for h in health if urlsplit(h.endpoint).path.rstrip("/").endswith(path) and _origin(h.endpoint) == origin]
    return max(same, key=lambda h: h.t_ns) if same else None


def _check_error(found: WedgeFinding, text: str) -> None:
    """A check that got an answer it cannot use: reported as what it is, never as a verdict."""
    found.details.append(text)
    found.check_errors.append(text)


def _judge_probes(
    out: dict[str, WedgeFinding], health: list[HealthResult], canaries: list[CanaryResult], load_stopped_ns: int
) -> None:
    after = [h for h in health if h.t_ns >= load_stopped_ns]
    for probed in after:
        out.setdefault(probed.endpoint, WedgeFinding())
    # The latest canary of each way (streamed, not streamed) per endpoint: either hanging is the hang.
    last: dict[tuple[str, bool], CanaryResult] = {}
    for c in sorted((c for c in canaries if c.t_ns >= load_stopped_ns), key=lambda c: c.t_ns):
        last[(c.endpoint, c.stream)] = c
    last_canary = {ep for ep, _ in last}
    for (ep, _), c in sorted(last.items()):
        found = out.setdefault(ep, WedgeFinding())
        if c.result == OK:
            continue
        how = "streamed canary" if c.stream else "canary"
        if c.result != TIMEOUT:
            # An answer, even an error, is not a hang: no verdict on the server from it.
            what = "could not connect" if c.result == UNREACHABLE else "answered, but with no completion"
            _check_error(found, f"{how} on {ep} {what}: {c.error or 'no detail'} (not a hang)")
            continue
        codes = set(found.codes) | {"canary_timeout"}
        found.details.append(f"{how} on {ep} failed after {c.latency_s:.1f} s: {c.error or 'no answer'}")
        # The latest /health of the same server decides: 200 then means it claims to be fine.
        h = _latest(after, _origin(ep), "/health")
        if h is not None and h.status == 200 and "health_lies" not in codes:
            codes.add("health_lies")
            found.details.append(f"{h.endpoint} answered 200 while the {how} on {ep} hung")
        found.codes = sorted(codes)
    # A server that gets no canary (a prefill or decode server takes no chat) generates only in
    # /health_generate: that one hanging while /health says 200 is the same lie.
    canaried = {_origin(ep) for ep in last_canary}
    for origin in sorted({_origin(h.endpoint) for h in after} - canaried):
        gen = _latest(after, origin, "/health_generate")
        h = _latest(after, origin, "/health")
        if gen is None or not (gen.result == TIMEOUT or gen.status == 503) or h is None or h.status != 200:
            continue
        found = out.setdefault(gen.endpoint, WedgeFinding())
        found.codes = sorted(set(found.codes) | {"health_lies"})
        how = f"hung ({gen.error or 'no answer'})" if gen.result == TIMEOUT else "answered 503"
        found.details.append(f"{h.endpoint} answered 200 while {gen.endpoint} {how}")


def detect_wedge(
    samples: list[MetricSample],
    load_stopped_ns: int,
    cfg: WedgeConfig,
    health: list[HealthResult] | None = None,
    canaries: list[CanaryResult] | None = None,
) -> dict[str, WedgeFinding]:
    """A finding per endpoint (per metrics endpoint, /health URL and canary base URL); codes [] is healthy."""
    window_end = load_stopped_ns + int(cfg.drain_timeout_s * _NS)
    by_endpoint: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for s in sorted(samples, key=lambda s: s.t_ns):
        by_endpoint.setdefault(s.endpoint, [])
        # A failed scrape (endpoint down mid-window) carries no values: skip, never guess.
        if not s.ok or s.values is None:
            continue
        if load_stopped_ns <= s.t_ns <= window_end:
            by_endpoint[s.endpoint].append((s.t_ns, s.values))
    out = {ep: _judge_metrics(ep, series, load_stopped_ns, cfg) for ep, series in by_endpoint.items()}
    _judge_probes(out, health or [], canaries or [], load_stopped_ns)
    return out
