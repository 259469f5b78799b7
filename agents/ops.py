"""The ops family: diagnose a degraded service from logs and metrics, remediate, open an incident."""

from __future__ import annotations

import random
import re
from datetime import timedelta
from math import fsum
from typing import Any

from .base import Observation, ScenarioFamily, Step, Steps, Task, ToolAction, ToolError, ToolSpec, World
from .ops_world import LEVELS, METRICS, Fleet, stamp
from .toolkit import ToolWorld, call, first_match, follow_plan, is_error, obj, successes, table

_SERVICE = {"type": "string", "minLength": 1, "description": "Service name as list_services shows it."}

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "list_services",
        "List the services with status, version, replicas and current health numbers.",
        obj(
            {
                "status": {"type": "string", "enum": ["any", "healthy", "degraded"]},
                "include_dependencies": {"type": "boolean"},
            }
        ),
    ),
    ToolSpec(
        "get_logs",
        "Read a service's recent log lines at or above a level, oldest first.",
        obj(
            {
                "service": _SERVICE,
                "level": {"type": "string", "enum": list(LEVELS), "description": "Minimum level to include."},
                "since_minutes": {"type": "integer", "minimum": 1, "maximum": 240},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 200,
                    "description": "Most recent lines to return.",
                },
                "contains": {"type": "string", "description": "Only lines containing this text (case-insensitive)."},
            },
            ["service", "level"],
        ),
    ),
    ToolSpec(
        "get_metrics",
        "Per-minute samples of one metric of a service, with a summary.",
        obj(
            {
                "service": _SERVICE,
                "metric": {"type": "string", "enum": list(METRICS)},
                "window_minutes": {"type": "integer", "minimum": 5, "maximum": 120},
            },
            ["service", "metric"],
        ),
    ),
    ToolSpec(
        "restart_service",
        "Rolling-restart all pods of a service.",
        obj(
            {
                "service": _SERVICE,
                "reason": {"type": "string", "minLength": 3},
                "force": {"type": "boolean", "description": "Kill pods that do not drain within 30 s."},
            },
            ["service", "reason"],
        ),
    ),
    ToolSpec(
        "scale_service",
        "Set the number of replicas of a service.",
        obj(
            {
                "service": _SERVICE,
                "replicas": {"type": "integer", "minimum": 1, "maximum": 20},
                "reason": {"type": "string"},
            },
            ["service", "replicas"],
        ),
    ),
    ToolSpec(
        "rollback_service",
        "Redeploy a previous version of a service.",
        obj(
            {
                "service": _SERVICE,
                "version": {"type": "string", "pattern": r"^v\d+\.\d+\.\d+$"},
            },
            ["service", "version"],
        ),
    ),
    ToolSpec(
        "open_incident",
        "Open an incident record for the on-call channel.",
        obj(
            {
                "title": {"type": "string", "minLength": 5},
                "severity": {"type": "string", "enum": ["sev1", "sev2", "sev3"]},
                "affected_services": {"type": "array", "minItems": 1, "uniqueItems": True, "items": _SERVICE},
                "summary": {"type": "string", "minLength": 10},
                "remediation": obj(
                    {
                        "action": {"type": "string", "enum": ["restart", "scale", "rollback", "none"]},
                        "service": _SERVICE,
                    },
                    ["action"],
                ),
            },
            ["title", "severity", "affected_services", "summary"],
        ),
    ),
)


