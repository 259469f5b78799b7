"""Load shapes for `dsv4bench locust --shape SPEC`, instead of Locust's --users/--spawn-rate.

Spec language (durations as `--kill` reads them: 30s, 500ms, 2m, seconds when bare)::

    spec  := name ":" field ("," field)*
    field := key "=" value

    ramp:users=N,rate=R,duration=D
        N users, started R a second from the start, held until D; then the test stops.
    step:users=N,step=K,every=D,duration=D[,rate=R]
        K users at the start and K more at each `every`, up to N, until `duration`.
    spike:users=N,peak=P,at=T,hold=H,duration=D[,rate=R]
        N users; from T to T+H, P users (P > N); then N again until `duration`.
    kill-storm:users=N[,rate=R][,at=T][,duration=D]
        N users under the kill schedule of the `--kill` specs (below); with no --kill, the
        incident: every user is stopped at `at` (default 20s, when the load is long up), which
        ends the test.

`rate` is how many users a second Locust starts, or stops, when the count changes (Locust's
spawn rate). Its default makes each change land within a second: `step` for step, `peak` for
spike, `users` for kill-storm; ramp must say it, being the point of a ramp.

Every drop in the user count stops users abruptly (Locust's stop_timeout 0): each one stopped
mid-turn drops its connection as a killed agent does, and its turn is recorded `killed`. That
is also how a test ends, at `duration` or when a stop is asked for. Locust picks which users
stop; it does not replay a seeded pick as `agents --kill` does.

A kill storm takes the `--kill` specs of `dsv4bench agents` (nemesis.py), within what Locust's
users can do:

- `all@T` stops every user at T and ends the test; the wedge check then runs as after any stop.
  Several all@ kills: the first ends it.
- `frac=F/every=S[/from=T][/until=T]` drops ceil(F * N) of the N users at each period (from=,
  default one period in; none after until=) for DROP_S, one of Locust's ticks with room for a
  late one, and Locust brings the count back at `rate`. That is `agents`' `restart` (which may
  be given, and changes nothing), except that a user brought back plays a new session, not the
  killed one again. Periods shorter than MIN_EVERY_S are refused: the users would not be back
  before the next kill. Drops of several frac kills at the same time add up.
- refused, with the reason: `who=ttft` and `who=toolcall` (Locust stops users by count, blind to
  the phase of their turn), `abort` (a stopped user only drops its connection), `restart` on
  an all@ kill (an all@ kill ends the test).

A storm whose kills are all frac= ends at `duration`, which it must then give; with an all@
kill, `duration` may only come after it, and `at` belongs to a storm without --kill.

Examples: `ramp:users=80,rate=10,duration=60s`, `step:users=80,step=10,every=10s,duration=120s`,
`spike:users=10,peak=80,at=30s,hold=10s,duration=90s`, `kill-storm:users=80` (all stopped at
20 s), `kill-storm:users=24 --kill frac=0.5/every=3s/from=3s --kill all@12s`.

Locust samples a shape's `tick()` about once a second (LoadTestShape); each tick here is a pure
function of the run time it reads from `get_run_time()`, so a shape can be tested on a fake
clock.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dsv4bench.harness.config import ConfigError
from dsv4bench.harness.nemesis import KillSpec, parse_duration, parse_kill_spec

SHAPE_ENV = "DSV4BENCH_SHAPE"
KILL_ENV = "DSV4BENCH_KILL"

# How long a frac kill keeps its users down. Locust samples a shape about once a second, later
# when its loop is busy: a window of exactly one second could fall between two samples.
DROP_S = 1.5
# The shortest frac period: the drop, then a sample that brings the users back, before the next.
MIN_EVERY_S = 3.0
INCIDENT_AT_S = 20.0  # the kill-all of a kill storm without --kill (the incident's recipe: all@20s)

Tick = tuple[int, float] | None  # (user count, spawn rate), or None: the test stops


class ShapePlan(Protocol):
    """A shape's whole schedule: what Locust's tick() answers at run time `t`, and nothing else."""

    def tick(self, t: float) -> Tick: ...


# ---- the shapes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ramp:
    users: int
    rate: float
    duration: float

    def tick(self, t: float) -> Tick:
        return (self.users, self.rate) if t < self.duration else None


@dataclass(frozen=True)
class Step:
    users: int
    step: int
    every: float
    duration: float
    rate: float

    def tick(self, t: float) -> Tick:
        if t >= self.duration:
            return None
        return min(self.users, self.step * (math.floor(t / self.every) + 1)), self.rate


@dataclass(frozen=True)
class Spike:
    users: int
    peak: int
    at: float
    hold: float
    duration: float
    rate: float

    def tick(self, t: float) -> Tick:
        if t >= self.duration:
            return None
        return (self.peak if self.at <= t < self.at + self.hold else self.users), self.rate


@dataclass(frozen=True)
class Drop:
    """One frac kill as a Locust shape plays it: `users` down for DROP_S at each period."""

    users: int
    first: float
    every: float
    until: float | None

    def active(self, t: float) -> bool:
        n = math.floor((t - self.first) / self.every)
        if n < 0:
            return False
        kill_at = self.first + n * self.every
        return (self.until is None or kill_at <= self.until) and t - kill_at < DROP_S


@dataclass(frozen=True)
class KillStorm:
    users: int
    rate: float
    end: float  # the first all@ kill, or duration=: the test stops
    drops: tuple[Drop, ...] = ()

    def tick(self, t: float) -> Tick:
        if t >= self.end:
            return None
        down = min(self.users, sum(d.users for d in self.drops if d.active(t)))
        if down:
            # Locust's dispatcher moves at most `rate` users a second: at a lower rate the drop
            # would stop them one batch a second instead of at once.
            return self.users - down, float(max(self.rate, down))
        return self.users, self.rate

    def kills(self) -> list[tuple[float, int]]:
        """When the storm's frac drops stop users, and how many, in order, for the history's
        `kill` events (the report's timeline marks them); its end stops every user."""
        out = []
        for d in self.drops:
            n = 0
            while (at := d.first + n * d.every) < self.end and (d.until is None or at <= d.until):
                out.append((at, d.users))
                n += 1
        return sorted(out)


# ---- the spec language ----------------------------------------------------------------------------


class _Fields:
    """The key=value fields of one spec, read by kind; each problem a one-line ConfigError."""

    def __init__(self, spec: str, name: str, allowed: tuple[str, ...], text: str) -> None:
        self.spec, self.name = spec, name
        self.values: dict[str, str] = {}
        for item in text.split(",") if text.strip() else []:
            key, eq, value = (p.strip() for p in item.partition("="))
            if not eq or not key or not value:
                raise self.error(f"{item.strip()!r} is not key=value")
            if key not in allowed:
                raise self.error(f"{name} takes {', '.join(k + '=' for k in allowed)} not {key}=")
            if key in self.values:
                raise self.error(f"{key}= given twice")
            self.values[key] = value

    def error(self, problem: str) -> ConfigError:
        return ConfigError(f"bad --shape {self.spec!r}: {problem}")

    def given(self, key: str) -> bool:
        return key in self.values

    def _text(self, key: str, default: float | None, what: str) -> str | None:
        """The field's text; None when it is not given and has a default."""
        if key in self.values:
            return self.values[key]
        if default is None:
            raise self.error(f"{self.name} needs {key}={what}")
        return None

    def whole(self, key: str) -> int:
        text = self._text(key, None, "N")
        assert text is not None  # no default: _text raised instead
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise self.error(f"{key}= must be a whole number >= 1, got {text!r}")
        return value

    def rate(self, default: float | None = None) -> float:
        text = self._text("rate", default, "R (users started a second)")
        if text is None:
            assert default is not None  # _text gives None only where a default stands in
            return default
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise self.error(f"rate= must be a positive number of users a second, got {text!r}")
        return value

    def duration(self, key: str, default: float | None = None, positive: bool = True) -> float:
        text = self._text(key, default, "DURATION (e.g. 30s)")
        if text is None:
            assert default is not None  # _text gives None only where a default stands in
            return default
        try:
            value = parse_duration(text)
        except ValueError as e:
            raise self.error(f"{key}=: {e}") from None
        if positive and value <= 0:
            raise self.error(f"{key}= must be longer than 0, got {text!r}")
        return value


def _ramp(f: _Fields, _kills: tuple[KillSpec, ...]) -> Ramp:
    return Ramp(f.whole("users"), f.rate(), f.duration("duration"))


def _step(f: _Fields, _kills: tuple[KillSpec, ...]) -> Step:
    users, step = f.whole("users"), f.whole("step")
    if step > users:
        raise f.error(f"step={step} is more than users={users}")
    return Step(users, step, f.duration("every"), f.duration("duration"), f.rate(float(step)))


def _spike(f: _Fields, _kills: tuple[KillSpec, ...]) -> Spike:
    users, peak = f.whole("users"), f.whole("peak")
    if peak <= users:
        raise f.error(f"peak={peak} must be more than users={users}")
    at, hold, duration = f.duration("at", positive=False), f.duration("hold"), f.duration("duration")
    if at + hold > duration:
        raise f.error(
            f"the spike (at={f.values['at']} plus hold={f.values['hold']}) ends after duration={f.values['duration']}"
        )
    return Spike(users, peak, at, hold, duration, f.rate(float(peak)))


def _kill_storm(f: _Fields, kills: tuple[KillSpec, ...]) -> KillStorm:
    users = f.whole("users")
    rate = f.rate(float(users))
    if kills and f.given("at"):
        raise f.error(
            f"at= is the kill-all of a storm without --kill; with --kill, give it there (--kill all@{f.values['at']})"
        )
    if kills:
        kill_alls = [(f"--kill {k.text!r}", k.at) for k in kills if k.at is not None]
    else:
        kill_alls = [(f"the kill-all at={f.values.get('at', f'{INCIDENT_AT_S:g}s')}", f.duration("at", INCIDENT_AT_S))]
    duration = f.duration("duration") if f.given("duration") else None
    if duration is None and not kill_alls:
        raise f.error("a storm of frac= kills alone needs duration= (or an all@ kill) to end")
    for what, at in kill_alls:
        if duration is not None and at >= duration:
            raise f.error(f"{what} comes at or after duration={f.values['duration']}: it would never fire")
    end = min([at for _, at in kill_alls] + ([duration] if duration is not None else []))
    drops = []
    for k in kills:
        if k.at is not None or k.every is None:  # a kill-all (a frac kill always has its every=)
            continue
        drop = Drop(math.ceil(k.frac * users), k.start if k.start is not None else k.every, k.every, k.until)
        if drop.first >= end:
            raise f.error(f"--kill {k.text!r} first kills at {drop.first:g}s, after the storm ended at {end:g}s")
        drops.append(drop)
    return KillStorm(users, rate, end, tuple(drops))


# name -> (its fields, what reads them)
SHAPES: dict[str, tuple[tuple[str, ...], Callable[[_Fields, tuple[KillSpec, ...]], ShapePlan]]] = {
    "ramp": (("users", "rate", "duration"), _ramp),
    "step": (("users", "step", "every", "duration", "rate"), _step),
    "spike": (("users", "peak", "at", "hold", "duration", "rate"), _spike),
    "kill-storm": (("users", "rate", "at", "duration"), _kill_storm),
}


def _locust_kill(text: str) -> KillSpec:
    """One --kill spec as a Locust kill storm can play it (module docstring), else ConfigError."""
    try:
        k = parse_kill_spec(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    where = f"bad --kill {k.text!r} with --shape"
    if k.who != "all":
        raise ConfigError(
            f"{where}: who={k.who} cannot work: Locust stops users by count, blind to the phase "
            "of their turn (use `dsv4bench agents` for it)"
        )
    if k.abort:
        raise ConfigError(
            f"{where}: abort cannot work: a stopped Locust user only drops its connection, "
            "nothing calls /abort_request (use `dsv4bench agents` for it)"
        )
    if k.at is not None and k.restart:
        raise ConfigError(
            f"{where}: restart cannot work on an all@ kill, which ends a Locust test; "
            "frac=1/every=S stops every user and brings them back"
        )
    if k.every is not None and k.every < MIN_EVERY_S:
        raise ConfigError(
            f"{where}: every= must be at least {MIN_EVERY_S:g}s: Locust samples a shape about "
            f"once a second and a kill keeps its users down {DROP_S:g}s"
        )
    return k


def parse_shape(spec: str, kill: tuple[str, ...] = ()) -> ShapePlan:
    """The plan of one --shape spec, with the --kill specs it takes; ConfigError, one line
    naming the bad part, when it cannot work."""
    name, _, text = spec.strip().partition(":")
    if not name:
        raise ConfigError("bad --shape: empty (use e.g. ramp:users=80,rate=10,duration=60s)")
    if name not in SHAPES:
        raise ConfigError(f"bad --shape {spec!r}: unknown shape {name!r} (shapes: {', '.join(SHAPES)})")
    if kill and name != "kill-storm":
        raise ConfigError(f"--kill needs --shape kill-storm:..., not {name}")
    allowed, read = SHAPES[name]
    return read(_Fields(spec, name, allowed, text), tuple(_locust_kill(k) for k in kill))


def check_shape(spec: str | None, kill: tuple[str, ...]) -> None:
    """ConfigError when `spec` (or the kill specs it takes) cannot work."""
    if spec is None:
        if kill:
            raise ConfigError("--kill needs --shape kill-storm:... (its kill schedule)")
        return
    parse_shape(spec, kill)


def shape_class(spec: str, kill: tuple[str, ...] = ()) -> type[Any]:
    """A LoadTestShape class of its own that plays `spec` (ConfigError as parse_shape): Locust
    makes its shape from the class, with no arguments."""
    # NOTE: imported here, not with the module: importing locust monkey-patches the whole process
    # for gevent, and the CLI, which never runs gevent, imports this module for check_shape.
    from locust import LoadTestShape

    plan = parse_shape(spec, kill)

    def tick(self: LoadTestShape) -> Tick:
        return plan.tick(self.get_run_time())  # the class's `plan`

    name = "".join(part.capitalize() for part in spec.strip().partition(":")[0].split("-")) + "Shape"
    return type(
        name,
        (LoadTestShape,),
        {"plan": plan, "tick": tick, "abstract": False, "__module__": __name__, "__doc__": f"--shape {spec.strip()}"},
    )


def selected_shape() -> type[Any] | None:
    """The LoadTestShape class `--shape` chose, or None (Locust's own --users/--spawn-rate)."""
    spec = os.environ.get(SHAPE_ENV)
    if not spec:
        return None
    kill = tuple(line for line in os.environ.get(KILL_ENV, "").splitlines() if line.strip())
    return shape_class(spec, kill)
