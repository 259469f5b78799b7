"""What an agent reads before it acts: each family's read-only tool calls, in the order a
competent agent on a long task reads its world, each call in the argument shapes (and key order)
the family's expert writes them, so the model reads calls it knows.

Recorded coding-agent sessions spend most of their context on reads (files opened, logs and
tables dumped, searches), and the calls that change the world come late. A long-context
session (dsv4bench/harness/context_profile.py) opens with such reads: real calls on the
session's own world whose results are the world's real content, never filler. Each sequence
first reads every distinct thing once, then goes on as agents do on a long task: files opened
again, searches, narrower views (one level, one month, one window) of the same world.
Nothing here changes a world: every call is one the family's tools answer without mutating.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .base import ToolAction, World

# The families' read-only tools' own constants, read where they are defined.
from .data_world import MONTHS
from .ops_world import LEVELS, METRICS


@dataclass(frozen=True)
class Exploration:
    """A family's reads of one world: `first`, its first pass (every distinct thing once, in the
    order its expert reads them), and `more`, endless further views. An opening puts what it
    takes of `more` before `first`: the reads a session ends its opening with are then the ones
    the expert's sessions begin with, and the model's first turn follows calls it knows."""

    first: list[ToolAction]
    more: Iterator[ToolAction]


def exploration(family: str, world: World) -> Exploration:
    """The read-only calls an agent of `family` makes on `world`; an unknown family reads nothing."""
    explore = _EXPLORERS.get(family)
    if explore is None:
        return Exploration([], iter(()))
    first, more = explore(world)
    return Exploration(first, more)


def _coding(world: Any) -> tuple[list[ToolAction], Iterator[ToolAction]]:
    files = sorted(world.files)
    first = [ToolAction("list_dir", {"path": ".", "recursive": True})]
    first += [ToolAction("read_file", {"path": path}) for path in files]
    first.append(ToolAction("run_tests", {"verbosity": "verbose"}))
    return first, _coding_more(world, files)


def _coding_more(world: Any, files: list[str]) -> Iterator[ToolAction]:
    # Whole files and searches only, as the expert reads after its first pass: line-range reads
    # made the bundled model write ranges of its own and garble their numbers.
    for rnd in itertools.count():
        for path in files:
            yield ToolAction("read_file", {"path": path})
            for name in _defined_names(world.files[path])[rnd::4][:2]:
                yield ToolAction("search_code", {"pattern": f"{name}(", "max_results": 30})


def _defined_names(text: str) -> list[str]:
    """The names a module defines (`def f(`, `class C`), in order: what an agent greps for."""
    out = []
    for line in text.splitlines():
        head = line.strip()
        for keyword in ("def ", "class "):
            if head.startswith(keyword):
                name = head[len(keyword) :].split("(", 1)[0].split(":", 1)[0].strip()
                if name.isidentifier():
                    out.append(name)
    return out


def _data(world: Any) -> tuple[list[ToolAction], Iterator[ToolAction]]:
    tables = sorted(world.tables)
    first = [ToolAction("list_tables", {"include_columns": True})]
    first += [ToolAction("describe_table", {"table": t, "include_samples": True, "sample_rows": 10}) for t in tables]
    return first, _data_more(world, tables)


def _data_more(world: Any, tables: list[str]) -> Iterator[ToolAction]:
    for rnd in itertools.count():
        for table in tables:
            columns = [c.name for c in world.tables[table].columns]
            if "month" in columns:  # a table by month is read a month at a time, as analysts page it
                where = [{"column": "month", "op": "=", "value": MONTHS[rnd % len(MONTHS)]}]
            else:
                where = []
            key = columns[rnd % len(columns)] if columns else None
            query: dict[str, Any] = {"table": table, "where": where}
            if key is not None:
                query["order_by"] = {"column": key, "descending": rnd % 2 == 1}
            query["limit"] = 200
            yield ToolAction("run_query", query)


def _ops(world: Any) -> tuple[list[ToolAction], Iterator[ToolAction]]:
    services = sorted(world.fleet.services)
    first = [ToolAction("list_services", {"status": "any", "include_dependencies": True})]
    return first, _ops_more(services)


def _ops_more(services: list[str]) -> Iterator[ToolAction]:
    for name in services:
        yield ToolAction("get_logs", {"service": name, "level": "info", "since_minutes": 120, "limit": 200})
    for name in services:
        for metric in METRICS:
            yield ToolAction("get_metrics", {"service": name, "metric": metric, "window_minutes": 90})
    for rnd in itertools.count():
        level = LEVELS[(rnd % (len(LEVELS) - 1)) + 1]  # info, warn, error: each a narrower view
        window = 30 + (rnd * 30) % 210
        for name in services:
            yield ToolAction("get_logs", {"service": name, "level": level, "since_minutes": window, "limit": 200})


_EXPLORERS: dict[str, Callable[[Any], tuple[list[ToolAction], Iterator[ToolAction]]]] = {
    "coding": _coding,
    "data": _data,
    "ops": _ops,
}
