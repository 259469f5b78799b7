"""The `parser-split` fault's parse (engine/stream_parse_fault.py) against deepseek-recipe's,
over every split point of a recorded model output, judged by the harness's own checkers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dsv4bench.agents import get_family
from dsv4bench.checks import run_checks
from dsv4bench.checks.dsml import find_dsml
from dsv4bench.engine.server_loop import TokenEvent
from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.prepared_request import PreparedRequest
from dsv4bench.engine.outputs import ChatOutput
from dsv4bench.engine.request import FinishReason
from dsv4bench.engine.stream_parse_fault import BLOCK_OPEN, EagerDsmlParser, EagerParseChatOutput
from dsv4bench.engine.tokenizer import load_tokenizer
from dsv4bench.history.records import AssembledResponse, GivenText, TurnContext
from dsv4bench.harness.session import AgentSession, SessionConfig
from dsv4bench.wire.sse import DeltaAssembler

# The shipped model's greedy output for the first turn of the ops session of seed 0 (without
# its EOS); the tokenizer encodes this text back to exactly the ids the model sampled.
RECORDED = (
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="list_services">\n'
    '<｜DSML｜parameter name="status" string="true">any</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="include_dependencies" string="false">true</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)
CALL = ("list_services", {"status": "any", "include_dependencies": True})


@pytest.fixture(scope="module")
def fe() -> Frontend:
    return Frontend(load_tokenizer())


@pytest.fixture(scope="module")
def session() -> AgentSession:
    return AgentSession("s", get_family("ops"), 0, SessionConfig(model="dsv4-mini"))


@pytest.fixture(scope="module")
def req(fe: Frontend, session: AgentSession) -> PreparedRequest:
    return fe.prepare_chat(session.next_request())


@pytest.fixture(scope="module")
def ids(fe: Frontend) -> list[int]:
    return fe.tokenizer.encode(RECORDED)


def streamed(
    fe: Frontend, req: PreparedRequest, chunks: list[list[int]], output: type[ChatOutput] = ChatOutput
) -> AssembledResponse:
    """The harness's assembly of the SSE payloads when the engine's events carry `chunks`,
    then EOS with the finish, as the engine sends them."""

    async def events() -> AsyncIterator[TokenEvent]:
        for chunk in chunks:
            yield TokenEvent(chunk, None, len(req.prompt_ids), 0)
        yield TokenEvent([fe.tokenizer.eos_token_id], FinishReason.STOP, len(req.prompt_ids), 0)

    async def payloads() -> list[str]:
        return [p async for p in fe.stream_chat(req, events(), output)]

    asm = DeltaAssembler()
    for payload in asyncio.run(payloads()):
        asm.feed(payload)
    return asm.finish()


def calls(resp: AssembledResponse) -> list[tuple[str | None, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in resp.tool_calls]


def opener_span(fe: Frontend, ids: list[int]) -> range:
    """Token positions i where splitting the ids as [:i], [i:] cuts the block opener."""
    text = fe.tokenizer.decode
    start = next(i for i in range(len(ids)) if text(ids[: i + 1]).endswith("<"))
    end = next(i for i in range(start, len(ids) + 1) if text(ids[:i]).endswith(BLOCK_OPEN))
    assert text(ids[start:end]) == BLOCK_OPEN and end - start > 1, "the opener spans several tokens"
    return range(start + 1, end)


def test_recorded_output_is_one_well_formed_call(fe, req, ids):
    resp = streamed(fe, req, [[i] for i in ids])
    assert calls(resp) == [CALL] and resp.finish_reason == "tool_calls" and resp.content == ""


def test_clean_parse_gives_the_same_turn_for_every_chunking(fe, req, ids):
    expected = streamed(fe, req, [[i] for i in ids])
    chunkings = [[ids[:i], ids[i:]] for i in range(1, len(ids))]
    chunkings += [[ids[i : i + k] for i in range(0, len(ids), k)] for k in (2, 3, 5, 8, len(ids))]
    for chunks in chunkings:
        resp = streamed(fe, req, chunks)
        assert (resp.content, calls(resp), resp.finish_reason) == (expected.content, calls(expected), "tool_calls"), [
            fe.tokenizer.decode(c) for c in chunks
        ]


def test_eager_parse_leaks_exactly_the_openers_cut_across_chunks(fe, req, ids):
    inside = opener_span(fe, ids)
    for i in range(1, len(ids)):
        resp = streamed(fe, req, [ids[:i], ids[i:]], EagerParseChatOutput)
        assert calls(resp) == [CALL] and resp.finish_reason == "tool_calls", i
        if i in inside:  # the opener's pieces before the cut went out as content
            assert resp.content == fe.tokenizer.decode(ids[inside.start - 1 : i]), i
        else:
            assert resp.content == "", i


def test_one_token_per_event_leaks_the_opener_on_every_tool_call(fe, req, ids):
    resp = streamed(fe, req, [[i] for i in ids], EagerParseChatOutput)
    assert resp.content == BLOCK_OPEN[:-1] and calls(resp) == [CALL]  # leading newlines: dropped by the recipe
    assert [m.kind for m in find_dsml(resp.content)] == ["DSML tag <tool_calls>"]


def test_the_harness_flags_the_leak_as_dsml_leak_content(fe, req, ids, session):
    # judged as a run judges it: with the text the session's request gave the model
    given = GivenText.of_body(AgentSession("s", get_family("ops"), 0, SessionConfig(model="dsv4-mini")).next_request())

    def codes(resp: AssembledResponse) -> list[str]:
        verdicts, errors = run_checks(TurnContext(response=resp, tools=session.schemas, max_tokens=1024, given=given))
        assert not errors
        return sorted(v.code for v in verdicts)

    per_token = [[i] for i in ids]
    assert codes(streamed(fe, req, per_token, EagerParseChatOutput)) == ["dsml_leak_content"]
    assert codes(streamed(fe, req, per_token)) == []
    assert codes(streamed(fe, req, [ids], EagerParseChatOutput)) == []  # the opener whole in one chunk


def test_eager_parser_on_literal_chunks():
    p = EagerDsmlParser()
    assert p.feed('Checking. <｜DSML｜tool_calls>\n<｜DSML｜invoke name="a">') == ("Checking. ", [])
    text, got = p.feed(
        '<｜DSML｜parameter name="q" string="true">日本</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="n" string="false">[1, 2</｜DSML｜parameter></｜DSML｜invoke>\n<｜DSML｜in'
    )
    assert text == "" and [c["function"] for c in got] == [{"name": "a", "arguments": '{"q": "日本", "n": [1, 2}'}]
    text, got = p.feed('voke name="b">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls> done')
    assert text == " done" and [(c["index"], c["function"]["name"]) for c in got] == [(1, "b")]
    assert got[0]["id"].startswith("call_01_") and p.block is None


def test_eager_parser_can_start_inside_the_block():
    p = EagerDsmlParser(starts_in_block=True)  # tool_choice=required: the prompt opened the block
    text, got = p.feed('<｜DSML｜invoke name="x">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
    assert text == "" and got[0]["function"] == {"name": "x", "arguments": "{}"}
