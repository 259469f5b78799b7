"""The sans-IO session core, driven by literal responses against a tiny literal family."""

import json

import pytest

from dsv4bench.agents.base import Observation, ScenarioFamily, Step, Task, ToolAction, ToolError, ToolSpec, World
from dsv4bench.history.records import AssembledResponse, ToolCall, TurnStatus, Verdict
from dsv4bench.harness.reference_run import request_key
from dsv4bench.harness.session import AgentSession, EndReason, SessionConfig, SessionState, request_summary


class CounterWorld(World):
    def __init__(self, seed: int) -> None:
        self.value = seed

    def execute(self, name, arguments):
        if name != "add":
            raise ToolError(f"unknown tool {name}")
        if arguments["n"] > 100:
            raise ToolError("n too large")
        self.value += arguments["n"]
        return f"value is now {self.value}"

    def digest(self):
        return str(self.value)


class CounterFamily(ScenarioFamily):
    name = "counter"
    description = "add numbers"
    system_prompt = "You add numbers."
    tools = (
        ToolSpec(
            "add",
            "Add n.",
            {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
        ),
    )

    def build_world(self, seed):
        return CounterWorld(seed)

    def make_task(self, world, seed):
        return Task("counter", seed, f"Add 3 to {seed}.")

    def solved(self, task, world):
        return world.value == task.seed + 3

    def expert_step(self, task: Task, seen: list[Observation]) -> Step:
        return Step(final="done") if seen else Step(calls=(ToolAction("add", {"n": 3}),))


def resp(content="", calls=(), finish="stop"):
    return AssembledResponse(
        content=content, finish_reason=finish, tool_calls=[ToolCall(i, f"c{i}", n, a) for i, (n, a) in enumerate(calls)]
    )


def make(**kw):
    return AgentSession("s1", CounterFamily(), 5, SessionConfig(model="m", **kw))


def test_request_shape_and_thinking_flag():
    s = make(thinking=True)
    body = s.next_request()
    assert body["tool_choice"] == "auto" and body["tools"][0]["function"]["name"] == "add"
    assert body["chat_template_kwargs"] == {"thinking": True}
    assert body["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert s.state is SessionState.AWAITING
    with pytest.raises(AssertionError):
        s.next_request()


def test_tool_call_runs_against_world_then_final_answer_ends():
    s = make()
    s.next_request()
    s.observe(TurnStatus.OK, resp(calls=[("add", '{"n": 3}')], finish="tool_calls"), [])
    assert s.world.digest() == "8"
    assert s.messages[-1] == {"role": "tool", "tool_call_id": "c0", "content": "value is now 8"}
    assert s.messages[-2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"n": 3}'}
    body = s.next_request()
    assert len(body["messages"]) == 4
    s.observe(TurnStatus.OK, resp(content="8"), [])
    assert s.done and s.end_reason is EndReason.FINAL and s.turn == 2 and s.tool_calls_run == 1


@pytest.mark.parametrize(
    "name,args,expect",
    [
        ("add", '{"n": ', "not valid JSON"),
        ("add", "[3]", "must be a JSON object"),
        ("add", '{"n": "3"}', "invalid arguments at $.n"),
        ("add", '{"n": 500}', "error: n too large"),
        ("mul", '{"n": 3}', "unknown tool 'mul'"),
    ],
)
def test_bad_calls_get_error_results_and_the_world_is_untouched(name, args, expect):
    s = make()
    s.next_request()
    s.observe(TurnStatus.OK, resp(calls=[(name, args)], finish="tool_calls"), [])
    assert expect in s.messages[-1]["content"]
    assert s.world.digest() == "5" and not s.done


def test_corrupt_turn_without_calls_continues_with_a_nudge():
    s = make()
    s.next_request()
    s.observe(TurnStatus.OK, resp(content="<｜DSML｜tool_calls>"), [Verdict("dsml_leak_content", "x")])
    assert not s.done and s.messages[-1]["role"] == "user" and "dsml_leak_content" in s.messages[-1]["content"]


def test_corrupt_turn_stops_when_configured():
    s = make(on_corrupt="stop")
    s.next_request()
    s.observe(TurnStatus.OK, resp(content="x"), [Verdict("garbled_text", "x")])
    assert s.done and s.end_reason is EndReason.CORRUPT


@pytest.mark.parametrize(
    "status,reason",
    [(TurnStatus.KILLED, EndReason.KILLED), (TurnStatus.ERROR, EndReason.ERROR), (TurnStatus.TIMEOUT, EndReason.ERROR)],
)
def test_non_ok_turns_end_the_session(status, reason):
    s = make()
    s.next_request()
    s.observe(status, None, [])
    assert s.done and s.end_reason is reason


def test_max_turns_cuts_off():
    s = make(max_turns=2)
    for _ in range(2):
        s.next_request()
        s.observe(TurnStatus.OK, resp(calls=[("add", '{"n": 1}')], finish="tool_calls"), [])
    assert s.done and s.end_reason is EndReason.MAX_TURNS


def used(prompt, completion, calls=(), content=""):
    r = resp(content=content, calls=calls, finish="tool_calls" if calls else "stop")
    r.usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return r


def test_session_ends_context_full_when_the_next_turn_would_not_fit():
    # 1,000 tokens used + "value is now 8" (14 chars: 7 tokens at 2 chars each) + one message's
    # markup (16) + max_tokens 100 = 1,123: the turn after fits a context of 1,123, not 1,122.
    for context, ends in ((1123, False), (1122, True)):
        s = make(max_tokens=100, context_tokens=context)
        s.next_request()
        s.observe(TurnStatus.OK, used(990, 10, calls=[("add", '{"n": 3}')]), [])
        assert s.done is ends and s.end_reason is (EndReason.CONTEXT_FULL if ends else None)
        assert s.world.digest() == "8"  # the call of the last turn still ran


def test_without_usage_or_a_known_context_the_session_goes_on():
    s = make(max_tokens=100)  # context unknown
    s.next_request()
    s.observe(TurnStatus.OK, used(10**6, 10, calls=[("add", '{"n": 3}')]), [])
    assert not s.done
    s = make(max_tokens=100, context_tokens=200)
    s.next_request()
    s.observe(TurnStatus.OK, resp(calls=[("add", '{"n": 3}')], finish="tool_calls"), [])  # no usage
    assert not s.done


def test_request_summary_is_small_and_exact():
    s = make()
    body = s.next_request()
    summary = request_summary(body)
    assert summary == {
        "key": request_key(body),
        "temperature": 0.0,
        "messages": 2,
        "prompt_chars": len("You add numbers.") + len("Add 3 to 5."),
        "tools": 1,
        "stream": True,
        "max_tokens": 1024,
        "terms": {
            "tool_choice": "auto",
            "named_tool": None,
            "parallel_tool_calls": None,
            "thinking": False,
            "reasoning_effort": None,
            "stop": [],
        },
    }
    assert json.dumps(summary)


def test_a_final_answer_that_only_differs_from_the_reference_still_ends_the_session():
    """reference_mismatch is corruption in the verdict, but the reply is well formed: no nudge."""
    s = make()
    s.next_request()
    s.observe(TurnStatus.OK, resp(content="the answer is 9"), [Verdict("reference_mismatch", "x")])
    assert s.done and s.end_reason is EndReason.FINAL


def test_config_validates():
    with pytest.raises(ValueError):
        SessionConfig(model="m", max_turns=0)
    with pytest.raises(ValueError):
        SessionConfig(model="m", on_corrupt="maybe")