class OpsWorld(ToolWorld):
    """A virtual fleet of services; see `Fleet` for how it is generated and how time moves."""

    tools = TOOLS

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def state(self) -> Any:
        return self.fleet.state()

    def service(self, name: str) -> dict[str, Any]:
        if name not in self.fleet.services:
            raise ToolError(f"no such service: {name!r}; services: {', '.join(self.fleet.services)}")
        return self.fleet.services[name]

    def tool_list_services(self, status: str = "any", include_dependencies: bool = True) -> str:
        f = self.fleet
        rows = []
        for s in f.services.values():
            if status != "any" and s["status"] != status:
                continue
            m = f.metrics[s["name"]]
            row = [s["name"], s["status"], s["version"], s["replicas"], s["team"]]
            row += [", ".join(s["depends_on"]) or "-"] if include_dependencies else []
            row += [f"{s['deployed_minutes_ago'] + f.elapsed} min ago", m["error_rate"][-1], m["latency_p99_ms"][-1]]
            rows.append(row)
        head = ["service", "status", "version", "replicas", "team"] + (["depends on"] if include_dependencies else [])
        head += ["last deploy", "errors %", "p99 ms"]
        return f"{len(rows)} services (status {status}) at {stamp(f.now)}:\n" + table(head, rows)

    def tool_get_logs(
        self, service: str, level: str, since_minutes: int = 30, limit: int = 50, contains: str = ""
    ) -> str:
        self.service(service)
        f, floor = self.fleet, LEVELS.index(level)
        lines = [
            ln
            for ln in f.logs[service]
            if ln[0] >= f.elapsed - since_minutes and LEVELS.index(ln[2]) >= floor and contains.lower() in ln[4].lower()
        ]
        shown = lines[-limit:]
        cond = f", containing {contains!r}" if contains else ""
        head = (
            f"Logs of {service}, level >= {level}, last {since_minutes} min{cond}: {len(lines)} lines, "
            f"showing the last {len(shown)}"
        )
        body = [
            f"{stamp(f.start + timedelta(minutes=ln[0], seconds=ln[1]))} {ln[2].upper():<5} {ln[3]}  {ln[4]}"
            for ln in shown
        ]
        return "\n".join([head, *body]) if body else head + "\n(no lines)"

    def tool_get_metrics(self, service: str, metric: str, window_minutes: int = 30) -> str:
        self.service(service)
        f = self.fleet
        values = f.metrics[service][metric][-window_minutes:]
        first = f.now - timedelta(minutes=len(values) - 1)
        body = [f"{(first + timedelta(minutes=i)).strftime('%H:%M')}  {v:>9.2f}" for i, v in enumerate(values)]
        summary = (
            f"summary: min {min(values):.2f}, max {max(values):.2f}, mean {fsum(values) / len(values):.2f}, "
            f"last {values[-1]:.2f}"
        )
        return "\n".join(
            [f"{metric} ({METRICS[metric]}) of {service}, last {len(values)} min, 1-min samples:", *body, summary]
        )

    def tool_restart_service(self, service: str, reason: str, force: bool = False) -> str:
        s, f = self.service(service), self.fleet
        fault = s["fault"]
        f.log(service, f.elapsed, "info", f"restart requested (force={force}): {reason}")
        if fault and fault["kind"] == "dependency" and not force:
            f.log(service, f.elapsed, "warn", "graceful shutdown timed out: workers blocked on lock 'conn-pool'")
            f.advance(1, set())
            return (
                f"Restart of {service} aborted: graceful drain timed out after 30s with 14 requests stuck on "
                "blocked workers; no pod was replaced. Retry with force=true to kill the workers."
            )
        s["restarts"] += 1
        healed = f.clear_fault(service) if fault and fault["kind"] in ("memory_leak", "dependency") else set()
        f.advance(2, healed)
        after = f.metrics[service]["error_rate"][-1]
        verdict = "the fault cleared" if healed else "the error rate did not change"
        return (
            f"Restarted {service}: {s['replicas']} of {s['replicas']} pods replaced (force={force}). "
            f"Readiness probes passing. Error rate now {after:.2f}%: {verdict}."
        )

    def tool_scale_service(self, service: str, replicas: int, reason: str = "") -> str:
        s, f = self.service(service), self.fleet
        before, s["replicas"] = s["replicas"], replicas
        fault = s["fault"]
        healed = (
            f.clear_fault(service)
            if fault and fault["kind"] == "traffic_spike" and replicas >= fault["needed"]
            else set()
        )
        f.log(service, f.elapsed, "info", f"scaled from {before} to {replicas} replicas: {reason or 'manual'}")
        f.advance(2, healed)
        tail = "queue drained, latency back to normal" if healed else "no change in error rate"
        return (
            f"Scaled {service} from {before} to {replicas} replicas; {replicas} ready. "
            f"Error rate now {f.metrics[service]['error_rate'][-1]:.2f}%: {tail}."
        )

    def tool_rollback_service(self, service: str, version: str) -> str:
        s, f = self.service(service), self.fleet
        if version == s["version"]:
            raise ToolError(f"{service} already runs {version}")
        if version not in s["history"]:
            raise ToolError(f"{service} was never deployed at {version}; known versions: {', '.join(s['history'])}")
        bad, s["version"], s["deployed_minutes_ago"] = s["version"], version, -f.elapsed
        fault = s["fault"]
        healed = f.clear_fault(service) if fault and fault["kind"] == "bad_deploy" else set()
        f.log(service, f.elapsed, "info", f"deploy: rolled back {bad} -> {version}")
        f.advance(2, healed)
        return (
            f"Rolled back {service} from {bad} to {version}; {s['replicas']} pods updated. "
            f"Error rate now {f.metrics[service]['error_rate'][-1]:.2f}%."
        )

    def tool_open_incident(
        self,
        title: str,
        severity: str,
        affected_services: list[str],
        summary: str,
        remediation: dict[str, str] | None = None,
    ) -> str:
        for name in affected_services:
            self.service(name)
        if remediation and "service" in remediation:
            self.service(remediation["service"])
        f = self.fleet
        inc = {
            "id": f"INC-{4100 + len(f.incidents) + 1}",
            "title": title,
            "severity": severity,
            "affected_services": affected_services,
            "summary": summary,
            "remediation": remediation,
            "opened_at": stamp(f.now),
        }
        f.incidents.append(inc)
        return (
            f"Incident {inc['id']} opened at {inc['opened_at']} ({severity}): {title}\n"
            f"affected: {', '.join(affected_services)}\nsummary: {summary}"
        )


