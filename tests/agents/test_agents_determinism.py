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
