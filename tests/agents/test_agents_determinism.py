"""Worlds, tasks and expert sessions are functions of the seed only."""

from __future__ import annotations

import random

import pytest

from dsv4bench.agents import FAMILIES, play_expert

NAMES = list(FAMILIES)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_world_and_task(name: str) -> None:
    fam = FAMILIES[name]
    for seed in (0, 7, 123456):
        a, b = fam.build_world(seed), fam.build_world(seed)
        assert a.digest() == b.digest()
        assert fam.make_task(a, seed) == fam.make_task(b, seed)


@pytest.mark.parametrize("name", NAMES)
def test_global_random_is_neither_used_nor_disturbed(name: str) -> None:
    fam = FAMILIES[name]
    random.seed(1)
    first = fam.build_world(5).digest()
    random.seed(2)
    state = random.getstate()
    assert fam.build_world(5).digest() == first
    play_expert(fam, 5)
    assert random.getstate() == state


@pytest.mark.parametrize("name", NAMES)
def test_seeds_give_varied_worlds_and_tasks(name: str) -> None:
    fam = FAMILIES[name]
    worlds = [fam.build_world(seed) for seed in range(20)]
    tasks = [fam.make_task(w, seed) for seed, w in enumerate(worlds)]
    assert len({w.digest() for w in worlds}) == 20
    assert len({t.prompt for t in tasks}) >= 15
    kinds = {fam.make_task(fam.build_world(seed), seed).goal["kind"] for seed in range(40)}
    assert len(kinds) >= 4, kinds


@pytest.mark.parametrize("name", NAMES)
def test_expert_sessions_replay_identically(name: str) -> None:
    a, b = play_expert(name, 11), play_expert(name, 11)
    assert a.steps == b.steps
    assert a.observations == b.observations
    assert a.world.digest() == b.world.digest()


@pytest.mark.parametrize("name", NAMES)
def test_digest_tracks_changes(name: str) -> None:
    s = play_expert(name, 4)
    assert s.world.digest() != FAMILIES[name].build_world(4).digest()


def test_averages_do_not_depend_on_the_python_version():
    """Python 3.12 made sum() of floats compensated; a world that averaged with sum() printed
    480.70 on 3.11 and 480.71 on 3.12 for these numbers (and a model's transcript recorded on
    one could not be replayed on the other). Exact summation gives one answer everywhere, in any
    order."""
    from dsv4bench.agents.data_world import aggregate

    values = [
        540.6,
        892.12,
        704.22,
        21.28,
        207.32,
        853.89,
        585.47,
        873.91,
        411.4,
        210.47,
        4.14,
        996.05,
        136.38,
        642.97,
        489.71,
        380.15,
        537.2,
        78.28,
        970.03,
        492.74,
        15.29,
        419.34,
        757.2,
        312.08,
        745.02,
        767.36,
        239.12,
        967.97,
        27.89,
        863.61,
        512.65,
        153.38,
        258.39,
        593.52,
        278.46,
        838.42,
        219.53,
        384.06,
        506.81,
        339.77,
    ]
    rows = [{"amount": v} for v in values]
    assert aggregate(rows, "amount", "avg") == aggregate(rows[::-1], "amount", "avg") == 480.71