# --- tasks -------------------------------------------------------------------------

GENERIC = (
    "Service `{symptom}` has elevated error rates since ~{onset} minutes ago. Find the cause and remediate, then "
    "open an incident.",
    "Alert: {symptom} 5xx ratio above SLO for about {onset} minutes. Investigate the root cause, fix it, and "
    "open an incident with the right severity.",
    "On-call handoff: {symptom} started failing roughly {onset} minutes ago and nobody has looked yet. Please "
    "diagnose, remediate, and file an incident.",
)
SPECIFIC = {
    "memory_leak": "Users see intermittent 503s from {symptom} since about {onset} minutes ago. Figure out what is "
    "going on, remediate it and open an incident.",
    "traffic_spike": "{symptom} is slow and timing out for ~{onset} minutes; its error rate is climbing. Find the "
    "cause, mitigate, and open an incident.",
    "bad_deploy": "{symptom} has been returning 500s for the last ~{onset} minutes. Find out why, restore service, "
    "and open an incident.",
    "dependency": "Requests through {symptom} have been failing with timeouts for ~{onset} minutes. Find the root "
    "cause (it may not be {symptom} itself), remediate, and open an incident.",
}
CAUSES = {
    "memory_leak": "memory leak: workers OOM-killed",
    "traffic_spike": "traffic spike: request queue full, autoscaler capped",
    "bad_deploy": "bad deploy: KeyError 'currency_code' in the new version",
    "dependency": "deadlock: worker threads blocked on lock 'conn-pool'",
}

SYSTEM_PROMPT = (
    "You are the on-call site reliability engineer. Use the tools to inspect services, logs and metrics. "
    "Establish the root cause before acting (the alerting service may only be a victim of a dependency), "
    "choose the least disruptive remediation that addresses it, verify recovery in the metrics, then open an "
    "incident naming every affected service. Finish with a short summary: cause, action, current state."
)


class OpsFamily(ScenarioFamily):
    """Ops/incident agent on virtual services: find the faulty service, remediate, open an incident."""

    name = "ops"
    description = "Diagnose a degraded service from logs and metrics, remediate it and open an incident."
    system_prompt = SYSTEM_PROMPT
    tools = TOOLS

    def build_world(self, seed: int) -> OpsWorld:
        return OpsWorld(Fleet(random.Random(f"ops-world:{seed}")))

    def build_world_steps(self, seed: int) -> Steps[OpsWorld]:
        fleet = yield from Fleet.in_steps(random.Random(f"ops-world:{seed}"))
        return OpsWorld(fleet)

    def make_task(self, world: World, seed: int) -> Task:
        assert isinstance(world, OpsWorld)
        rng = random.Random(f"ops-task:{seed}")
        f = world.fleet
        fault = f.services[f.root]["fault"]
        goal = {
            "kind": fault["kind"],
            "symptom": f.symptom,
            "root": f.root,
            "onset": fault["onset_minutes"],
            "severity": "sev1" if fault["peak_error_rate"] >= 20 else "sev2",
            "cause": CAUSES[fault["kind"]],
        }
        prompt = rng.choice((*GENERIC, SPECIFIC[fault["kind"]])).format(**goal)
        return Task(self.name, seed, prompt, goal)

    def expert_step(self, task: Task, seen: list[Observation]) -> Step:
        return follow_plan(task, seen, _STAGES, _finish)

    def solved(self, task: Task, world: World) -> bool:
        """Whether the faulty service was remediated and an incident names it."""
        assert isinstance(world, OpsWorld)
        f, root = world.fleet, task.goal["root"]
        return f.services[root]["fault"] is None and any(root in i["affected_services"] for i in f.incidents)


# --- the expert ----------------------------------------------------------------------


