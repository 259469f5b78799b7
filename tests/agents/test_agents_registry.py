"""The family registry and the expert-session helpers."""

from __future__ import annotations

import pytest

from dsv4bench.agents import FAMILIES, family_for_session, get_family, play_expert, run_expert_session, session_messages
from dsv4bench.agents.base import ScenarioFamily, Step, Task


def test_registry_holds_the_three_families() -> None:
    assert list(FAMILIES) == ["coding", "data", "ops"]
    for name, fam in FAMILIES.items():
        assert isinstance(fam, ScenarioFamily) and fam.name == name
        assert get_family(name) is fam


def test_unknown_family_names_the_known_ones() -> None:
    with pytest.raises(KeyError) as err:
        get_family("chess")
    message = str(err.value)
    assert "chess" in message and all(n in message for n in FAMILIES)


def test_family_for_session() -> None:
    assert [family_for_session("mixed", i).name for i in range(7)] == [
        "coding",
        "data",
        "ops",
        "coding",
        "data",
        "ops",
        "coding",
    ]
    assert family_for_session("data", 5) is FAMILIES["data"]
    with pytest.raises(KeyError):
        family_for_session("nope", 0)


def test_run_expert_session_shape() -> None:
    task, steps, digest = run_expert_session("coding", 3)
    assert isinstance(task, Task) and task.family == "coding" and task.seed == 3
    assert all(isinstance(s, Step) for s in steps) and steps[-1].is_final
    assert isinstance(digest, str) and len(digest) == 64
    assert run_expert_session(FAMILIES["coding"], 3) == (task, steps, digest)


def test_max_turns_cuts_the_session() -> None:
    s = play_expert("ops", 1, max_turns=3)
    assert len(s.steps) == 3 and not s.steps[-1].is_final and s.final is None


def test_session_messages_are_openai_shaped() -> None:
    s = play_expert("data", 2)
    msgs = session_messages(s)
    assert [m["role"] for m in msgs[:3]] == ["system", "user", "assistant"]
    assert msgs[-1] == {"role": "assistant", "content": s.final}
    calls = [tc for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
    answered = {m["tool_call_id"] for m in msgs if m["role"] == "tool"}
    assert calls and {tc["id"] for tc in calls} == answered
    assert len(session_messages(s, upto=2)) == 2 + 2 + sum(len(st.calls) for st in s.steps[:2])
