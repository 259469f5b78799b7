"""The nemesis: kill storms on a schedule (`dsv4bench agents --kill SPEC`, repeatable).

A kill does what a killed agent process does to the server: the HTTP connection of each
killed session's in-flight request drops mid-request (before the first token, or mid-stream).
The killed turn is recorded `killed` (indeterminate, never corruption) and the session ends
with reason `killed`, or, with `restart`, starts again from scratch as a relaunched agent.

Spec language (one `--kill` flag per spec; several flags combine)::

    spec     := trigger ("," | "/") item ...
    trigger  := "all@" DURATION                 kill once, at t = DURATION after the run start
              | "frac=" FLOAT                   kill this share (0 < F <= 1) of the targets,
                                                with every=DURATION (required), from=, until=
    item     := "every=" DURATION               period of a frac kill
              | "from=" DURATION                first frac kill (default: one period in)
              | "until=" DURATION               no frac kill after this time (default: never)
              | "who=" ("all" | "ttft" | "toolcall")
                    all      every live session (the default)
                    ttft     only sessions whose request waits for its first token
                    toolcall only sessions whose response is streaming a tool call
              | "restart"                       killed sessions restart at once: same task and
                                                seed, session id `<id>.r<attempt>` (s00012.r1)
              | "abort"                         also POST {"rid": id} to <server root>/abort_request
                                                for each killed request whose id is known
    DURATION := NUMBER ["ms" | "s" | "m"]       seconds when no unit is given

Examples: `all@30s`, `all@30s,restart`, `frac=0.5/every=10s,who=ttft`, `all@20s,abort`,
`frac=0.25/every=10s/from=20s/until=90s`. A frac kill fires at from, from+every, ... while
<= until; a clock that jumped over several periods fires once. An `all@T` kill with who=all
and no restart stops the load: no session starts after it. Sessions are picked for a frac
kill with a seeded RNG (ceil(F * targets) of them), so a seed replays the same storm.

The parser, the schedule and `pick` are pure; `Nemesis` is the small impure executor the
driver runs beside the sessions (it cancels the turns' scopes and writes the `kill` events),
and `abort_requests` is the best-effort HTTP call made for `abort`.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from dsv4bench.wire.turn_answer import TurnProbe
from dsv4bench.servers.preflight import root_of

WHO_CHOICES = ("all", "ttft", "toolcall")
_DURATION = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(ms|s|m)?$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


@dataclass(frozen=True)
class KillSpec:
    """One parsed --kill spec. `at` is set for a one-shot kill, `frac`/`every` for a periodic one."""

    text: str
    at: float | None = None
    frac: float = 1.0
    every: float | None = None
    start: float | None = None  # from=
    until: float | None = None
    who: str = "all"
    restart: bool = False
    abort: bool = False

    @property
    def stops_load(self) -> bool:
        """A kill-all without restart ends the run's load: nothing starts after it."""
        return self.at is not None and self.who == "all" and not self.restart


