"""The load shapes of `dsv4bench locust --shape`: each shape's ticks on a fake clock, every spec
that cannot work refused in one line naming its bad part, and kill storms against the bundled
PD engine: a WEDGE with the planted abort-leak, CLEAN without it."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys

import pytest

from dsv4bench.harness.config import ConfigError
from dsv4bench.history.run_folder import read_history
from dsv4bench.locust.shapes import DROP_S, KILL_ENV, MIN_EVERY_S, SHAPE_ENV, check_shape, parse_shape

from .conftest import ROOT, only_run_dir, run_cli
from .locust_stats import assert_stats_match_history

# NOTE: a mark, not importorskip: importing Locust would patch this whole pytest process for
# gevent, and the spec language needs no Locust.
needs_locust = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="Locust is not installed (pip install 'dsv4bench[locust]')"
)


def ticks(spec: str, times: list[float], kill: tuple[str, ...] = ()) -> list:
    """What the shape's tick says at each run time. The plan is the tick of the Locust class
    (test_the_locust_shape_class_ticks_its_plan_on_the_run_time_it_reads), read here without
    Locust, whose import would monkey-patch this test process for gevent."""
    plan = parse_shape(spec, kill)
    return [plan.tick(t) for t in times]


# ---- the shapes on a fake clock ---------------------------------------------------------------------


def test_ramp_holds_its_users_at_locusts_spawn_rate_until_the_duration():
    assert ticks("ramp:users=80,rate=10,duration=60s", [0, 7.9, 59.99, 60, 61]) == [
        (80, 10.0),
        (80, 10.0),
        (80, 10.0),
        None,
        None,
    ]


def test_step_adds_a_step_each_period_up_to_the_users():
    assert ticks("step:users=80,step=10,every=10s,duration=120s", [0, 9.99, 10, 35, 69.9, 70, 119.9, 120]) == [
        (10, 10.0),
        (10, 10.0),
        (20, 10.0),
        (40, 10.0),
        (70, 10.0),
        (80, 10.0),
        (80, 10.0),
        None,
    ]
    assert ticks("step:users=25,step=10,every=5s,duration=1m,rate=2", [0, 5, 10, 59]) == [
        (10, 2.0),
        (20, 2.0),
        (25, 2.0),
        (25, 2.0),
    ]


def test_spike_goes_to_its_peak_for_the_hold_and_back():
    assert ticks("spike:users=10,peak=80,at=30s,hold=10s,duration=90s", [0, 29.9, 30, 39.9, 40, 89.9, 90]) == [
        (10, 80.0),
        (10, 80.0),
        (80, 80.0),
        (80, 80.0),
        (10, 80.0),
        (10, 80.0),
        None,
    ]
    assert ticks("spike:users=2,peak=4,at=0,hold=500ms,duration=1s,rate=1", [0, 0.5, 1]) == [(4, 1.0), (2, 1.0), None]


def test_kill_storm_without_kill_is_the_incident_a_kill_all_at_its_at():
    assert ticks("kill-storm:users=80", [0, 19.9, 20]) == [(80, 80.0), (80, 80.0), None]
    assert ticks("kill-storm:users=80,rate=10,at=12s", [0, 11.9, 12]) == [(80, 10.0), (80, 10.0), None]


def test_kill_storm_frac_kills_drop_users_for_a_tick_and_bring_them_back():
    kill = ("frac=0.25/every=5s/from=10s/until=20s", "all@30s")
    times = [0, 9.9, 10, 10 + DROP_S - 0.01, 10 + DROP_S, 15, 20, 20 + DROP_S, 25, 29.9, 30]
    assert ticks("kill-storm:users=80,rate=10", times, kill) == [
        (80, 10.0),
        (80, 10.0),
        (60, 20.0),
        (60, 20.0),
        (80, 10.0),
        (60, 20.0),
        (60, 20.0),
        (80, 10.0),
        (80, 10.0),
        (80, 10.0),
        None,
    ]


def test_kill_storm_frac_defaults_and_sums():
    # from= defaults to one period in; ceil(0.3 * 7) = 3; two drops at once add up, capped at the users.
    assert ticks("kill-storm:users=7,duration=20s", [0, 3.9, 4, 8, 19.99, 20], ("frac=0.3/every=4s",)) == [
        (7, 7.0),
        (7, 7.0),
        (4, 7.0),
        (4, 7.0),
        (7, 7.0),
        None,
    ]
    both = ("frac=0.5/every=4s,restart", "frac=1/every=6s", "all@13s")
    assert ticks("kill-storm:users=4,rate=1", [0, 4, 6, 8, 12, 12.5, 13], both) == [
        (4, 1.0),
        (2, 2.0),
        (0, 4.0),
        (2, 2.0),
        (0, 4.0),
        (0, 4.0),
        None,
    ]


def test_the_first_all_at_kill_or_the_duration_ends_the_storm():
    kill = ("all@30s", "all@12s", "frac=0.5/every=3s")
    assert ticks("kill-storm:users=24,duration=40s", [0, 3, 11.9, 12], kill) == [
        (24, 24.0),
        (12, 24.0),
        (24, 24.0),
        None,
    ]
    assert ticks("kill-storm:users=24,duration=10s", [9.9, 10], ("frac=0.5/every=3s",)) == [(12, 24.0), None]


def test_every_kill_is_seen_and_undone_by_a_late_sampling_shape_worker():
    """Locust samples tick() about once a second, later when busy: with samples 1.0 to 1.4 s apart,
    each frac kill's drop is sampled, and so is the full count between two kills."""
    spec, kill = "kill-storm:users=10,duration=200s", (f"frac=0.5/every={MIN_EVERY_S:g}s/from=1s",)
    rng = random.Random(7)
    times, t = [], 0.0
    while t < 200:
        times.append(t)
        t += rng.uniform(1.0, 1.4)
    seen = ticks(spec, times, kill)
    kills = [1 + n * MIN_EVERY_S for n in range(int((200 - 1) // MIN_EVERY_S) + 1)]
    for a, b in zip(kills, kills[1:]):
        window = [u for t, u in zip(times, seen) if a <= t < b]
        assert (5, 10.0) in window and (10, 10.0) in window, (a, window)


# The locustfile's view, in a process of its own: the class selected_shape() makes from the
# environment, made with no arguments as Locust makes it, ticking on a fake get_run_time().
LOCUST_VIEW = """
import json, sys
from locust import LoadTestShape
from dsv4bench.locust.shapes import parse_shape, selected_shape
spec, kill, times = json.loads(sys.argv[1])
cls = selected_shape()
shape = cls()
seen = []
for t in times:
    shape.get_run_time = lambda t=t: t
    seen.append(shape.tick())
plan = parse_shape(spec, tuple(kill))
print(json.dumps({"shape": issubclass(cls, LoadTestShape) and not cls.abstract, "name": cls.__name__,
                  "same": seen == [plan.tick(t) for t in times], "ticks": seen}))
"""


@needs_locust
@pytest.mark.parametrize(
    "spec,kill,name",
    [
        ("ramp:users=80,rate=10,duration=60s", (), "RampShape"),
        ("step:users=80,step=10,every=10s,duration=120s", (), "StepShape"),
        ("spike:users=10,peak=80,at=30s,hold=10s,duration=90s", (), "SpikeShape"),
        ("kill-storm:users=6,rate=3", ("frac=0.5/every=4s", "", "all@9s"), "KillStormShape"),
    ],
)
def test_the_locust_shape_class_ticks_its_plan_on_the_run_time_it_reads(spec, kill, name):
    times = [0, 4, 4.5, 9, 10, 30, 35, 60, 90, 130]
    env = {**os.environ, SHAPE_ENV: spec, KILL_ENV: "\n".join(kill)}
    r = subprocess.run(
        [sys.executable, "-c", LOCUST_VIEW, json.dumps([spec, [k for k in kill if k], times])],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.splitlines()[-1])
    assert seen["shape"] and seen["name"] == name and seen["same"], seen
    assert seen["ticks"][-1] is None


def test_no_shape_without_the_environment_and_no_locust_in_the_cli():
    """The CLI checks --shape without importing Locust, which would put its process on gevent."""
    code = (
        "import sys; from dsv4bench.locust.shapes import selected_shape; import dsv4bench.cli.locust; "
        "assert selected_shape() is None; "
        "assert not {'locust', 'gevent'} & set(sys.modules), sorted(m for m in sys.modules if 'gevent' in m)"
    )
    env = {k: v for k, v in os.environ.items() if k not in (SHAPE_ENV, KILL_ENV)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]


# ---- specs that cannot work -------------------------------------------------------------------------

BAD = [
    ("", (), "empty"),
    ("rampp:users=5", (), "unknown shape 'rampp'"),
    ("ramp:users5,rate=1,duration=1s", (), "'users5' is not key=value"),
    ("ramp:users=,rate=1,duration=1s", (), "'users=' is not key=value"),
    ("ramp:users=5,users=6,rate=1,duration=1s", (), "users= given twice"),
    ("ramp:users=5,rate=1,duration=1s,peak=9", (), "ramp takes users=, rate=, duration= not peak="),
    ("ramp:users=x,rate=1,duration=1s", (), "users= must be a whole number >= 1, got 'x'"),
    ("ramp:users=0,rate=1,duration=1s", (), "users= must be a whole number >= 1, got '0'"),
    ("ramp:users=2.5,rate=1,duration=1s", (), "users= must be a whole number >= 1, got '2.5'"),
    ("ramp:users=5,rate=-1,duration=1s", (), "rate= must be a positive number of users a second, got '-1'"),
    ("ramp:users=5,rate=nan,duration=1s", (), "rate= must be a positive number of users a second, got 'nan'"),
    ("ramp:users=5,rate=fast,duration=1s", (), "rate= must be a positive number"),
    ("ramp:users=5,duration=10s", (), "ramp needs rate="),
    ("ramp:users=5,rate=1", (), "ramp needs duration="),
    ("ramp", (), "ramp needs users="),
    ("ramp:users=5,rate=1,duration=10x", (), "duration=: bad duration '10x'"),
    ("ramp:users=5,rate=1,duration=0s", (), "duration= must be longer than 0"),
    ("step:users=80,step=10,duration=120s", (), "step needs every="),
    ("step:users=8,step=10,every=1s,duration=10s", (), "step=10 is more than users=8"),
    ("step:users=8,step=1,every=0,duration=10s", (), "every= must be longer than 0"),
    ("spike:users=10,at=30s,hold=10s,duration=90s", (), "spike needs peak="),
    ("spike:users=10,peak=10,at=30s,hold=10s,duration=90s", (), "peak=10 must be more than users=10"),
    ("spike:users=10,peak=80,at=30s,hold=0s,duration=90s", (), "hold= must be longer than 0"),
    (
        "spike:users=10,peak=80,at=85s,hold=10s,duration=90s",
        (),
        "the spike (at=85s plus hold=10s) ends after duration=90s",
    ),
    ("kill-storm:users=8,duration=10s", (), "the kill-all at=20s comes at or after duration=10s"),
    ("kill-storm:users=8,at=0", (), "at= must be longer than 0"),
    ("kill-storm:users=8,at=5s", ("all@5s",), "at= is the kill-all of a storm without --kill"),
    ("kill-storm:users=8", ("frac=0.5/every=5s",), "needs duration= (or an all@ kill)"),
    ("kill-storm:users=8,duration=10s", ("all@12s",), "--kill 'all@12s' comes at or after duration=10s"),
    (
        "kill-storm:users=8",
        ("frac=0.5/every=5s/from=20s", "all@12s"),
        "first kills at 20s, after the storm ended at 12s",
    ),
    ("kill-storm:users=8", ("all@12s,who=ttft",), "who=ttft cannot work"),
    ("kill-storm:users=8", ("frac=0.5/every=5s,who=toolcall", "all@12s"), "who=toolcall cannot work"),
    ("kill-storm:users=8", ("all@12s,abort",), "abort cannot work"),
    ("kill-storm:users=8", ("all@12s,restart",), "restart cannot work on an all@ kill"),
    ("kill-storm:users=8", ("frac=0.5/every=2s", "all@12s"), f"every= must be at least {MIN_EVERY_S:g}s"),
    ("kill-storm:users=8", ("frac=2/every=5s", "all@12s"), "frac must be a number in (0, 1]"),
    ("kill-storm:users=8", ("sometimes",), "must start with all@TIME or frac=F"),
    ("ramp:users=5,rate=1,duration=10s", ("all@5s",), "--kill needs --shape kill-storm:..., not ramp"),
    (None, ("all@5s",), "--kill needs --shape kill-storm"),
]


@pytest.mark.parametrize("spec,kill,needle", BAD)
def test_a_spec_that_cannot_work_is_one_line_naming_its_bad_part(spec, kill, needle):
    with pytest.raises(ConfigError) as e:
        check_shape(spec, kill)
    message = str(e.value)
    assert needle in message and "\n" not in message, message


@pytest.mark.parametrize(
    "spec,kill",
    [
        (None, ()),
        ("ramp:users=80,rate=10,duration=60s", ()),
        ("step:users=80,step=10,every=10s,duration=120s", ()),
        ("spike:users=10,peak=80,at=30s,hold=10s,duration=90s", ()),
        ("kill-storm:users=80,rate=80", ()),
        ("kill-storm:users=80", ("frac=0.25/every=10s/from=20s/until=90s", "all@2m")),
        ("kill-storm:users=80,duration=60s", ("frac=0.5/every=5s,restart",)),
    ],
)
def test_the_documented_specs_work(spec, kill):
    check_shape(spec, kill)


# ---- kill storms against the bundled PD engine ------------------------------------------------------

USERS = 24
# Half the users dropped every 3 s from 3 s, then all of them at 12 s: the drops catch requests
# whose KV is in flight between the halves, the abort-leak's trigger, and the kill-all ends the test.
STORM = ("--shape", f"kill-storm:users={USERS}", "--kill", "frac=0.5/every=3s/from=3s", "--kill", "all@12s")
# NOTE: a KV link of 20 MB/s: a prompt's KV (~1.2 KB a token) then takes a wall-clock 50-150 ms
# to cross, one transfer at a time, so requests wait for their KV on any machine. At the default
# 100 MB/s a quick CI machine once gave every killed request its first token before the kill:
# nothing leaked and the faulty engine read CLEAN. At 20 MB/s, 42 of 60 killed turns had no first
# token on a 2-core VM and both the prefill inflight and the decode transfer queue stuck.
SLOW_LINK = "--engine-arg=--pd-link-gbps=0.02"


@needs_locust
@pytest.mark.parametrize("fault,verdict", [("abort-leak", "WEDGE"), (None, "CLEAN")])
def test_a_locust_kill_storm_on_the_pd_engine(tmp_path, fault, verdict):
    out = tmp_path / "runs"
    faults = ("--engine-fault", fault) if fault else ()
    r = run_cli(
        "locust",
        "--headless",
        *STORM,
        "--engine-pd",
        SLOW_LINK,
        *faults,
        "--max-turns",
        "6",
        "--drain-timeout",
        "10",
        "--canary-timeout",
        "5",
        "--out",
        str(out),
        "-q",
        "--csv",
        str(tmp_path / "stats"),
        timeout=150,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = only_run_dir(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    codes = {c for found in (summary["wedge"] or {}).values() for c in found["codes"]}
    assert summary["verdict"] == verdict and summary["wedge_checked"], (summary, r.stderr[-3000:])
    assert ("queue_stuck" in codes) if fault else not codes, summary["wedge"]
    assert summary["turns"]["killed"] > 0 and summary["turns"]["good"] > 0, summary["turns"]
    # The drops brought users back with new sessions: more sessions than users were played.
    history = read_history(run_dir)
    assert_stats_match_history(tmp_path / "stats", history)  # Locust's own counts tell the same story
    kills = [e for e in history.events if e["kind"] == "kill"]  # the report's timeline marks them
    assert [e.get("at_s") for e in kills] == [3.0, 6.0, 9.0, None] and kills[-1]["users"] == USERS
    assert sum(e["kind"] == "session_start" for e in history.events) > USERS
    locust_info = json.loads((run_dir / "run.json").read_text())["locust"]
    assert locust_info["shape"] == f"kill-storm:users={USERS}" and locust_info["kill"] == [STORM[3], STORM[5]]
    assert verdict in r.stdout + r.stderr  # the verdict line of the run


def test_a_kill_storm_lists_its_drops_for_the_history():
    storm = parse_shape("kill-storm:users=24", ("frac=0.5/every=3s/from=3s", "frac=0.25/every=4s/until=8s", "all@12s"))
    assert storm.kills() == [(3.0, 12), (4.0, 6), (6.0, 12), (8.0, 6), (9.0, 12)]
    assert parse_shape("kill-storm:users=80").kills() == []  # its end alone: every user at 20 s
