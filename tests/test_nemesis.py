"""The nemesis's pure parts: the --kill spec language, the schedule (fake clock), picking."""

from __future__ import annotations

import random

import pytest

from dsv4bench.harness.config import ConfigError, RunConfig
from dsv4bench.harness.nemesis import KillSchedule, KillSpec, parse_duration, parse_kill_spec, pick
from dsv4bench.servers.preflight import root_of


@pytest.mark.parametrize(
    "text, want",
    [
        ("all@30s", KillSpec("all@30s", at=30.0)),
        ("all@500ms", KillSpec("all@500ms", at=0.5)),
        ("all@2m,restart", KillSpec("all@2m,restart", at=120.0, restart=True)),
        ("all@20s,abort", KillSpec("all@20s,abort", at=20.0, abort=True)),
        ("all@4,who=ttft", KillSpec("all@4,who=ttft", at=4.0, who="ttft")),
        ("frac=0.5/every=10s,who=ttft", KillSpec("frac=0.5/every=10s,who=ttft", frac=0.5, every=10.0, who="ttft")),
        (
            "frac=0.25/every=10s/from=20s/until=90s",
            KillSpec("frac=0.25/every=10s/from=20s/until=90s", frac=0.25, every=10.0, start=20.0, until=90.0),
        ),
        (
            "frac=1,every=1s,who=toolcall,restart,abort",
            KillSpec(
                "frac=1,every=1s,who=toolcall,restart,abort",
                frac=1.0,
                every=1.0,
                who="toolcall",
                restart=True,
                abort=True,
            ),
        ),
    ],
)
def test_good_specs(text: str, want: KillSpec) -> None:
    assert parse_kill_spec(text) == want


