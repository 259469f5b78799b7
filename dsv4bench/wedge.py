"""The wedge detector: after load stops, did every server drain, and does it still serve?

Pure: takes the monitor's metrics samples (see monitor.py), /health samples and canary results
(see canary.py) and returns per-endpoint findings. The incident it exists for: after an
80-session agent was killed, PD transfer/bootstrap queues sat at ~60 forever, new requests
hung, and `/health` still said 200.

Verdicts (the wedge family of codes.py):
- `queue_stuck`: a queue gauge is > 0 at the end of the drain window and has not decreased for
  at least `min_stuck_s` while no counter (`*_total`) moved: nothing is being worked on.
- `ghost_requests`: a running gauge stays > 0 (not decreasing) for `min_stuck_s` while the
  generation-token counter keeps rising after every client is gone: decoding for nobody.
- `canary_timeout`: the last canary request after the drain window got no answer in time. A
  canary that got an answer that is no completion (an HTTP error, HTML, non-JSON) or no
  connection is an error of the check: it goes into the finding's `check_errors` (and
  `details`), never into the codes.
- `health_lies`: that canary hung while the same server's latest `/health` answered 200; for a
  server that gets no canary (a prefill or decode server), its `/health_generate` hung while
  its `/health` answered 200.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .canary import OK, TIMEOUT, UNREACHABLE, canary_result, health_result
from .dialect import RUNNING, counters, generation_tokens, is_queue_gauge, metric_name

_NS = 1_000_000_000


@dataclass(frozen=True)
class WedgeConfig:
    """How long servers get to drain, and how long a flat gauge must stay flat to count."""

    drain_timeout_s: float = 30.0
    min_stuck_s: float = 5.0


def _origin(url: str) -> str:
    """Scheme + host + port: a /health root and a canary's /v1 base name the same server."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _finding() -> dict[str, Any]:
    return {"codes": [], "gauges": {}, "drain_s": None, "details": []}


def _in_flight(values: dict[str, float]) -> float:
    return sum(v for k, v in values.items() if is_queue_gauge(k))


def _flat_since(series: list[tuple[int, dict[str, float]]], key: str, counters_still: bool) -> int:
    """Index where the trailing run of samples begins over which `key` never decreased and
    (if `counters_still`) no counter changed, else the work in flight never shrank; the run
    ends at the last sample."""
    i = len(series) - 1
    while i > 0:
        prev, cur = series[i - 1][1], series[i][1]
        if cur.get(key, 0.0) < prev.get(key, 0.0):
            break
        # A running gauge held level by a shrinking queue behind it is a drain, not a ghost.
        if not counters_still and _in_flight(cur) < _in_flight(prev):
            break
        if counters_still and counters(cur) != counters(prev):
            break
        i -= 1
    return i


def _judge_metrics(endpoint: str, series: list[tuple[int, dict[str, float]]], load_stopped_ns: int,
                   cfg: WedgeConfig) -> dict[str, Any]:
    found = _finding()
    if not series:
        return found
    t_end, last = series[-1]
    found["gauges"] = {k: v for k, v in sorted(last.items()) if is_queue_gauge(k)}
    for t, values in series:
        if _in_flight(values) == 0:
            found["drain_s"] = round((t - load_stopped_ns) / _NS, 3)
            break
    codes: set[str] = set()
    for key, value in found["gauges"].items():
        if value <= 0:
            continue
        start = _flat_since(series, key, counters_still=True)
        flat_s = (t_end - series[start][0]) / _NS
        if flat_s >= cfg.min_stuck_s:
            codes.add("queue_stuck")
            found["details"].append(f"{key}={value:g} on {endpoint}, no progress for {flat_s:.1f} s")
            continue
        if metric_name(key) in RUNNING:
            # Running work that never shrinks while tokens are still produced: nobody is
            # listening (all clients are gone), so the server decodes for ghosts.
            start = _flat_since(series, key, counters_still=False)
            flat_s = (t_end - series[start][0]) / _NS
            gained = generation_tokens(last) - generation_tokens(series[start][1])
            if flat_s >= cfg.min_stuck_s and gained > 0:
                codes.add("ghost_requests")
                found["details"].append(f"{key}={value:g} on {endpoint} for {flat_s:.1f} s after load stop "
                                        f"while {gained:g} tokens were generated for no client")
    found["codes"] = sorted(codes)
    return found


