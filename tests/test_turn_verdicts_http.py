"""A call cut at the token cap and a streamed name sent twice, read over real HTTP on loopback by
`agents`' chat_turn and judged as the driver judges a turn: the same verdicts as the literal
fixtures (tests/checks/test_protocol.py, tests/test_sse.py), streamed and not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anyio

from dsv4bench.checks import run_checks
from dsv4bench.wire.client import chat_turn
from dsv4bench.harness.config import RunConfig
from dsv4bench.harness.driver import make_client
from dsv4bench.history.records import TurnStatus, Verdict
from dsv4bench.wire.turn_answer import Deadlines
from dsv4bench.harness.turn_judge import request_context

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


def judged(body: dict[str, Any], content_type: bytes, answer: bytes) -> list[Verdict]:
    """The verdicts on the answer to `body` from a server that sends `answer` once."""
    out = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0
            )
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                % (content_type, len(answer))
                + answer
            )
            await writer.drain()
        finally:
            writer.close()

    async def main() -> None:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        try:
            async with make_client(RunConfig(url=url + "/v1", concurrency=1)) as client:
                out.append(await chat_turn(client, url + "/v1/chat/completions", body, Deadlines(5, 5)))
        finally:
            srv.close()
            await srv.wait_closed()

    anyio.run(main)
    assert out[0].status is TurnStatus.OK, out[0].error
    verdicts, errors = run_checks(request_context(body, out[0]))
    assert errors == []
    return verdicts


def sse(*deltas: dict[str, Any], finish: str, completion_tokens: int) -> bytes:
    """An SSE answer: one chunk per delta, the finish chunk, the usage chunk, [DONE]."""
    chunks = [{"id": "r1", "model": "m", "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({"id": "r1", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append(
        {
            "id": "r1",
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 50, "completion_tokens": completion_tokens},
        }
    )
    return b"".join(b"data: %s\n\n" % json.dumps(c).encode() for c in chunks) + b"data: [DONE]\n\n"


def call(args: str, name: str | None = None, call_id: str | None = None) -> dict[str, Any]:
    tc: dict[str, Any] = {"index": 0, "function": {"arguments": args}}
    if name is not None:
        tc["function"]["name"] = name
    if call_id is not None:
        tc["id"] = call_id
    return {"tool_calls": [tc]}


STREAMED = {
    "model": "m",
    "messages": [{"role": "user", "content": "Read a.py"}],
    "tools": TOOLS,
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 32,
}


def test_a_streamed_call_cut_at_the_cap_with_its_name_sent_twice() -> None:
    answer = sse(
        call("", "read_file", "c0"), call('{"path": "a.py"}', "read_file"), finish="tool_calls", completion_tokens=32
    )
    verdicts = judged(STREAMED, b"text/event-stream", answer)
    assert sorted((v.code, v.detail) for v in verdicts) == [
        ("finish_reason_mismatch", "completion_tokens 32 reached max_tokens 32 but finish_reason 'tool_calls'"),
        (
            "stream_protocol",
            "tool_calls[0]: function name 'read_file' sent again in chunk 2 (a client that joins "
            "deltas reads 'read_fileread_file')",
        ),
    ]


def test_the_same_call_sent_as_servers_send_it_under_the_cap_is_clean() -> None:
    answer = sse(
        call("", "read_file", "c0"),
        call('{"path": ', call_id="c0"),
        call('"a.py"}'),
        finish="tool_calls",
        completion_tokens=31,
    )
    assert judged(STREAMED, b"text/event-stream", answer) == []


def test_an_unstreamed_call_cut_at_max_completion_tokens_that_says_stop() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Read a.py"}],
        "tools": TOOLS,
        "max_completion_tokens": 32,
    }

    def answer(finish: str, completion_tokens: int) -> bytes:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
            ],
        }
        return json.dumps(
            {
                "id": "r1",
                "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 50, "completion_tokens": completion_tokens},
            }
        ).encode()

    [v] = judged(body, b"application/json", answer("stop", 32))
    assert (v.code, v.detail) == (
        "finish_reason_mismatch",
        "completion_tokens 32 reached max_tokens 32 but finish_reason 'stop'",
    )
    assert judged(body, b"application/json", answer("tool_calls", 31)) == []
    [v] = judged(body, b"application/json", answer("length", 32))
    assert v.code == "truncated"