@pytest.mark.parametrize(
    "text, msg",
    [
        ("", "bad --kill spec '': empty spec (use e.g. all@30s or frac=0.25/every=10s)"),
        ("kill@3s", "bad --kill spec 'kill@3s': must start with all@TIME or frac=F, got 'kill@3s'"),
        ("all@soon", "bad --kill spec 'all@soon': bad duration 'soon' (use e.g. 30s, 500ms, 2m)"),
        ("all@-1s", "bad --kill spec 'all@-1s': bad duration '-1s' (use e.g. 30s, 500ms, 2m)"),
        ("frac=0/every=1s", "bad --kill spec 'frac=0/every=1s': frac must be a number in (0, 1], got '0'"),
        ("frac=x/every=1s", "bad --kill spec 'frac=x/every=1s': frac must be a number in (0, 1], got 'x'"),
        ("frac=0.5", "bad --kill spec 'frac=0.5': frac= needs every=DURATION"),
        ("frac=0.5/every=0s", "bad --kill spec 'frac=0.5/every=0s': every= must be positive"),
        (
            "frac=0.5/every=5s/from=20s/until=10s",
            "bad --kill spec 'frac=0.5/every=5s/from=20s/until=10s': until= is before the first kill",
        ),
        ("all@3s,every=1s", "bad --kill spec 'all@3s,every=1s': every= belongs to frac= kills, not all@"),
        ("all@3s,who=idle", "bad --kill spec 'all@3s,who=idle': who must be one of all, ttft, toolcall, got 'idle'"),
        ("all@3s,restart=yes", "bad --kill spec 'all@3s,restart=yes': restart takes no value"),
        ("all@3s,who=ttft,who=all", "bad --kill spec 'all@3s,who=ttft,who=all': who given twice"),
        ("all@3s,,abort", "bad --kill spec 'all@3s,,abort': empty item"),
        (
            "all@3s,nuke",
            "bad --kill spec 'all@3s,nuke': unknown item 'nuke' (known: every=, from=, until=, who=, restart, abort)",
        ),
    ],
)
def test_bad_specs(text: str, msg: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_kill_spec(text)
    assert str(e.value) == msg
    assert "\n" not in str(e.value)


def test_durations() -> None:
    assert parse_duration("7") == 7.0 and parse_duration("1.5s") == 1.5 and parse_duration("250ms") == 0.25


def test_stops_load_only_for_plain_kill_all() -> None:
    assert parse_kill_spec("all@3s").stops_load
    assert not parse_kill_spec("all@3s,restart").stops_load
    assert not parse_kill_spec("all@3s,who=ttft").stops_load
    assert not parse_kill_spec("frac=1/every=3s").stops_load


def test_schedule_one_shot() -> None:
    spec = parse_kill_spec("all@30s")
    sched = KillSchedule([spec])
    assert sched.next_at() == 30.0
    assert sched.due(29.9) == []
    assert sched.due(30.0) == [spec]
    assert sched.due(31.0) == [] and sched.next_at() is None


def test_schedule_periodic_with_window() -> None:
    spec = parse_kill_spec("frac=0.25/every=10s/from=20s/until=45s")
    sched = KillSchedule([spec])
    fired = [t for t in range(0, 100) if sched.due(float(t))]
    assert fired == [20, 30, 40]
    assert sched.next_at() is None


def test_schedule_periodic_default_start_and_clock_jump() -> None:
    sched = KillSchedule([parse_kill_spec("frac=0.5/every=10s")])
    assert sched.due(9.99) == []
    assert len(sched.due(10.0)) == 1
    assert len(sched.due(45.0)) == 1  # 20, 30 and 40 were jumped over: one kill, not three
    assert sched.next_at() == 50.0


def test_schedule_combines_specs() -> None:
    a, b = parse_kill_spec("all@5s,restart"), parse_kill_spec("frac=0.5/every=2s")
    sched = KillSchedule([a, b])
    assert sched.due(2.0) == [b]
    assert sched.due(5.0) == [a, b]  # b's 4 s kill is due too (and 6 s is not yet)
    assert sched.next_at() == 6.0


def test_pick() -> None:
    ids = [f"s{i:05d}" for i in range(10)]
    assert pick(ids, 1.0, random.Random(0)) == sorted(ids)
    got = pick(ids, 0.25, random.Random(0))
    assert len(got) == 3 and set(got) <= set(ids)
    assert got == pick(ids, 0.25, random.Random(0))  # seeded
    assert pick([], 0.5, random.Random(0)) == []
    assert len(pick(ids[:1], 0.01, random.Random(0))) == 1


def test_root_of() -> None:
    assert root_of("http://h:1/v1") == "http://h:1"
    assert root_of("http://h:1/v1/") == "http://h:1"


def test_config_rejects_bad_spec() -> None:
    with pytest.raises(ConfigError, match="bad --kill spec 'all@x'"):
        RunConfig(url="http://h/v1", duration=5, kill=("all@3s", "all@x"))
    with pytest.raises(ConfigError, match="drain-timeout"):
        RunConfig(url="http://h/v1", duration=5, drain_timeout=-1)
    assert RunConfig(url="http://h/v1", duration=5, kill=("all@3s",)).to_json()["kill"] == ["all@3s"]


def test_a_kill_landing_after_the_last_byte_still_kills_the_turn() -> None:
    """The turn finished before the cancel could catch anything: the killed agent never acts on
    the reply, so the turn is recorded killed, with its response and its own end time kept."""
    from dsv4bench.wire.turn_answer import TurnOutcome, TurnProbe
    from dsv4bench.harness.driver import _killed_outcome
    from dsv4bench.harness.nemesis import Slot
    from dsv4bench.history.records import AssembledResponse, Timings, TurnStatus

    done = TurnOutcome(
        status=TurnStatus.OK,
        timings=Timings(start_wall_ns=1, start_ns=10, end_ns=99),
        response=AssembledResponse(content="all done"),
    )
    slot = Slot("s00001", killed_by=parse_kill_spec("all@4s"))
    out = _killed_outcome(done, TurnProbe(), slot)
    assert out.status is TurnStatus.KILLED and "all@4s" in (out.error or "")
    assert out.response is not None and out.response.content == "all done"
    assert out.timings.end_ns == 99
