"""Live counters of a run and their rich view. The driver bumps counters; the view reads them."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dsv4bench.history.records import CORRUPTION_CODES, TurnRecord, TurnStatus
from dsv4bench.report.slo import SloTally
from dsv4bench.terminal import visible


@dataclass
class LiveStats:
    """What the progress view shows; updated from one event loop, so no locking."""

    started: float = field(default_factory=time.monotonic)
    sessions_target: int | None = None
    duration_s: float | None = None
    sessions_active: int = 0
    sessions_done: int = 0
    turns: int = 0
    turns_corrupt: int = 0
    turns_killed: int = 0
    turns_error: int = 0
    tool_calls: int = 0
    kills: int = 0  # sessions the nemesis killed
    verdicts: Counter[str] = field(default_factory=Counter)
    slo: SloTally | None = None  # --slo: each turn judged against the run's latency targets

    def add_turn(self, rec: TurnRecord) -> None:
        self.turns += 1
        if rec.status is TurnStatus.KILLED:
            self.turns_killed += 1
        elif rec.status is not TurnStatus.OK:
            self.turns_error += 1
        elif rec.corrupt:
            self.turns_corrupt += 1
        if rec.status is TurnStatus.OK and rec.response:
            self.tool_calls += len(rec.response.tool_calls)
        self.verdicts.update({v.code for v in rec.verdicts})
        if self.slo is not None:
            self.slo.add(rec)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def render_stats(s: LiveStats) -> Group:
    """One compact panel: sessions, turns, tool calls, verdicts so far, elapsed."""
    goal = f"/{s.sessions_target}" if s.sessions_target else ""
    limit = f"/{s.duration_s:.0f}s" if s.duration_s else "s"
    head = Text.assemble(
        ("sessions ", "bold"),
        f"active {s.sessions_active}  done {s.sessions_done}{goal}   ",
        ("turns ", "bold"),
        f"{s.turns}   ",
        ("tool calls ", "bold"),
        f"{s.tool_calls}   ",
        ("elapsed ", "bold"),
        f"{s.elapsed:.0f}{limit}",
    )
    tail = Text.assemble(
        ("corrupt ", "bold red" if s.turns_corrupt else "bold green"),
        f"{s.turns_corrupt}   ",
        ("errors ", "bold yellow" if s.turns_error else "bold"),
        f"{s.turns_error}   ",
        ("killed ", "bold"),
        f"{s.turns_killed} turns / {s.kills} kills",
    )
    parts: list[Text | Table] = [head, tail]
    if s.verdicts:
        t = Table(show_header=False, box=None, padding=(0, 2))
        for code, n in s.verdicts.most_common(8):
            style = "red" if code in CORRUPTION_CODES else "yellow"
            # Codes are the checkers' own words; shown through the one terminal escape all the same.
            t.add_row(Text(visible(code), style=style), str(n))
        parts.append(t)
    return Group(*parts)


class ProgressView:
    """A rich Live panel on stderr, refreshed a few times a second; silent when quiet."""

    def __init__(self, stats: LiveStats, quiet: bool, console: Console | None = None) -> None:
        self.stats = stats
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self._live: Live | None = None

    def __enter__(self) -> ProgressView:
        if not self.quiet:
            self._live = Live(
                get_renderable=lambda: render_stats(self.stats),
                console=self.console,
                refresh_per_second=4,
                transient=False,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            if not self.console.is_terminal:  # a log file: end the last frame's line
                self.console.line()
