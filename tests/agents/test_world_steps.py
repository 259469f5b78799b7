"""A world built in steps (ScenarioFamily.build_world_steps, which the driver runs one step per
pass of its loop) is the world built at once: the same draws in the same order, whatever runs
between the steps. And the steps of the costly worlds are small: an ops world in one piece held
the loop ~3 ms."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dsv4bench.agents import FAMILIES
from dsv4bench.agents.base import Steps, World
from dsv4bench.agents.data import DataWorld
from dsv4bench.agents.data_world import build_tables_in_steps
from dsv4bench.agents.ops import OpsWorld
from dsv4bench.agents.ops_world import Fleet

NAMES = list(FAMILIES)
SEEDS = (0, 1, 7, 42, 123456, 100_000 * 3 + 17)


def fingerprint(world: World) -> tuple[Any, ...]:
    """The world's state, and for a fleet what its state leaves out: its clock's start, its fault
    and where its random stream stands (the tools draw from it later)."""
    state = world.digest()
    if isinstance(world, OpsWorld):
        f = world.fleet
        return state, f.start, f.symptom, f.root, f.rng.getstate()
    return (state,)


def stepped(steps: Steps[Any]) -> tuple[Any, int]:
    """What `steps` builds, and how many times it paused."""
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as built:
            return built.value, pauses
        pauses += 1


@pytest.mark.parametrize("name", NAMES)
def test_a_world_built_in_steps_is_the_world_built_at_once(name: str) -> None:
    fam = FAMILIES[name]
    for seed in SEEDS:
        world, _ = stepped(fam.build_world_steps(seed))
        once = fam.build_world(seed)
        assert type(world) is type(once)
        assert fingerprint(world) == fingerprint(once), (name, seed)
        assert fam.make_task(world, seed) == fam.make_task(once, seed)


def test_builds_whose_steps_interleave_are_the_builds_made_alone() -> None:
    """The driver builds many sessions' worlds at once, a step of each in turn: no draw of one
    build may land in another's stream."""
    builds = [(fam, seed, fam.build_world_steps(seed)) for seed in SEEDS for fam in FAMILIES.values()]
    built: dict[tuple[str, int], World] = {}
    while len(built) < len(builds):
        for fam, seed, steps in builds:
            if (fam.name, seed) in built:
                continue
            try:
                next(steps)
            except StopIteration as done:
                built[fam.name, seed] = done.value
    for fam, seed, _ in builds:
        assert fingerprint(built[fam.name, seed]) == fingerprint(fam.build_world(seed)), (fam.name, seed)


# The pauses of each family's build: coding's world (~0.1 ms) is built at once (the default
# build_world_steps), data's pauses after customers and products, then every ORDERS_PER_STEP
# orders (220-300 orders), ops' after each of its 7 services' logs and metric series.
PAUSES = {"coding": {0}, "data": {5, 6}, "ops": {14}}


@pytest.mark.parametrize("name", NAMES)
def test_where_each_family_pauses(name: str) -> None:
    seen = {stepped(FAMILIES[name].build_world_steps(seed))[1] for seed in range(40)}
    assert seen == PAUSES[name]


class CountingRandom(random.Random):
    """A Random that counts its draws. It overrides both primitives, so its stream is the base
    class's (a subclass that overrode random() alone would draw integers otherwise)."""

    def __init__(self, seed: str) -> None:
        self.draws = 0
        super().__init__(seed)

    def random(self) -> float:
        self.draws += 1
        return super().random()

    def getrandbits(self, k: int) -> int:
        self.draws += 1
        return super().getrandbits(k)


def draws_per_step(steps: Steps[Any], rng: CountingRandom) -> tuple[Any, list[int]]:
    """What `steps` builds, and the draws each step made: a measure of its work that no other
    load on the machine changes."""
    per_step = []
    while True:
        before = rng.draws
        try:
            next(steps)
        except StopIteration as built:
            per_step.append(rng.draws - before)
            return built.value, per_step
        per_step.append(rng.draws - before)


@pytest.mark.parametrize("seed", SEEDS)
def test_no_step_of_an_ops_world_is_more_than_a_fraction_of_it(seed: int) -> None:
    rng = CountingRandom(f"ops-world:{seed}")
    fleet, per_step = draws_per_step(Fleet.in_steps(rng), rng)
    assert fingerprint(OpsWorld(fleet)) == fingerprint(FAMILIES["ops"].build_world(seed))  # the stream unchanged
    assert len(per_step) >= 5  # one step per service's logs, one per service's metrics, then the fault
    assert max(per_step) <= sum(per_step) / 4, per_step


@pytest.mark.parametrize("seed", SEEDS)
def test_no_step_of_a_data_world_is_more_than_a_fraction_of_it(seed: int) -> None:
    rng = CountingRandom(f"data-world:{seed}")
    tables, per_step = draws_per_step(build_tables_in_steps(rng), rng)
    assert DataWorld(tables).digest() == FAMILIES["data"].build_world(seed).digest()  # the stream unchanged
    assert len(per_step) >= 5  # customers and products, then the orders in steps of ORDERS_PER_STEP
    assert max(per_step) <= sum(per_step) / 4, per_step