def _root(t: Task, s: list[Observation]) -> str:
    """The service at fault: the upstream the victim's logs blame, or the victim itself."""
    if t.goal["kind"] != "dependency":
        return t.goal["symptom"]
    m = first_match(s, "get_logs", r"upstream ([a-z][a-z-]*) (?:timed out|unavailable)")
    return m.group(1) if m else t.goal["root"]


def _investigate(t: Task, s: list[Observation]) -> list[ToolAction] | None:
    kind, svc = t.goal["kind"], t.goal["symptom"]
    if kind == "memory_leak":
        return [call("get_metrics", service=svc, metric="memory_mb", window_minutes=90)]
    if kind == "traffic_spike":
        return [call("get_metrics", service=svc, metric="requests_per_second", window_minutes=90)]
    if kind == "bad_deploy":
        return [call("get_logs", service=svc, level="info", since_minutes=90, limit=20, contains="deploy")]
    return [call("get_logs", service=_root(t, s), level="warn", since_minutes=60, limit=80)]


def _remediate(t: Task, s: list[Observation]) -> list[ToolAction] | None:
    kind, root = t.goal["kind"], _root(t, s)
    if kind == "traffic_spike":
        m = first_match(s, "get_logs", r"desired replicas (\d+) exceeds")
        return [call("scale_service", service=root, replicas=int(m.group(1)), reason=CAUSES[kind])] if m else None
    if kind == "bad_deploy":
        m = first_match(s, "get_logs", r"rolled out v[\d.]+ \(previous (v\d+\.\d+\.\d+)\)")
        return [call("rollback_service", service=root, version=m.group(1))] if m else None
    return [call("restart_service", service=root, reason=CAUSES[kind], force=kind == "dependency")]


def _action(t: Task, s: list[Observation]) -> dict[str, str]:
    done = [
        o
        for o in s
        if o.action.name in ("restart_service", "scale_service", "rollback_service") and not is_error(o.result)
    ]
    names = {"restart_service": "restart", "scale_service": "scale", "rollback_service": "rollback"}
    if not done:
        return {"action": "none"}
    return {"action": names[done[-1].action.name], "service": str(done[-1].action.arguments.get("service"))}


def _peak(t: Task, s: list[Observation]) -> str:
    """The victim's peak error rate, as its first error_rate series showed it."""
    for o in successes(s, "get_metrics"):
        m = re.search(r"max (\d+\.\d+)", o.result)
        args = o.action.arguments
        if m and args.get("metric") == "error_rate" and args.get("service") == t.goal["symptom"]:
            return m.group(1)
    return "?"


def _incident(t: Task, s: list[Observation]) -> list[ToolAction] | None:
    g, root = t.goal, _root(t, s)
    affected = [g["symptom"]] + ([root] if root != g["symptom"] else [])
    act = _action(t, s)
    summary = (
        f"{g['symptom']} error rate peaked at {_peak(t, s)}% starting ~{g['onset']} min before the alert. "
        f"Root cause in {root}: {g['cause']}. Remediation: {act['action']} of {act.get('service', '-')}."
    )
    return [
        call(
            "open_incident",
            title=f"{g['symptom']} errors: {g['cause'].split(':')[0]} in {root}",
            severity=g["severity"],
            affected_services=affected,
            summary=summary,
            remediation=act,
        )
    ]


_STAGES = (
    lambda t, s: [call("list_services", status="any", include_dependencies=True)],
    lambda t, s: [call("get_logs", service=t.goal["symptom"], level="warn", since_minutes=60, limit=100)],
    lambda t, s: [call("get_metrics", service=t.goal["symptom"], metric="error_rate", window_minutes=90)],
    _investigate,
    lambda t, s: [call("get_metrics", service=_root(t, s), metric="latency_p99_ms", window_minutes=60)],
    _remediate,
    lambda t, s: [call("list_services", status="any", include_dependencies=True)],
    lambda t, s: [call("get_metrics", service=t.goal["symptom"], metric="error_rate", window_minutes=10)],
    _incident,
)


def _finish(task: Task, seen: list[Observation]) -> str:
    g, act = task.goal, _action(task, seen)
    inc = first_match(seen, "open_incident", r"Incident (INC-\d+) opened")
    where = f"Opened {inc.group(1)} ({g['severity']})." if inc else "The incident could not be opened."
    if act["action"] == "none":
        return f"I could not remediate {g['symptom']}; suspected cause: {g['cause']}. {where}"
    return (
        f"Root cause: {g['cause']} in {_root(task, seen)}. Remediation: {act['action']} of {act['service']}; "
        f"{g['symptom']} is recovering. {where}"
    )
