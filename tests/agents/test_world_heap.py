"""A session's world costs the garbage collector little: at 2,000 sessions every object the
collector tracks in the worlds is walked by each full collection while the loop waits
(bench-plan.md, "Scale in one process"). Bulk data is kept in containers the collector stops
tracking (tuples of plain values), so a world holds a few hundred tracked objects, not
thousands."""

from __future__ import annotations

import gc

import pytest

from dsv4bench.agents import get_family

# Tracked objects a world may hold after a collection; measured: coding 2, data 41, ops 77
# (650 while its log lines were lists).
BUDGET = 200


def tracked_in(root: object) -> int:
    """Objects reachable from `root` that the collector tracks."""
    seen, todo, n = {id(root)}, [root], 0
    while todo:
        obj = todo.pop()
        if gc.is_tracked(obj):
            n += 1
        for ref in gc.get_referents(obj):
            if id(ref) not in seen and not isinstance(ref, type):
                seen.add(id(ref))
                todo.append(ref)
    return n


@pytest.mark.parametrize("family", ["coding", "data", "ops"])
def test_a_world_holds_few_objects_the_collector_tracks(family):
    worlds = [get_family(family).build_world(seed) for seed in range(5)]
    gc.collect()  # tuples of plain values are untracked by the collection that first sees them
    worst = max(tracked_in(w) for w in worlds)
    assert worst <= BUDGET, f"{family}: a world holds {worst} tracked objects"
