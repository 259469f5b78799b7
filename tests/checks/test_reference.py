"""reference_mismatch and the request key it hangs on: literal turns and literal reference runs."""

from __future__ import annotations

import copy
import json

import pytest

from dsv4bench.checks import run_checks
from dsv4bench.checks.reference import check_reference_mismatch
from dsv4bench.history.records import ReferenceAnswer, TurnStatus
from dsv4bench.harness.reference_run import ReferenceAnswers, ReferenceRunError, is_greedy, request_key

from .turns import turn

BODY = {
    "model": "dsv4-mini",
    "user": "s00001",
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.0,
    "max_tokens": 256,
    "tool_choice": "auto",
    "tools": [{"type": "function"}],
    "messages": [
        {"role": "system", "content": "You fix code."},
        {"role": "user", "content": "Fix median()."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_a1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a1", "content": "def median(xs): ..."},
    ],
}


def _variant(**changes):
    body = copy.deepcopy(BODY)
    body.update(changes)
    return body


def test_the_key_ignores_what_does_not_reach_the_model():
    other = _variant(model="other-name", user="s00002", stream=False, stream_options=None)
    other["messages"][2]["tool_calls"][0]["id"] = "call_zz"
    other["messages"][3]["tool_call_id"] = "call_zz"
    assert request_key(other) == request_key(BODY)


@pytest.mark.parametrize(
    "change",
    [
        {"max_tokens": 255},
        {"temperature": 0.5},
        {"tool_choice": "none"},
        {"tools": []},
        {"chat_template_kwargs": {"thinking": True}},
    ],
)
def test_the_key_changes_with_what_decides_the_answer(change):
    assert request_key(_variant(**change)) != request_key(BODY)


def test_the_key_changes_with_any_message_text():
    other = _variant()
    other["messages"][3]["content"] = "def median(xs): ...\n"
    assert request_key(other) != request_key(BODY)
    other = _variant()
    other["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"path": "b.py"}'
    assert request_key(other) != request_key(BODY)


def test_only_temperature_zero_is_greedy():
    assert is_greedy(BODY) and not is_greedy(_variant(temperature=0.7))
    assert not is_greedy({k: v for k, v in BODY.items() if k != "temperature"})  # OpenAI's default is 1


def _ref(ctx, **where) -> ReferenceAnswer:
    return ReferenceAnswer.of(ctx.response, **where)


def test_the_same_answer_is_no_finding_and_no_reference_is_no_finding():
    ours = turn(calls=[("read_file", {"path": "a.py"})])
    ours.reference = _ref(turn(calls=[("read_file", {"path": "a.py"})], response_id="other-id"))
    assert check_reference_mismatch(ours) == []
    assert check_reference_mismatch(turn("hello")) == []


@pytest.mark.parametrize(
    "reference,where,needle",
    [
        (turn(calls=[("read_file", {"path": "b.py"})]), "tool_calls[0].arguments", "at character 10"),
        (turn(calls=[("edit_file", {"path": "a.py"})]), "tool_calls[0].name", "'edit_file'"),
        (turn(calls=[("read_file", {"path": "a.py"}), ("list_services", {})]), "tool_calls", "1 tool call(s) here, 2"),
        (turn(calls=[("read_file", {"path": "a.py"})], reasoning="look first"), "reasoning", "'look first'"),
        (turn(calls=[("read_file", {"path": "a.py"})], finish="stop"), "finish_reason", "'stop'"),
    ],
)
def test_a_different_answer_names_where_it_first_differs(reference, where, needle):
    ours = turn(calls=[("read_file", {"path": "a.py"})])
    ours.reference = _ref(reference, session="s00007", turn=3)
    [v] = check_reference_mismatch(ours)
    assert (v.code, v.where) == ("reference_mismatch", where)
    assert needle in v.detail and "reference s00007 turn 3" in v.detail


def test_content_differences_are_quoted_from_both_sides():
    ours = turn("The median is 74.21 for the east region.")
    ours.reference = _ref(turn("The median is 71.04 for the east region."))
    [v] = check_reference_mismatch(ours)
    assert v.where == "content" and "at character 15" in v.detail
    assert "is 74.21 for" in v.detail and "is 71.04 for" in v.detail


def test_run_checks_judges_it_only_on_completed_turns():
    ctx = turn("yes")
    ctx.reference = _ref(turn("no"))
    assert [v.code for v in run_checks(ctx)[0]] == ["reference_mismatch"]
    ctx.status = TurnStatus.KILLED
    assert run_checks(ctx)[0] == []


# --- loading a reference run ---------------------------------------------------------------------------


def _record(key: str, content: str, *, temperature=0.0, status="ok", session="s00000", turn_no=1) -> dict:
    return {
        "run": "r1",
        "session": session,
        "turn": turn_no,
        "status": status,
        "request": {"key": key, "temperature": temperature},
        "response": {"content": content, "finish_reason": "stop", "tool_calls": []},
    }


def _write_run(folder, records) -> None:
    folder.mkdir(parents=True)
    (folder / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_load_keeps_completed_greedy_turns_and_counts_its_own_conflicts(tmp_path):
    _write_run(
        tmp_path / "out" / "run1",
        [
            _record("k1", "a"),
            _record("k2", "b"),
            _record("k2", "b2", session="s00001"),  # answered two ways
            _record("k3", "c", temperature=0.7),
            _record("k4", "d", status="killed"),
        ],
    )
    ref = ReferenceAnswers.load(tmp_path / "out")  # an --out folder holding one run is enough
    assert ref.run_dir == tmp_path / "out" / "run1"
    assert set(ref.answers) == {"k1", "k2"} and ref.conflicts == 1
    assert ref.get("k2").content == "b" and ref.get("k3") is None


def test_load_refuses_what_cannot_be_a_reference(tmp_path):
    with pytest.raises(ReferenceRunError, match="no such folder"):
        ReferenceAnswers.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReferenceRunError, match="not a dsv4bench run folder"):
        ReferenceAnswers.load(tmp_path / "empty")
    _write_run(tmp_path / "two" / "a", [_record("k1", "a")])
    _write_run(tmp_path / "two" / "b", [_record("k1", "a")])
    with pytest.raises(ReferenceRunError, match="holds 2 runs"):
        ReferenceAnswers.load(tmp_path / "two")
    _write_run(tmp_path / "hot", [_record("k1", "a", temperature=1.0)])
    with pytest.raises(ReferenceRunError, match="no completed greedy turn"):
        ReferenceAnswers.load(tmp_path / "hot")
