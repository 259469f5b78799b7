"""`engine serve --tool-call-parser sglang`: SGLang's own DeepSeek-V4 detector parses the engine's
tool calls, so a streamed call arrives whole, at the event that generated its closing tag."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from dsv4bench.agents import get_family
from dsv4bench.cli import app
from dsv4bench.engine import sglang_tool_calls
from dsv4bench.engine.config import EngineConfig
from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.prepared_request import PreparedRequest
from dsv4bench.engine.request import FinishReason
from dsv4bench.engine.server_loop import TokenEvent
from dsv4bench.engine.sglang_tool_calls import sglang_missing
from dsv4bench.engine.tokenizer import load_tokenizer
from dsv4bench.harness.session import AgentSession, SessionConfig
from dsv4bench.wire.sse import DeltaAssembler

installed = pytest.mark.skipif(sglang_missing() is not None, reason=sglang_missing() or "")

# The shipped model's greedy output for the first turn of the ops session of seed 0 (as in
# test_stream_parse_fault.py), with a line of prose before it.
RECORDED = (
    'Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="list_services">\n'
    '<｜DSML｜parameter name="status" string="true">any</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="include_dependencies" string="false">true</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)
CALL = {"name": "list_services", "arguments": {"status": "any", "include_dependencies": True}}


@pytest.fixture(scope="module")
def fe() -> Frontend:
    return Frontend(load_tokenizer(), tool_call_parser="sglang")


@pytest.fixture(scope="module")
def body() -> dict[str, Any]:
    return AgentSession("s", get_family("ops"), 0, SessionConfig(model="dsv4-mini")).next_request()


def events(
    fe: Frontend, req: PreparedRequest, chunks: list[list[int]], fed: list[int] | None = None
) -> AsyncIterator[TokenEvent]:
    """The engine's events carrying `chunks`, then EOS with the finish; `fed[0]`: the one last sent."""
    fed = [0] if fed is None else fed

    async def gen() -> AsyncIterator[TokenEvent]:
        for k, chunk in enumerate(chunks):
            fed[0] = k
            yield TokenEvent(chunk, None, len(req.prompt_ids), 0)
        fed[0] = len(chunks)
        yield TokenEvent([fe.tokenizer.eos_token_id], FinishReason.STOP, len(req.prompt_ids), 0)

    return gen()


def payloads(fe: Frontend, req: PreparedRequest, chunks: list[list[int]]) -> list[tuple[int, dict[str, Any]]]:
    """Each chunk streamed, with the index of the engine event it came out of."""
    fed = [0]

    async def run() -> list[tuple[int, str]]:
        return [(fed[0], p) async for p in fe.stream_chat(req, events(fe, req, chunks, fed))]

    return [(k, json.loads(p)) for k, p in asyncio.run(run()) if p != "[DONE]"]


