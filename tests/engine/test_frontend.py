"""Frontend: OpenAI bodies -> engine requests, engine events -> OpenAI chunks (deepseek-recipe)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dsv4bench.engine.frontend import Frontend, RequestError
from dsv4bench.engine.prepared_request import PreparedRequest
from dsv4bench.engine.request import FinishReason
from dsv4bench.engine.tokenizer import load_tokenizer

from .fake_engine import TokenEvent
from .test_tokenizer import DSML_CALL

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
]
USER = [{"role": "user", "content": "Read src/main.py from line 12."}]
ABORT = object()  # in a script: an ABORT event instead of the finish


@pytest.fixture(scope="module")
def fe() -> Frontend:
    return Frontend(load_tokenizer(), model_name="dsv4-mini", max_context=4096)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "dsv4-mini", "messages": USER, "tools": TOOLS, **extra}


async def events(
    fe: Frontend, req: PreparedRequest, text: str, *, step: int = 3, end: object = FinishReason.STOP, cached: int = 0
) -> AsyncIterator[TokenEvent]:
    ids = fe.tokenizer.encode(text)
    n = len(req.prompt_ids)
    for i in range(0, len(ids), step):
        yield TokenEvent(ids[i : i + step], None, n, cached)
    if end is ABORT:
        yield TokenEvent([], FinishReason.ABORT, n, cached)
    else:
        yield TokenEvent([fe.tokenizer.eos_token_id] if end is FinishReason.STOP else [], end, n, cached)


def stream(fe: Frontend, req: PreparedRequest, text: str, **kw: Any) -> list[str]:
    async def run() -> list[str]:
        return [p async for p in fe.stream_chat(req, events(fe, req, text, **kw))]

    return asyncio.run(run())


def assembled(payloads: list[str]) -> dict[str, Any]:
    """Content, tool call arguments, finish_reason and usage chunks of a chunk stream."""
    out: dict[str, Any] = {"content": "", "args": "", "names": [], "finish": None, "usage": []}
    for p in payloads:
        if p == "[DONE]":
            continue
        d = json.loads(p)
        if "usage" in d and d["usage"] is not None:
            out["usage"].append(d)
        for c in d["choices"]:
            out["content"] += c["delta"].get("content") or ""
            for tc in c["delta"].get("tool_calls") or []:
                out["names"] += [tc["function"]["name"]] if tc["function"].get("name") else []
                out["args"] += tc["function"].get("arguments") or ""
            out["finish"] = c["finish_reason"] or out["finish"]
    return out


def test_thinking_comes_from_chat_template_kwargs(fe):
    off = fe.prepare_chat(chat())
    on = fe.prepare_chat(chat(chat_template_kwargs={"thinking": True}))
    alt = fe.prepare_chat(chat(chat_template_kwargs={"enable_thinking": True}))
    think, think_end = fe.tokenizer.special_id("ThinkingStart"), fe.tokenizer.special_id("ThinkingEnd")
    assert not off.thinking and off.prompt_ids[-1] == think_end
    assert on.thinking and alt.thinking and on.prompt_ids[-1] == think
    with pytest.raises(RequestError) as e:
        fe.prepare_chat(chat(chat_template_kwargs={"thinking": "yes"}))
    assert e.value.param == "chat_template_kwargs"


def test_any_model_name_is_served_and_echoed(fe):
    req = fe.prepare_chat(chat(model="gpt-4o"))
    assert req.model == "gpt-4o" and req.rid.startswith("chatcmpl-")
    assert json.loads(stream(fe, fe.prepare_chat(chat(model="gpt-4o", stream=True)), "hi")[0])["model"] == "gpt-4o"


def test_sampling_and_max_tokens(fe):
    req = fe.prepare_chat(chat(temperature=0, top_p=0.5, seed=7, chat_template_kwargs={"thinking": True}))
    assert (req.params.temperature, req.params.top_p, req.params.seed) == (0.0, 0.5, 7)  # explicit values win
    assert fe.prepare_chat(chat()).params.temperature == 1.0
    assert req.params.max_tokens == 4096 - len(req.prompt_ids)  # unset: lowered to the context left
    assert fe.prepare_chat(chat(max_tokens=100)).params.max_tokens == 100
    assert fe.prepare_chat(chat(max_completion_tokens=50)).params.max_tokens == 50


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": USER, "max_tokens": -1}, "max_tokens"),
        ({"messages": USER, "max_tokens": "5"}, "max_tokens"),
        ({"messages": USER, "temperature": "hot"}, "temperature"),
        ({"messages": USER, "temperature": 3}, "temperature"),
        ({"messages": USER, "stream": "yes"}, "stream"),
        ({"model": "dsv4-mini"}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": USER, "max_tokens": 4090}, "max_tokens"),  # prompt + max_tokens over the context
        ({"messages": [{"role": "user", "content": "word " * 5000}]}, "messages"),
        ({"messages": USER, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (
            {"messages": USER, "tools": TOOLS, "tool_choice": "required", "chat_template_kwargs": {"thinking": True}},
            "tool_choice",
        ),
        ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, None),
    ],
)
def test_bad_chat_bodies_are_4xx(fe, body, param):
    with pytest.raises(RequestError) as e:
        fe.prepare_chat(body)
    assert 400 <= e.value.status < 500 and e.value.body()["error"]["type"] == "invalid_request_error"
    if param:
        assert e.value.param == param


CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "read_file", "arguments": '{"path":"a.py","start_line":3}'},
}
TURNS = [
    *USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "print(1)"}]},
]


def test_sdk_message_shapes_render_as_sglang_renders_them(fe):
    """The OpenAI SDK's `developer` role is a system message, and tool-call arguments sent as an
    object are their JSON text (SGLang's DeepSeek-V4 serving reads both so; the recipe alone
    refuses them)."""

    def prompt(messages: list[dict[str, Any]]) -> list[int]:
        return fe.prepare_chat(chat(messages=messages)).prompt_ids

    as_system = prompt([{"role": "system", "content": "Be terse."}, *USER])
    assert prompt([{"role": "developer", "content": "Be terse."}, *USER]) == as_system
    as_object = {**CALL, "function": {**CALL["function"], "arguments": {"path": "a.py", "start_line": 3}}}
    assert prompt([*TURNS[:1], {**TURNS[1], "tool_calls": [as_object]}, TURNS[2]]) == prompt(TURNS)


def test_tool_choice_forms(fe):
    tc = fe.tokenizer.encode("<｜DSML｜tool_calls>")
    for choice in ("required", {"type": "function", "function": {"name": "read_file"}}):
        req = fe.prepare_chat(chat(tool_choice=choice))
        assert req.prompt_ids[-len(tc) - 1 : -1] == tc  # the prompt opens the block
        out = assembled(stream(fe, fe.prepare_chat(chat(tool_choice=choice, stream=True)), DSML_CALL.split(">", 1)[1]))
        assert out["names"] == ["read_file"] and out["finish"] == "tool_calls"
    none = assembled(stream(fe, fe.prepare_chat(chat(tool_choice="none", stream=True)), "just text"))
    assert none["content"] == "just text" and not none["names"]


def test_stream_parses_a_tool_call_without_usage_by_default(fe):
    payloads = stream(fe, fe.prepare_chat(chat(stream=True)), "\n\n" + DSML_CALL, step=2)
    out = assembled(payloads)
    assert payloads[-1] == "[DONE]"
    assert out["names"] == ["read_file"] and json.loads(out["args"]) == {"path": "src/main.py", "start_line": 12}
    assert out["finish"] == "tool_calls" and out["content"] == "" and out["usage"] == []
    assert all("usage" not in json.loads(p) for p in payloads[:-1])


def test_include_usage_gives_a_final_usage_chunk(fe):
    req = fe.prepare_chat(chat(stream=True, stream_options={"include_usage": True}))
    payloads = stream(fe, req, "Done.", cached=64)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    n_out = len(fe.tokenizer.encode("Done.")) + 1  # EOS counts as a completion token
    assert usage["prompt_tokens"] == len(req.prompt_ids) and usage["completion_tokens"] == n_out
    assert usage["prompt_tokens_details"]["cached_tokens"] == 64


def test_eos_never_reaches_content(fe):
    out = assembled(stream(fe, fe.prepare_chat(chat(stream=True)), "你好，世界", step=1))
    assert out["content"] == "你好，世界" and out["finish"] == "stop"


def test_stop_string_cuts_and_ends_early(fe):
    req = fe.prepare_chat(chat(stream=True, stop=["STOP"]))
    payloads = stream(fe, req, "keep this STOP not this", step=1)
    out = assembled(payloads)
    assert out["content"].rstrip() == "keep this" and out["finish"] == "stop" and payloads[-1] == "[DONE]"


def test_abort_ends_without_finish_or_done(fe):
    payloads = stream(fe, fe.prepare_chat(chat(stream=True)), "partial answer", end=ABORT)
    assert "[DONE]" not in payloads and assembled(payloads)["finish"] is None


def test_length_finish(fe):
    out = assembled(stream(fe, fe.prepare_chat(chat(stream=True)), "cut sh", end=FinishReason.LENGTH))
    assert out["finish"] == "length"


def test_non_stream_accumulates_one_message(fe):
    req = fe.prepare_chat(chat())
    body = asyncio.run(fe.complete_chat(req, events(fe, req, DSML_CALL)))
    msg = body["choices"][0]["message"]
    assert body["id"] == req.rid and body["object"] == "chat.completion"
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"])["path"] == "src/main.py"
    assert body["choices"][0]["finish_reason"] == "tool_calls" and body["usage"]["prompt_tokens"] == len(req.prompt_ids)
    assert asyncio.run(fe.complete_chat(req, events(fe, req, "x", end=ABORT))) is None


def test_reasoning_in_thinking_mode(fe):
    req = fe.prepare_chat(chat(chat_template_kwargs={"thinking": True}))
    msg = asyncio.run(fe.complete_chat(req, events(fe, req, "Look first.</think>It is fine.")))["choices"][0]["message"]
    assert msg["reasoning_content"] == "Look first." and msg["content"] == "It is fine."


def completion(fe: Frontend, text: str, **body: Any) -> tuple[dict[str, Any], list[str]]:
    req = fe.prepare_completion({"prompt": "<｜User｜>hi<｜Assistant｜></think>", **body})
    whole = asyncio.run(fe.complete_completion(req, events(fe, req, text, step=1)))

    async def run() -> list[str]:
        sreq = fe.prepare_completion({"prompt": "x", "stream": True, **body})
        return [p async for p in fe.stream_completion(sreq, events(fe, sreq, text, step=1))]

    return whole, asyncio.run(run())


def test_completion_keeps_special_tokens_when_asked(fe):
    req = fe.prepare_completion({"prompt": "<｜User｜>hi<｜Assistant｜>"})
    assert req.prompt_ids[0] == fe.tokenizer.special_id("User") and req.rid.startswith("cmpl-")
    whole, chunks = completion(fe, "ok</think>" + DSML_CALL, skip_special_tokens=False)
    assert whole["choices"][0]["text"] == "ok</think>" + DSML_CALL  # EOS trimmed, as SGLang does
    assert "".join(json.loads(c)["choices"][0]["text"] for c in chunks[:-1]) == "ok</think>" + DSML_CALL
    plain, _ = completion(fe, "ok</think>done")
    assert plain["choices"][0]["text"] == "okdone"


def test_completion_stop_strings_and_utf8(fe):
    whole, chunks = completion(fe, "数据库 ok END more", stop=["END"])
    assert whole["choices"][0]["text"] == "数据库 ok " and whole["choices"][0]["finish_reason"] == "stop"
    texts = [json.loads(c)["choices"][0]["text"] for c in chunks[:-1]]
    assert "".join(texts) == "数据库 ok " and all("\ufffd" not in t for t in texts)


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": 5},
        {"prompt": ""},
        {"prompt": "x", "max_tokens": 0},
        {"prompt": "x" * 30000},
        {"prompt": "x", "stop": [""]},
        {"prompt": [99999]},
    ],
)
def test_bad_completion_bodies(fe, body):
    with pytest.raises(RequestError):
        fe.prepare_completion(body)


def test_a_batch_of_one_prompt_is_that_prompt(fe):
    """LangChain's OpenAI LLM sends `prompt` as a list of strings; SGLang takes lists of ids too."""
    ids = fe.tokenizer.encode("def main():")
    for prompt in (["def main():"], [ids]):
        assert fe.prepare_completion({"prompt": prompt}).prompt_ids == ids


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [[1], [2]]}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": "a", "n": 2}, "n"),
    ],
)
def test_completions_that_would_need_several_choices_are_refused(fe, body, param):
    with pytest.raises(RequestError) as e:
        fe.prepare_completion(body)
    assert e.value.status == 400 and e.value.param == param


def test_a_prompt_past_the_context_is_refused_in_plain_words(fe):
    with pytest.raises(RequestError) as e:
        fe.prepare_chat({"messages": [{"role": "user", "content": "word " * 5000}]})
    msg = e.value.body()["error"]["message"]
    assert e.value.status == 400 and "maximum context length is 4096 tokens" in msg
    assert "your prompt has" in msg and "None" not in msg
