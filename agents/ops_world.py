"""The ops family's virtual fleet: services, their logs and metric series, and one fault.

The clock is part of the world: it starts at a seeded instant and moves only when a tool
changes something (a restart takes two minutes), so every result is a function of the
seed and the calls made, never of wall time.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from .base import Steps, run_steps

SERVICES = (
    "api-gateway",
    "auth",
    "checkout",
    "payments",
    "inventory",
    "search",
    "catalog",
    "notifications",
    "cart",
    "user-profile",
    "recommendations",
    "shipping",
)
TEAMS = ("platform", "commerce", "identity", "growth", "fulfilment")
METRICS = {
    "error_rate": "%",
    "latency_p99_ms": "ms",
    "cpu_percent": "%",
    "memory_mb": "MB",
    "requests_per_second": "req/s",
}
LEVELS = ("debug", "info", "warn", "error")
FAULTS = ("memory_leak", "traffic_spike", "bad_deploy", "dependency")
HISTORY = 120  # minutes of logs and metrics before "now"
LogLine = tuple[int, int, str, str, str]  # (minute, second, level, pod, message)

_ROUTINE = (
    "GET /v1/{r} 200 {ms}ms",
    "POST /v1/{r} 201 {ms}ms",
    "health check ok ({ms}ms)",
    "cache refresh completed in {ms}ms",
    "processed batch of {n} events",
    "connection pool: {n}/64 in use",
    "GET /v1/{r}/{n} 200 {ms}ms",
    "config watch: no changes",
)
_ROUTES = ("items", "orders", "sessions", "users", "quotes", "carts", "charges", "events")


def _version(rng: random.Random) -> tuple[str, str]:
    major, minor, patch = rng.randint(1, 4), rng.randint(0, 19), rng.randint(1, 9)
    return f"v{major}.{minor}.{patch}", f"v{major}.{minor}.{patch - 1}"


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Fleet:
    """Services with logs (as (minute, second, level, pod, message)) and per-minute metric series."""

    def __init__(self, rng: random.Random) -> None:
        run_steps(self._generate(rng))

    @classmethod
    def in_steps(cls, rng: random.Random) -> Steps[Fleet]:
        """The fleet `Fleet(rng)` gives, built in steps of ~0.2 ms: the ~3 ms of a whole fleet in one
        piece held the driver's loop that long (ScenarioFamily.build_world_steps)."""
        fleet = cls.__new__(cls)  # filled by the steps, as __init__ fills it
        yield from fleet._generate(rng)
        return fleet

    def _generate(self, rng: random.Random) -> Steps[None]:
        """The fleet's build, paused after each service's logs and after each one's metric series.
        A pause draws nothing, so the draws run in one order whether the build pauses or not."""
        self.rng = rng
        self.start = datetime(2024, 3, 1, 6, 0) + timedelta(days=rng.randint(0, 90), minutes=rng.randint(0, 720))
        self.elapsed = 0  # minutes the world's clock moved since the session began
        names = rng.sample(SERVICES, 7)
        self.services: dict[str, dict[str, Any]] = {}
        for i, name in enumerate(names):
            version, previous = _version(rng)
            later = names[i + 1 :]
            self.services[name] = {
                "name": name,
                "status": "healthy",
                "version": version,
                "history": [previous],
                "replicas": rng.randint(2, 6),
                "team": rng.choice(TEAMS),
                "depends_on": sorted(rng.sample(later, min(len(later), rng.randint(1, 2)))) if later else [],
                "deployed_minutes_ago": rng.randint(HISTORY + 60, 60 * 24 * 9),
                "restarts": 0,
                "fault": None,
                "pod": f"{name}-{rng.randrange(16**4):04x}",
            }
        # NOTE: a log line is a tuple, not a list: the collector stops tracking a tuple of plain
        # values, so a fleet's ~500 lines cost a full collection nothing (at 2,000 sessions
        # those lists were over a million objects a full collection walked while the loop waited)
        self.logs: dict[str, list[LogLine]] = {}
        for n in names:
            self.logs[n] = self._routine_logs(n)
            yield
        self.metrics: dict[str, dict[str, list[float]]] = {}
        for n in names:
            self.metrics[n] = self._baseline(n)
            yield
        self.incidents: list[dict[str, Any]] = []
        self.symptom, self.root = self._plant_fault()

    @property
    def now(self) -> datetime:
        return self.start + timedelta(minutes=self.elapsed)

    def state(self) -> Any:
        return {
            "services": self.services,
            "logs": self.logs,
            "metrics": self.metrics,
            "incidents": self.incidents,
            "elapsed": self.elapsed,
        }

    # --- generation --------------------------------------------------------------------

    def _routine_logs(self, name: str) -> list[LogLine]:
        rng, logs = self.rng, []
        minute = -HISTORY
        while minute < 0:
            msg = rng.choice(_ROUTINE).format(r=rng.choice(_ROUTES), ms=rng.randint(3, 180), n=rng.randint(2, 60))
            level = "info"
            if rng.random() < 0.06:
                level, msg = "warn", f"slow request: GET /v1/{rng.choice(_ROUTES)} took {rng.randint(900, 1900)}ms"
            elif rng.random() < 0.015:
                level, msg = "error", f"transient: retrying publish to event bus (attempt {rng.randint(1, 2)})"
            elif rng.random() < 0.2:
                level, msg = "debug", f"gc pause {rng.randint(1, 40)}ms"
            logs.append((minute, rng.randint(0, 59), level, f"{self.services[name]['pod']}-{rng.randint(0, 2)}", msg))
            minute += rng.choice((1, 1, 2, 3))
        return logs

    def _baseline(self, name: str) -> dict[str, list[float]]:
        rng = self.rng
        base = {
            "error_rate": rng.uniform(0.1, 0.8),
            "latency_p99_ms": rng.uniform(80, 320),
            "cpu_percent": rng.uniform(18, 45),
            "memory_mb": rng.uniform(400, 900),
            "requests_per_second": rng.uniform(40, 400),
        }
        self.services[name]["baseline"] = {k: round(v, 2) for k, v in base.items()}
        return {k: [round(v * rng.uniform(0.9, 1.1), 2) for _ in range(HISTORY)] for k, v in base.items()}

    def log(self, name: str, minute: float, level: str, msg: str) -> None:
        pod = f"{self.services[name]['pod']}-{self.rng.randint(0, 2)}"
        self.logs[name].append((int(minute // 1), self.rng.randint(0, 59), level, pod, msg))

    def _plant_fault(self) -> tuple[str, str]:
        rng = self.rng
        kind = rng.choice(FAULTS)
        with_deps = [n for n, s in self.services.items() if s["depends_on"]]
        symptom = rng.choice(with_deps if kind == "dependency" else list(self.services))
        root = rng.choice(self.services[symptom]["depends_on"]) if kind == "dependency" else symptom
        onset = rng.randint(8, 25)
        fault: dict[str, Any] = {"kind": kind, "onset_minutes": onset, "peak_error_rate": round(rng.uniform(6, 35), 1)}
        svc = self.services[root]
        if kind == "traffic_spike":
            fault["needed"] = svc["replicas"] * 2 + rng.randint(0, 2)
        if kind == "bad_deploy":
            good = svc["version"]
            major, minor, _ = good[1:].split(".")
            bad = f"v{major}.{int(minor) + 1}.0"
            svc["history"].append(good)
            svc["version"], svc["deployed_minutes_ago"] = bad, onset
            fault["bad_version"], fault["good_version"] = bad, good
            self.log(root, -onset, "info", f"deploy: rolled out {bad} (previous {good}) by ci-bot")
        svc["fault"] = fault
        self.services[symptom]["status"] = svc["status"] = "degraded"
        for m in range(-onset, 0):
            for k in range(3):
                # NOTE: every minute carries the telling line (variant 0), so any window shows it
                self._fault_line(symptom, root, fault, m + rng.random(), 0 if k == 0 else rng.randrange(3))
            self._fault_metrics(symptom, root, fault, HISTORY + m, (m + onset) / onset)
        for logs in self.logs.values():
            logs.sort(key=lambda line: (line[0], line[1]))
        return symptom, root

    def _fault_line(self, symptom: str, root: str, fault: dict[str, Any], minute: float, variant: int) -> None:
        rng, kind, svc = self.rng, fault["kind"], self.services[root]
        route = rng.choice(_ROUTES)
        if kind == "memory_leak":
            pct = min(99, 80 + int(20 * (minute + fault["onset_minutes"]) / fault["onset_minutes"]))
            options = (
                ("error", f"POST /v1/{route} failed: 503 Service Unavailable (worker OOM-killed, restarting)"),
                ("warn", f"heap usage at {pct}% of container limit (RSS {int(20.48 * pct)} MB / 2048 MB)"),
                ("error", f"OutOfMemoryError: cannot allocate {rng.randint(2, 64)} MiB for session cache"),
            )
        elif kind == "traffic_spike":
            options = (
                (
                    "warn",
                    f"autoscaler: desired replicas {fault['needed']} exceeds max_replicas "
                    f"{svc['replicas']} (HPA capped)",
                ),
                ("warn", f"request queue at {rng.randint(430, 512)}/512, p99 latency {rng.randint(1800, 4200)}ms"),
                ("error", f"rejecting GET /v1/{route}: queue full (512/512)"),
            )
        elif kind == "bad_deploy":
            options = (
                (
                    "error",
                    f"unhandled KeyError: 'currency_code' in handler POST /v1/{route} (version {fault['bad_version']})",
                ),
                ("error", f"POST /v1/{route} 500 Internal Server Error ({rng.randint(5, 40)}ms)"),
                ("warn", "schema mismatch: field 'currency_code' missing in upstream payload"),
            )
        else:
            self.log(
                root,
                minute,
                *(
                    (
                        "warn",
                        f"watchdog: {rng.randint(12, 16)}/16 worker threads blocked on lock 'conn-pool' for "
                        f"{rng.randint(30, 600)}s",
                    ),
                    ("error", "deadlock detected: workers waiting on lock 'conn-pool' held by worker-7"),
                    ("warn", f"health probe slow: {rng.uniform(3, 9):.1f}s"),
                )[variant],
            )
            options = (
                ("error", f"upstream {root} timed out after 2000ms (POST /v1/{route})"),
                ("warn", f"circuit breaker for {root} is half-open ({rng.randint(3, 9)} failures in 30s)"),
                ("error", f"GET /v1/{route} 502 Bad Gateway: upstream {root} unavailable"),
            )
        self.log(symptom, minute, *options[variant])

    def _fault_metrics(self, symptom: str, root: str, fault: dict[str, Any], i: int, progress: float) -> None:
        rng, peak = self.rng, fault["peak_error_rate"]
        sym, rt = self.metrics[symptom], self.metrics[root]
        sym["error_rate"][i] = round(peak * min(1.0, 0.4 + progress) * rng.uniform(0.85, 1.05), 2)
        kind = fault["kind"]
        if kind == "memory_leak":
            rt["memory_mb"][i] = round(1400 + 620 * progress + rng.uniform(-15, 15), 2)
        elif kind == "traffic_spike":
            rt["requests_per_second"][i] = round(rt["requests_per_second"][i] * rng.uniform(2.4, 2.8), 2)
            rt["latency_p99_ms"][i] = round(rng.uniform(1800, 4200), 2)
            rt["cpu_percent"][i] = round(rng.uniform(92, 99), 2)
        elif kind == "dependency":
            rt["latency_p99_ms"][i] = round(rng.uniform(4500, 9000), 2)
            rt["cpu_percent"][i] = round(rng.uniform(2, 6), 2)
            sym["latency_p99_ms"][i] = round(rng.uniform(1900, 2100), 2)

    # --- effects of remediation ----------------------------------------------------------

    def advance(self, minutes: int, recovered: set[str]) -> None:
        """Move the clock; services in `recovered` get baseline samples, the rest repeat their last."""
        for _ in range(minutes):
            self.elapsed += 1
            for name, series in self.metrics.items():
                base = self.services[name]["baseline"]
                for k, values in series.items():
                    values.append(round(base[k] * self.rng.uniform(0.9, 1.1), 2) if name in recovered else values[-1])
                self.log(
                    name,
                    self.elapsed,
                    "info",
                    "health check ok"
                    if name in recovered
                    else f"GET /v1/{self.rng.choice(_ROUTES)} 200 {self.rng.randint(3, 180)}ms",
                )

    def clear_fault(self, root: str) -> set[str]:
        """Mark the fault fixed; the symptom service recovers with its root cause."""
        self.services[root]["fault"] = None
        healed = {root, self.symptom}
        for name in healed:
            self.services[name]["status"] = "healthy"
        return healed