def call_deltas(streamed: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    return [(k, tc) for k, c in streamed for choice in c["choices"] for tc in choice["delta"].get("tool_calls") or []]


def content(streamed: list[tuple[int, dict[str, Any]]]) -> str:
    return "".join(ch["delta"].get("content") or "" for _, c in streamed for ch in c["choices"])


@installed
def test_a_streamed_call_arrives_whole_at_its_closing_tag(fe, body):
    req = fe.prepare_chat(body)
    ids = fe.tokenizer.encode(RECORDED)
    streamed = payloads(fe, req, [[i] for i in ids])
    [(at, delta)] = call_deltas(streamed)
    assert delta["index"] == 0 and delta["id"].startswith("call_") and delta["type"] == "function"
    assert {"name": delta["function"]["name"], "arguments": json.loads(delta["function"]["arguments"])} == CALL
    closing = next(k for k in range(len(ids)) if fe.tokenizer.decode(ids[: k + 1]).endswith("</｜DSML｜invoke>"))
    assert at == closing  # the event whose token completed `</｜DSML｜invoke>`
    # The detector held the markup back: no chunk for those events, none carries any of it.
    assert content(streamed) == "Checking." and len(streamed) < len(ids) / 2
    asm = DeltaAssembler()
    for _, c in streamed:
        asm.feed(json.dumps(c))
    asm.feed("[DONE]")
    resp = asm.finish()
    assert (resp.content, resp.finish_reason, resp.protocol_errors) == ("Checking.", "tool_calls", [])


@installed
def test_no_chunk_carries_markup_whatever_the_chunking(fe, body):
    req = fe.prepare_chat(body)
    ids = fe.tokenizer.encode(RECORDED)
    for chunking in ([ids[:i], ids[i:]] for i in range(1, len(ids))):
        streamed = payloads(fe, req, chunking)
        [(_, delta)] = call_deltas(streamed)
        assert content(streamed) == "Checking." and json.loads(delta["function"]["arguments"]) == CALL["arguments"]


@installed
def test_a_call_arrives_when_its_invoke_closes_not_before(fe, body):
    req = fe.prepare_chat(body)
    head, tail = RECORDED.split("</｜DSML｜invoke>")
    ids_head, ids_tail = fe.tokenizer.encode(head), fe.tokenizer.encode("</｜DSML｜invoke>" + tail)
    streamed = payloads(fe, req, [ids_head, ids_tail])
    [(at, _)] = call_deltas(streamed)
    # The prose came in the event that began the block, so SGLang held it back with the markup.
    assert at == 1 and content([(k, c) for k, c in streamed if k == 0]) == ""
    assert content([(k, c) for k, c in streamed if k == 1]) == "Checking."


@installed
def test_a_non_streamed_answer_is_parsed_whole(fe, body):
    req = fe.prepare_chat({**{k: v for k, v in body.items() if k != "stream_options"}, "stream": False})
    ids = fe.tokenizer.encode(RECORDED)
    response = asyncio.run(fe.complete_chat(req, events(fe, req, [[i] for i in ids])))
    assert response is not None
    [choice] = response["choices"]
    [call] = choice["message"]["tool_calls"]
    assert {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])} == CALL
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Checking.", "tool_calls")


@installed
def test_tool_choice_none_parses_nothing(fe, body):
    req = fe.prepare_chat({**body, "tool_choice": "none"})
    streamed = payloads(fe, req, [fe.tokenizer.encode(RECORDED)])
    assert not call_deltas(streamed) and "<｜DSML｜invoke" in content(streamed)


def test_the_parser_is_a_checked_engine_setting(monkeypatch):
    assert EngineConfig().tool_call_parser == "deepseek-recipe"
    with pytest.raises(ValueError, match="tool-call parser must be one of deepseek-recipe, sglang"):
        EngineConfig(tool_call_parser="vllm")
    monkeypatch.setattr(
        sglang_tool_calls, "_sglang", lambda: "SGLang's parser not installed (No module named 'sglang')"
    )
    result = CliRunner().invoke(app, ["engine", "serve", "--tool-call-parser", "sglang"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.stderr
    assert "--tool-call-parser sglang: SGLang's parser not installed" in lines[0]
    assert "requirements-sglang-parsers.txt" in lines[0]


@installed
def test_the_http_server_streams_sglangs_shape():
    from dsv4bench.engine.server import ServerConfig, build_app

    from .fake_engine import FakeEngine
    from .test_frontend import TOOLS, USER
    from .pd.helpers import ServerThread
    from .test_server import MODEL
    from .test_tokenizer import DSML_CALL

    tok = load_tokenizer()
    engine = FakeEngine(tok.encode("\n\n" + DSML_CALL), tok.eos_token_id, max_context=4096, chunk=1)
    srv = ServerThread(
        build_app(engine, Frontend(tok, MODEL, 4096, tool_call_parser="sglang"), ServerConfig(model_name=MODEL))
    )
    try:
        with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x") as client:
            chunks = list(client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, stream=True))
            whole = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS)
    finally:
        srv.stop()
    deltas = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []]
    assert len(deltas) == 1 and deltas[0].function.name == "read_file"
    assert json.loads(deltas[0].function.arguments) == {"path": "src/main.py", "start_line": 12}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(ch.delta.content or "" for c in chunks for ch in c.choices).strip()
    [call] = whole.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"path": "src/main.py", "start_line": 12}
