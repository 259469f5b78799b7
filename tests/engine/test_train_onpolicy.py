"""On-policy relabelling: the expert takes over from states a (simulated) model reached."""

from __future__ import annotations

import copy
import json
import random

import pytest

from dsv4bench.agents import FAMILIES, play_expert, session_messages
from dsv4bench.agents.base import Step, ToolAction
from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.tokenizer import load_tokenizer
from dsv4bench.engine.training.corpus import assistant_mask, encode_messages
from dsv4bench.engine.training.onpolicy import (
    ReplayError,
    Rollout,
    expert_takeover,
    relabel,
    score,
    takeovers,
)

# An ops training seed whose expert opens an incident on [symptom, root] at turn 8 of 10.
SEED, AT = 100004, 8


def looping_rollout() -> list[dict]:
    """What a drifting model does: [symptom, symptom] for [symptom, root], refused by the
    schema's uniqueItems, then the same call again until its 16 turns run out."""

    def alter(n: int, step: Step) -> Step:
        if n < AT:
            return step
        call = play_expert("ops", SEED).steps[AT].calls[0]
        services = call.arguments["affected_services"]
        return Step(calls=(ToolAction(call.name, {**call.arguments, "affected_services": [services[0]] * 2}),))

    return session_messages(play_expert("ops", SEED, 16, alter))


def test_the_seed_is_a_dependency_task():
    step = play_expert("ops", SEED).steps[AT]
    assert step.calls[0].name == "open_incident" and len(set(step.calls[0].arguments["affected_services"])) == 2


def test_takeovers_find_the_divergence_and_the_refusal():
    where = takeovers("ops", SEED, looping_rollout())
    assert (where.diverged, where.went_wrong, where.turns) == (AT, AT, 16)
    for seed in range(5):
        points = where.points(random.Random(seed))
        assert points[:2] == [AT, AT + 1] and all(AT <= p <= AT + 3 for p in points)


def test_the_expert_on_its_own_path_gives_nothing():
    messages = session_messages(play_expert("ops", SEED))
    assert takeovers("ops", SEED, messages).diverged is None
    assert relabel(Rollout("ops", SEED, 0.0, messages), random.Random(0)) == ([], "on path")


@pytest.mark.parametrize("turn", [AT, AT + 1, AT + 3])
def test_expert_takeover_keeps_the_model_turns_then_solves(turn):
    rollout = looping_rollout()
    messages, solved = expert_takeover("ops", SEED, rollout, turn)
    assert solved
    assistant = [m for m in messages if m["role"] == "assistant"]
    model = [m for m in rollout if m["role"] == "assistant"]
    assert assistant[:turn] == model[:turn]
    fixed = json.loads(assistant[turn]["tool_calls"][0]["function"]["arguments"])
    assert len(set(fixed["affected_services"])) == 2  # the expert's call names the root cause
    assert not assistant[-1].get("tool_calls")  # and it ends with a final answer


def test_relabel_marks_the_model_turns_after_the_divergence_loss_free():
    relabelled, why = relabel(Rollout("ops", SEED, 0.0, looping_rollout()), random.Random(1))
    assert why == "" and relabelled
    for x in relabelled:
        assert x.no_loss == frozenset(range(AT, x.turn))
    x = relabelled[-1]
    frontend = Frontend(load_tokenizer())
    enc = encode_messages(frontend, "ops", SEED, x.messages, set(x.no_loss))
    full = assistant_mask(enc.ids, frontend.tokenizer)
    tok = frontend.tokenizer
    start = tok.special_id("Assistant")
    turns = [
        i for i in range(len(enc.ids) - 1) if enc.ids[i] == start and enc.ids[i + 1] == tok.special_id("ThinkingEnd")
    ]
    learned = [n for n, i in enumerate(turns) if enc.mask[i + 2]]
    assert learned == [n for n in range(len(turns)) if n not in x.no_loss]
    assert sum(full) > sum(enc.mask) > 0


def test_calls_that_do_not_decode_are_a_divergence_and_replay_as_refused():
    rollout = looping_rollout()[: [i for i, m in enumerate(looping_rollout()) if m["role"] == "assistant"][AT]]
    cid = "call_bad"
    rollout += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": "open_incident", "arguments": '{"title": un.92}'}}
            ],
        }
    ]
    from dsv4bench.agents.call_gate import CallGate

    _, refusal = CallGate(FAMILIES["ops"].tool_schemas()).check("open_incident", '{"title": un.92}')
    rollout.append({"role": "tool", "tool_call_id": cid, "content": refusal})
    where = takeovers("ops", SEED, rollout)
    assert (where.diverged, where.went_wrong) == (AT, AT)
    _, solved = expert_takeover("ops", SEED, rollout, AT + 1)
    assert solved


def test_a_result_that_does_not_replay_is_refused():
    rollout = copy.deepcopy(looping_rollout())
    next(m for m in rollout if m["role"] == "tool")["content"] = "something the world never said"
    with pytest.raises(ReplayError, match="differs"):
        expert_takeover("ops", SEED, rollout, AT + 1)
    assert relabel(Rollout("ops", SEED, 0.0, rollout), random.Random(0))[1] == "replay"


def test_no_takeover_after_a_final_answer_or_past_the_turns():
    ended = session_messages(play_expert("ops", SEED))  # ten turns, the last a final answer
    with pytest.raises(ReplayError, match="final answer"):
        expert_takeover("ops", SEED, ended, 10)
    with pytest.raises(ReplayError, match="not a takeover point"):
        expert_takeover("ops", SEED, looping_rollout(), 16)


def test_a_first_move_off_the_path_is_taken_over_from_the_start():
    """The model's very first call is wrong: the expert's own session (takeover at turn 0)
    and its recovery after the model's call (turn 1) are both kept."""
    first = play_expert("ops", SEED).steps[0].calls[0]
    wrong = ToolAction("get_logs", {"service": "no-such-service"})
    assert wrong != first

    def alter(n: int, step: Step) -> Step:
        return Step(calls=(wrong,)) if n == 0 else step

    rollout = session_messages(play_expert("ops", SEED, 16, alter))
    relabelled, why = relabel(Rollout("ops", SEED, 0.0, rollout), random.Random(0))
    assert why == "" and [x.turn for x in relabelled][:2] == [0, 1]
    assert relabelled[0].no_loss == frozenset() and relabelled[1].no_loss == frozenset({0})
    fn = relabelled[0].messages[2]["tool_calls"][0]["function"]
    assert (fn["name"], json.loads(fn["arguments"])) == (first.name, first.arguments)
    assert relabelled[1].messages[2]["tool_calls"][0]["function"]["name"] == "get_logs"


def test_no_takeover_point_inside_the_turns_is_too_late():
    relabelled, why = relabel(Rollout("ops", SEED, 0.0, looping_rollout()), random.Random(0), max_turns=AT)
    assert (relabelled, why) == ([], "too late")


def test_score_counts_refused_turns_final_answers_and_solved_tasks():
    expert = score(Rollout("ops", SEED, 0.0, session_messages(play_expert("ops", SEED))))
    assert expert.bad_turns == 0 and expert.final_answer and expert.solved
    assert expert.call_turns == expert.turns - 1  # every turn calls a tool but the final answer
    looping = score(Rollout("ops", SEED, 0.0, looping_rollout()))
    # turns AT..15 each send the refused [symptom, symptom] incident; no answer, not solved
    assert (looping.turns, looping.call_turns, looping.bad_turns) == (16, 16, 16 - AT)
    assert not looping.final_answer and not looping.solved