def parse_duration(text: str) -> float:
    """`30s` -> 30.0, `500ms` -> 0.5, `2m` -> 120.0, `7` -> 7.0; ValueError otherwise."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"bad duration {text!r} (use e.g. 30s, 500ms, 2m)")
    return float(m.group(1)) * _UNIT[m.group(2)]


def parse_kill_spec(text: str) -> KillSpec:
    """Parse one --kill spec; ValueError with a one-line message for a bad one."""
    try:
        return _parse(text)
    except ValueError as e:
        raise ValueError(f"bad --kill spec {text!r}: {e}") from None


def _parse(text: str) -> KillSpec:
    items = [p.strip() for p in re.split(r"[,/]", text.strip())]
    if not items or not items[0]:
        raise ValueError("empty spec (use e.g. all@30s or frac=0.25/every=10s)")
    if any(not p for p in items):
        raise ValueError("empty item")
    head, rest = items[0], items[1:]
    kw: dict = {"text": text.strip()}
    if head.startswith("all@"):
        kw["at"] = parse_duration(head[4:])
    elif head.startswith("frac="):
        try:
            frac = float(head[5:])
        except ValueError:
            raise ValueError(f"frac must be a number in (0, 1], got {head[5:]!r}") from None
        if not 0 < frac <= 1:
            raise ValueError(f"frac must be a number in (0, 1], got {head[5:]!r}")
        kw["frac"] = frac
    else:
        raise ValueError(f"must start with all@TIME or frac=F, got {head!r}")
    seen: set[str] = set()
    for item in rest:
        key, _, value = item.partition("=")
        if key in seen:
            raise ValueError(f"{key} given twice")
        seen.add(key)
        if key in ("restart", "abort"):
            if value:
                raise ValueError(f"{key} takes no value")
            kw[key] = True
        elif key == "who":
            if value not in WHO_CHOICES:
                raise ValueError(f"who must be one of {', '.join(WHO_CHOICES)}, got {value!r}")
            kw["who"] = value
        elif key in ("every", "from", "until"):
            if "at" in kw:
                raise ValueError(f"{key}= belongs to frac= kills, not all@")
            kw["start" if key == "from" else key] = parse_duration(value)
        else:
            raise ValueError(f"unknown item {item!r} (known: every=, from=, until=, who=, restart, abort)")
    if "frac" in kw:
        if kw.get("every") is None:
            raise ValueError("frac= needs every=DURATION")
        if kw["every"] <= 0:
            raise ValueError("every= must be positive")
        if kw.get("until") is not None and kw["until"] < kw.get("start", kw["every"]):
            raise ValueError("until= is before the first kill")
    return KillSpec(**kw)


@dataclass
class KillSchedule:
    """Which specs are due at a given elapsed time (seconds since the run started). Pure."""

    specs: Sequence[KillSpec]
    _next: list[float | None] = field(init=False)

    def __post_init__(self) -> None:
        self._next = [s.at if s.at is not None else (s.start if s.start is not None else s.every) for s in self.specs]

    def due(self, elapsed: float) -> list[KillSpec]:
        """The specs that fire now; each fires at most once per call, and each time only once."""
        out: list[KillSpec] = []
        for i, spec in enumerate(self.specs):
            t = self._next[i]
            if t is None or elapsed < t:
                continue
            if spec.until is not None and t > spec.until:
                self._next[i] = None
                continue
            out.append(spec)
            if spec.at is not None or spec.every is None:
                self._next[i] = None
            else:  # skip the periods the clock jumped over
                periods = math.floor((elapsed - t) / spec.every) + 1
                self._next[i] = t + periods * spec.every
        return out

    def next_at(self) -> float | None:
        """The elapsed time of the next kill, or None when nothing is left to fire."""
        left = [
            t
            for t, spec in zip(self._next, self.specs)  # one each (__post_init__)
            if t is not None and (spec.until is None or t <= spec.until)
        ]
        return min(left) if left else None


def pick(candidates: Iterable[str], frac: float, rng: random.Random) -> list[str]:
    """ceil(frac * n) of the candidates (all of them at frac=1), in a seeded, sorted order."""
    pool = sorted(candidates)
    if frac >= 1:
        return pool
    k = min(len(pool), math.ceil(frac * len(pool)))
    return sorted(rng.sample(pool, k))


async def abort_requests(
    client: httpx.AsyncClient, base_url: str, rids: Iterable[str], timeout: float = 5.0
) -> dict[str, int | str]:
    """Best-effort POST /abort_request per request id; returns {rid: HTTP status or error name}."""
    url = f"{root_of(base_url)}/abort_request"
    result: dict[str, int | str] = {}
    for rid in rids:
        try:
            r = await client.post(url, json={"rid": rid}, timeout=timeout)
            result[rid] = r.status_code
        except httpx.HTTPError as e:
            result[rid] = type(e).__name__
    return result


@dataclass
class Slot:
    """A live session as the nemesis sees it: the cancel scope and probe of its in-flight turn."""

    session_id: str
    scope: anyio.CancelScope | None = None
    probe: TurnProbe | None = None
    killed_by: KillSpec | None = None  # set when the nemesis killed it

    def matches(self, who: str) -> bool:
        """Is this session a target of `who`? ttft/toolcall need a turn in flight in that phase."""
        if who == "all":
            return True
        return (
            self.scope is not None
            and self.probe is not None
            and self.probe.phase == ("waiting" if who == "ttft" else "toolcall")
        )


class Nemesis:
    """Fires the kills of a schedule against the driver's live sessions (`slots`)."""

    def __init__(
        self, specs: Sequence[KillSpec], seed: int, event: Callable[..., None], client: httpx.AsyncClient, base_url: str
    ) -> None:
        self.schedule = KillSchedule(specs)
        self.rng = random.Random(seed)
        self.event = event
        self.client = client
        self.base_url = base_url
        self.slots: dict[str, Slot] = {}
        self.load_stopped = False

    async def run(self, started: float, tick: float = 0.05) -> None:
        """Until cancelled: sleep to the next due kill (`started` is the run's anyio clock start)."""
        while (nxt := self.schedule.next_at()) is not None:
            await anyio.sleep(max(tick, nxt - (anyio.current_time() - started)))
            for spec in self.schedule.due(anyio.current_time() - started):
                await self.fire(spec)

    async def fire(self, spec: KillSpec) -> list[str]:
        """Kill the spec's targets now: cancel their in-flight turns, write the kill event."""
        if spec.stops_load:
            self.load_stopped = True  # before any await: no session starts after a kill-all
        targets = pick(
            [sid for sid, s in self.slots.items() if s.killed_by is None and s.matches(spec.who)], spec.frac, self.rng
        )
        rids: list[str] = []
        for sid in targets:
            slot = self.slots[sid]
            slot.killed_by = spec
            if slot.scope is not None:
                asm = slot.probe.assembler if slot.probe else None
                if asm is not None and asm.response.response_id:
                    rids.append(asm.response.response_id)
                slot.scope.cancel()  # closes the stream: the connection drops like a dead process's
        fields: dict[str, Any] = {
            "spec": spec.text,
            "sessions": targets,
            "who": spec.who,
            "abort": spec.abort,
            "restart": spec.restart,
        }
        self.event("kill", **fields)
        if spec.abort:
            # NOTE: shielded: a kill-all ends the load, and the driver then cancels the nemesis;
            # the aborts it owes the server must still go out and be recorded.
            with anyio.CancelScope(shield=True):
                results = await abort_requests(self.client, self.base_url, rids)
            self.event("abort_request", spec=spec.text, results=results)
        return targets