def _latest(health: list[dict], origin: str, path: str) -> dict | None:
    """The latest probe of `path` (/health or /health_generate) on the server at `origin`."""
    same = [h for h in health
            if urlsplit(h["endpoint"]).path.rstrip("/").endswith(path) and _origin(h["endpoint"]) == origin]
    return max(same, key=lambda h: h["t_ns"]) if same else None


def _check_error(found: dict[str, Any], text: str) -> None:
    """A check that got an answer it cannot use: reported as what it is, never as a verdict."""
    found["details"].append(text)
    found.setdefault("check_errors", []).append(text)


def _judge_probes(out: dict[str, dict[str, Any]], health: list[dict], canaries: list[dict],
                  load_stopped_ns: int) -> None:
    after = [h for h in health if h.get("t_ns", 0) >= load_stopped_ns]
    for h in after:
        out.setdefault(h["endpoint"], _finding())
    last_canary: dict[str, dict] = {}
    for c in sorted((c for c in canaries if c.get("t_ns", 0) >= load_stopped_ns), key=lambda c: c["t_ns"]):
        last_canary[c["endpoint"]] = c
    for ep, c in last_canary.items():
        found = out.setdefault(ep, _finding())
        result = canary_result(c)
        if result == OK:
            continue
        if result != TIMEOUT:
            # An answer, even an error, is not a hang: no verdict on the server from it.
            what = "could not connect" if result == UNREACHABLE else "answered, but with no completion"
            _check_error(found, f"canary on {ep} {what}: {c.get('error') or 'no detail'} (not a hang)")
            continue
        codes = set(found["codes"]) | {"canary_timeout"}
        found["details"].append(f"canary on {ep} failed after {c.get('latency_s') or 0:.1f} s: "
                                f"{c.get('error') or 'no answer'}")
        # The latest /health of the same server decides: 200 then means it claims to be fine.
        h = _latest(after, _origin(ep), "/health")
        if h is not None and h.get("status") == 200:
            codes.add("health_lies")
            found["details"].append(f"{h['endpoint']} answered 200 while the canary on {ep} hung")
        found["codes"] = sorted(codes)
    # A server that gets no canary (a prefill or decode server takes no chat) generates only in
    # /health_generate: that one hanging while /health says 200 is the same lie.
    canaried = {_origin(ep) for ep in last_canary}
    for origin in sorted({_origin(h["endpoint"]) for h in after} - canaried):
        gen = _latest(after, origin, "/health_generate")
        h = _latest(after, origin, "/health")
        if gen is None or health_result(gen) != TIMEOUT or h is None or h.get("status") != 200:
            continue
        found = out.setdefault(gen["endpoint"], _finding())
        found["codes"] = sorted(set(found["codes"]) | {"health_lies"})
        found["details"].append(f"{h['endpoint']} answered 200 while {gen['endpoint']} hung "
                                f"({gen.get('error') or 'no answer'})")


def detect_wedge(samples: list[dict], load_stopped_ns: int, cfg: WedgeConfig,
                 health: list[dict] | None = None, canaries: list[dict] | None = None) -> dict[str, dict]:
    """Per-endpoint wedge findings: {"codes", "gauges", "drain_s", "details"}; codes [] is healthy."""
    window_end = load_stopped_ns + int(cfg.drain_timeout_s * _NS)
    by_endpoint: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for s in sorted(samples, key=lambda s: s.get("t_ns", 0)):
        by_endpoint.setdefault(s["endpoint"], [])
        # A failed scrape (endpoint down mid-window) carries no values: skip, never guess.
        if not s.get("ok") or not isinstance(s.get("values"), dict):
            continue
        if load_stopped_ns <= s["t_ns"] <= window_end:
            by_endpoint[s["endpoint"]].append((s["t_ns"], s["values"]))
    out = {ep: _judge_metrics(ep, series, load_stopped_ns, cfg) for ep, series in by_endpoint.items()}
    _judge_probes(out, health or [], canaries or [], load_stopped_ns)
    return out
