"""A session's request keys (SessionKeys, which keeps its transcript's encoding between turns)
are request_key's, byte for byte, however the transcript changes; and a run's sessions use it."""

from __future__ import annotations

import copy
import json
import random

from dsv4bench.agents import get_family
from dsv4bench.history.records import TurnStatus
from dsv4bench.harness.reference_run import SessionKeys, request_key
from dsv4bench.harness.session import AgentSession, SessionConfig, request_summary
from dsv4bench.wire.sse import DeltaAssembler


def _random_message(rng: random.Random, i: int) -> dict:
    role = rng.choice(["user", "assistant", "tool"])
    m: dict = {"role": role, "content": rng.choice([None, "", f"text {i} ü \u2028 \x00", "x" * rng.randint(1, 50)])}
    if role == "assistant" and rng.random() < 0.5:
        m["tool_calls"] = [
            {"id": f"call_{i}_{j}", "type": "function", "function": {"name": "f", "arguments": '{"a": %d}' % j}}
            for j in range(rng.randint(1, 3))
        ]
    if role == "tool":
        m["tool_call_id"] = f"call_{i}"
    if rng.random() < 0.2:
        m["reasoning_content"] = "think \ud800"  # a lone surrogate a server's reply can carry
    return m


def test_keys_match_request_key_as_a_transcript_grows_and_is_edited() -> None:
    rng = random.Random(0)
    for trial in range(40):
        keys = SessionKeys()
        messages: list = []
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        for turn in range(12):
            messages.extend(_random_message(rng, len(messages)) for _ in range(rng.randint(1, 3)))
            change = rng.random()
            if change < 0.1 and messages:  # a message replaced by another object
                messages[rng.randrange(len(messages))] = _random_message(rng, 99)
            elif change < 0.2 and messages:  # a message edited in place
                messages[rng.randrange(len(messages))]["content"] = f"edited {turn}"
            elif change < 0.25 and len(messages) > 2:  # the transcript cut short
                del messages[rng.randrange(1, len(messages)) :]
            elif change < 0.3:
                tools.append({"type": "function", "function": {"name": f"g{turn}"}})
            body = {
                "model": "m",
                "messages": list(messages),
                "tools": tools,
                "temperature": rng.choice([0, 0.0, 0.7]),
                "max_tokens": 64,
                "stream": True,
                "user": f"u{turn}",
            }
            if rng.random() < 0.3:
                body["tool_choice"] = {"type": "function", "function": {"name": "f"}}
            if rng.random() < 0.2:
                del body["tools"]
            assert keys.key(body) == request_key(copy.deepcopy(body)), (trial, turn)


def test_keys_ignore_what_request_key_ignores_and_take_odd_bodies() -> None:
    keys = SessionKeys()
    base = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    assert keys.key(base) == keys.key({**base, "model": "b", "user": "x", "stream": False})
    assert keys.key(base) != keys.key({**base, "temperature": 0.5})
    for odd in (
        {},
        {"messages": None},
        {"messages": "text"},
        {"messages": [1, "two", None]},
        {"messages": {"role": "user"}},
        {"max_tokens": float("nan")},
    ):
        assert keys.key(odd) == request_key(odd)


def test_request_key_takes_a_lone_surrogate() -> None:
    assert len(request_key({"messages": [{"role": "user", "content": "\udc80"}]})) == 32


def test_a_session_keys_its_turns_as_request_key_does() -> None:
    fam = get_family("coding")
    sess = AgentSession("s1", fam, 1, SessionConfig(model="m", max_turns=6))
    tool = fam.openai_tools()[0]["function"]["name"]
    for turn in range(5):
        body = sess.next_request()
        assert request_summary(body, sess.keys)["key"] == request_key(copy.deepcopy(body)), turn
        asm = DeltaAssembler()
        asm.feed(
            json.dumps(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "role": "assistant",
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": f"c{turn}",
                                        "type": "function",
                                        "function": {"name": tool, "arguments": "{}"},
                                    }
                                ],
                            },
                            "finish_reason": "tool_calls",
                        }
                    ]
                }
            )
        )
        asm.feed("[DONE]")
        sess.observe(TurnStatus.OK, asm.finish(), [])
        assert len(sess.messages) > len(body["messages"])
