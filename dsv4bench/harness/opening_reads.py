"""A long-context session's opening: the reads an agent made on its world before this turn.

The reads are the family's own read-only calls (agents/exploration.py), run through the call
gate on the session's world as any call is, and put in the transcript as the agent's earlier
turns: one call per assistant turn, then its result, in the argument shapes the family's expert
writes (the shape the bundled model was trained on: batched reads made it copy one call's
arguments into another's). The results are the world's real content,
so every checker reads them as it reads any turn's, and nothing in them is there to be skipped.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from dsv4bench.agents.base import ToolAction, World, is_error
from dsv4bench.agents.call_gate import CallGate
from dsv4bench.agents.exploration import exploration
from dsv4bench.agents.transcript import CallText, assistant_message, tool_message

# Reads looked at for one opening at most: a world whose reads stop growing the transcript
# (every result an error) cannot hold the session's loop.
MAX_READS = 2_000
# Budget left below which no read is looked for: a directory listing's size.
SMALLEST_READ = 400


def opening_reads(family: str, world: World, gate: CallGate, budget_chars: int) -> list[dict[str, Any]]:
    """Messages of reads on `world` whose results add up to at most `budget_chars` characters:
    the further views that fit, then the first pass (exploration.Exploration says why in that
    order), one call per assistant turn, each followed by its result."""
    if budget_chars <= 0:
        return []
    reads = exploration(family, world)
    first, used = _take(iter(reads.first), world, gate, budget_chars, 0)
    more, _ = _take(itertools.islice(reads.more, MAX_READS), world, gate, budget_chars - used, len(first))
    messages: list[dict[str, Any]] = []
    for call, result in more + first:
        messages += [assistant_message(None, [call]), tool_message(call.id, result)]
    return messages


def _take(
    actions: Iterator[ToolAction], world: World, gate: CallGate, budget: int, first_id: int
) -> tuple[list[tuple[CallText, str]], int]:
    """The calls of `actions` (run through the gate on `world`) whose results fit `budget`
    characters, in order, and the characters they take; numbered from `first_id`."""
    taken: list[tuple[CallText, str]] = []
    used = 0
    for action in actions:
        if budget - used < SMALLEST_READ:
            break
        raw = json.dumps(action.arguments)
        result = gate.run(world, action.name, raw)
        if is_error(result):
            continue  # a read the world cannot answer is no agent's reading
        cost = len(result) + len(action.name) + len(raw)
        if used + cost > budget:
            continue  # a smaller read further on may still fit
        used += cost
        taken.append((CallText(f"call_read_{first_id + len(taken)}", action.name, raw), result))
    return taken, used
