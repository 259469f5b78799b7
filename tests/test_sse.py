"""The delta assembler on literal chunk sequences, clean and broken; the bounds on what one
turn may bring in, and the client that enforces them against hostile answers."""

import json
import random

import anyio
import httpx
import pytest

from dsv4bench.wire.client import chat_turn
from dsv4bench.wire.turn_answer import Deadlines, encode_body
from dsv4bench.history.records import TurnStatus
from dsv4bench.wire.sse import DeltaAssembler, assemble_completion
from dsv4bench.wire.stream_reader import BoundExceeded, RawLines, SSEEventReader, StreamBounds, clip_raw


def chunk(delta=None, finish=None, rid="r1", usage=None, choices=True):
    c = {"id": rid, "object": "chat.completion.chunk", "model": "m"}
    c["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    if usage:
        c["usage"] = usage
    return json.dumps(c)


def feed_all(payloads):
    asm = DeltaAssembler()
    carried = [asm.feed(p) for p in payloads]
    return asm.finish(), carried


def test_clean_tool_call_stream_assembles_exactly():
    r, carried = feed_all(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Let me "}),
            chunk({"content": "look."}),
            chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "c0", "type": "function", "function": {"name": "read_file", "arguments": ""}}
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a.py"}'}}]}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "list_dir", "arguments": "{}"},
                        }
                    ]
                }
            ),
            chunk({}, finish="tool_calls"),
            chunk(choices=False, usage={"prompt_tokens": 10, "completion_tokens": 5}),
            "[DONE]",
        ]
    )
    assert r.protocol_errors == []
    assert r.response_id == "r1"
    assert r.content == "Let me look."
    assert [(c.index, c.id, c.name, c.arguments) for c in r.tool_calls] == [
        (0, "c0", "read_file", '{"path": "a.py"}'),
        (1, "c1", "list_dir", "{}"),
    ]
    assert r.finish_reason == "tool_calls"
    assert r.usage == {"prompt_tokens": 10, "completion_tokens": 5}
    assert r.saw_done and r.chunks == 9
    # The role chunk and the finish/usage chunks carry no token; the others do.
    assert carried == [False, True, True, True, True, True, True, False, False, False]


def test_reasoning_content_and_vllm_reasoning_both_assemble():
    r, _ = feed_all(
        [
            chunk({"reasoning_content": "think "}),
            chunk({"reasoning": "more"}),
            chunk({"content": "ok"}, finish="stop"),
            "[DONE]",
        ]
    )
    assert r.reasoning == "think more" and r.content == "ok" and not r.protocol_errors


def test_index_gap_is_a_protocol_error():
    r, _ = feed_all(
        [
            chunk({"tool_calls": [{"index": 1, "id": "c", "function": {"name": "f", "arguments": "{}"}}]}),
            chunk({}, finish="tool_calls"),
            "[DONE]",
        ]
    )
    assert any("index gap" in e for e in r.protocol_errors)


def test_missing_id_or_name_on_first_delta():
    r, _ = feed_all(
        [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
            chunk({}, finish="tool_calls"),
            "[DONE]",
        ]
    )
    assert any("no id" in e for e in r.protocol_errors)
    assert any("no function name" in e for e in r.protocol_errors)


def test_delta_after_finish_and_no_done():
    r, _ = feed_all([chunk({"content": "a"}, finish="stop"), chunk({"content": "b"})])
    assert any("after finish_reason" in e for e in r.protocol_errors)
    assert any("without [DONE]" in e for e in r.protocol_errors)


def test_usage_chunk_after_finish_is_fine():
    r, _ = feed_all([chunk({"content": "a"}, finish="stop"), chunk(choices=False, usage={"x": 1}), "[DONE]"])
    assert r.protocol_errors == []


def test_usage_numbers_json_cannot_hold_are_recorded_as_null():
    # json reads NaN, Infinity and 1e999 (as inf); the history, which is JSON, cannot hold them
    odd = '{"id":"r1","choices":[],"usage":{"prompt_tokens":NaN,"completion_tokens":1e999,"x":[-Infinity,2.5]}}'
    r, _ = feed_all([chunk({"content": "a"}, finish="stop"), odd, "[DONE]"])
    assert r.usage == {"prompt_tokens": None, "completion_tokens": None, "x": [None, 2.5]}
    json.dumps(r.usage, allow_nan=False)
    body = json.loads('{"choices":[{"message":{"content":"a"},"finish_reason":"stop"}],"usage":{"total_tokens":NaN}}')
    assert assemble_completion(body).usage == {"total_tokens": None}


def test_cut_stream_without_finish_is_left_to_truncated():
    r, _ = feed_all([chunk({"content": "a"})])
    assert r.finish_reason is None and r.protocol_errors == [] and not r.saw_done


def test_garbage_chunks_are_findings_not_crashes():
    r, _ = feed_all(
        [
            "{not json",
            "[1,2]",
            json.dumps({"error": {"message": "boom"}}),
            chunk({"content": "x"}, finish="stop"),
            "[DONE]",
            chunk({"content": "late"}),
        ]
    )
    errs = " | ".join(r.protocol_errors)
    assert "not JSON" in errs and "not an object" in errs and "boom" in errs and "after [DONE]" in errs
    assert r.content == "x"


def test_changed_id_and_name_are_flagged():
    r, _ = feed_all(
        [
            chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}, rid="r2"),
            chunk({}, finish="tool_calls"),
            "[DONE]",
        ]
    )
    errs = " | ".join(r.protocol_errors)
    assert "id changed from 'r1'" in errs and "id changed from 'a'" in errs and "name changed" in errs


# --- stream identity: per index, one name sent once, one id, indices in order -------------


def call_delta(index, args="", name=None, call_id=None):
    """A chunk of one tool-call delta (`name`, `call_id`: sent only when given)."""
    tc = {"index": index, "function": {"arguments": args}}
    if name is not None:
        tc["function"]["name"] = name
    if call_id is not None:
        tc["id"], tc["type"] = call_id, "function"
    return chunk({"tool_calls": [tc]})


def identity_errors(*deltas):
    r, _ = feed_all([*deltas, chunk({}, finish="tool_calls"), "[DONE]"])
    return r, r.protocol_errors


CLEAN_IDENTITY = {
    # OpenAI, vLLM and SGLang: name and id in a call's first delta only
    "name and id in the first delta only": [
        call_delta(0, "", "read_file", "c0"),
        call_delta(0, '{"path": '),
        call_delta(0, '"a.py"}'),
    ],
    # SGLang sent the call's id with every delta; a client keeping the first id gets the right one
    "the same id in every delta": [
        call_delta(0, "", "read_file", "c0"),
        call_delta(0, '{"path": ', call_id="c0"),
        call_delta(0, '"a.py"}', call_id="c0"),
    ],
    # vLLM's later deltas may carry an empty id, OpenAI's a null name
    "empty id and null name later": [
        call_delta(0, "", "read_file", "c0"),
        chunk({"tool_calls": [{"index": 0, "id": "", "function": {"name": None, "arguments": '{"path": "a.py"}'}}]}),
    ],
    "parallel calls 0 then 1": [
        call_delta(0, "", "read_file", "c0"),
        call_delta(0, '{"path": "a.py"}'),
        call_delta(1, "", "read_file", "c1"),
        call_delta(1, '{"path": "b.py"}'),
    ],
    "two calls in one chunk, in order": [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c0", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
                    {"index": 1, "id": "c1", "function": {"name": "read_file", "arguments": '{"path": "b.py"}'}},
                ]
            }
        )
    ],
    "a whole call in one delta": [call_delta(0, '{"path": "a.py"}', "read_file", "c0")],
}


@pytest.mark.parametrize("deltas", CLEAN_IDENTITY.values(), ids=CLEAN_IDENTITY.keys())
def test_stream_identity_as_servers_send_it_is_clean(deltas):
    r, errors = identity_errors(*deltas)
    assembled = [(c.id, c.name, json.loads(c.arguments)) for c in r.tool_calls]
    assert errors == [] and assembled in (
        [("c0", "read_file", {"path": "a.py"})],
        [("c0", "read_file", {"path": "a.py"}), ("c1", "read_file", {"path": "b.py"})],
    )


BROKEN_IDENTITY = {
    # vLLM's named tool_choice once did this (vllm-project/vllm#13078): clients read read_fileread_file
    "the same name re-sent": (
        [call_delta(0, "", "read_file", "c0"), call_delta(0, '{"path": "a.py"}', "read_file")],
        "tool_calls[0]: function name 'read_file' sent again in chunk 2 (a client that joins "
        "deltas reads 'read_fileread_file')",
    ),
    "another name sent": (
        [call_delta(0, "", "read_file", "c0"), call_delta(0, "{}", "list_dir")],
        "tool_calls[0]: function name sent again in chunk 2, name changed from 'read_file' to 'list_dir'",
    ),
    "a second id at a used index": (
        [call_delta(0, "{}", "read_file", "c0"), call_delta(0, "{}", call_id="c1")],
        "tool_calls[0]: a second call at index 0 in chunk 2 (id changed from 'c0' to 'c1')",
    ),
    "index 0 after index 1 started": (
        [
            call_delta(0, "", "read_file", "c0"),
            call_delta(1, "", "read_file", "c1"),
            call_delta(0, '{"path": "a.py"}'),
            call_delta(1, '{"path": "b.py"}'),
        ],
        "tool_calls[0]: delta in chunk 3 after tool_calls[1] started (indices out of order)",
    ),
}


@pytest.mark.parametrize(("deltas", "says"), BROKEN_IDENTITY.values(), ids=BROKEN_IDENTITY.keys())
def test_each_stream_identity_breach_is_named(deltas, says):
    _, errors = identity_errors(*deltas)
    assert errors == [says]


def test_a_name_in_every_delta_is_one_finding_per_call():
    deltas = [call_delta(0, "", "read_file", "c0")] + [call_delta(0, "x", "read_file") for _ in range(20)]
    deltas += [call_delta(1, "", "list_dir", "c1"), call_delta(1, "{}", "list_dir")]
    r, errors = identity_errors(*deltas)
    assert [e.split(":")[0] for e in errors] == ["tool_calls[0]", "tool_calls[1]"]
    assert r.tool_calls[0].name == "read_file" and r.tool_calls[0].arguments == "x" * 20


def test_a_second_call_at_a_used_index_names_both_breaches():
    """lmdeploy once sent each parallel call at index 0: a new id, and the name again."""
    _, errors = identity_errors(
        call_delta(0, '{"path": "a.py"}', "read_file", "c0"), call_delta(0, '{"path": "b.py"}', "read_file", "c1")
    )
    assert [e.split(" in chunk")[0] for e in errors] == [
        "tool_calls[0]: a second call at index 0",
        "tool_calls[0]: function name 'read_file' sent again",
    ]


def test_a_call_started_below_a_later_one_is_out_of_order_not_a_gap():
    _, errors = identity_errors(call_delta(1, "{}", "read_file", "c1"), call_delta(0, "{}", "read_file", "c0"))
    assert errors == [
        "chunk 1: tool call index 1 where 0 was next (index gap)",
        "tool_calls[0]: delta in chunk 2 after tool_calls[1] started (indices out of order)",
    ]


def test_stream_identity_breaches_are_stream_protocol_verdicts():
    from dsv4bench.checks import run_checks
    from dsv4bench.history.records import TurnContext

    r, _ = identity_errors(*BROKEN_IDENTITY["the same name re-sent"][0])
    verdicts, errors = run_checks(TurnContext(response=r, tools={"read_file": {}}))
    [v] = verdicts
    assert errors == [] and v.code == "stream_protocol" and v.detail.startswith("tool_calls[0]: function name")


def test_non_stream_body():
    r = assemble_completion(
        {
            "id": "x",
            "choices": [
                {
                    "message": {
                        "content": "hi",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
        }
    )
    assert r.tool_calls[0].arguments == '{"a": 1}' and r.finish_reason == "tool_calls" and not r.stream
    bad = assemble_completion({"choices": []})
    assert bad.protocol_errors == ["response has no choices"]


# --- bounds, surrogates, hostile shapes -------------------------------------------------

SMALL = StreamBounds(
    line_chars=1000,
    event_chars=2000,
    tool_calls=3,
    argument_chars=50,
    text_chars=200,
    body_bytes=5000,
    error_body_bytes=100,
    protocol_errors=4,
    raw_head_chars=100,
    raw_tail_chars=100,
    raw_line_chars=40,
)


def test_reader_stops_a_long_line_before_it_is_whole():
    reader = SSEEventReader(SMALL)
    assert reader.feed('data: {"a":1}\n\n') == ['{"a":1}']
    reader.feed("data: " + "x" * 600)  # no newline yet: pending, under the bound
    with pytest.raises(BoundExceeded) as e:
        reader.feed("x" * 600)
    assert "SSE line longer than 1,000" in e.value.detail and len(e.value.head) == SMALL.raw_line_chars


def test_reader_bounds_one_event_of_many_data_lines():
    reader = SSEEventReader(SMALL)
    with pytest.raises(BoundExceeded, match="SSE event longer"):
        for _ in range(10):
            reader.feed("data: " + "y" * 500 + "\n")


def test_reader_does_not_dispatch_an_event_without_its_blank_line():
    reader = SSEEventReader(SMALL)
    assert reader.feed("data: [DONE]") == [] and reader.flush() == []


def test_reader_drops_a_byte_order_mark_at_the_start_of_the_stream_only():
    reader = SSEEventReader()
    assert reader.feed("") == [] and reader.feed("\ufeffdata: a\n\n") == ["a"]
    assert reader.feed("\ufeffdata: b\n\n") == []  # later, it is part of a field name, as httpx-sse reads it


def test_tool_call_bound_stops_the_assembler():
    asm = DeltaAssembler(SMALL)
    for i in range(10):
        asm.feed(chunk({"tool_calls": [{"index": i, "id": f"c{i}", "function": {"name": "f", "arguments": "{}"}}]}))
        if asm.stopped:
            break
    r = asm.finish()
    assert len(r.tool_calls) == 3 and r.stopped_at_bound == "more than 3 tool calls in one turn"
    assert r.protocol_errors[-1] == "the harness stopped reading: more than 3 tool calls in one turn"
    assert asm.feed(chunk({"content": "late"})) is False and r.content == ""


def test_argument_and_text_bounds_clip_and_stop():
    asm = DeltaAssembler(SMALL)
    asm.feed(chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "a" * 80}}]}))
    r = asm.finish()
    assert len(r.tool_calls[0].arguments) == 50 and "tool_calls[0].arguments longer than 50" in r.stopped_at_bound
    asm = DeltaAssembler(SMALL)
    asm.feed(chunk({"content": "b" * 150}))
    asm.feed(chunk({"reasoning_content": "c" * 150}))
    r = asm.finish()
    assert len(r.content) + len(r.reasoning) == 200 and "characters of text" in r.stopped_at_bound


def test_protocol_errors_are_bounded_and_counted():
    asm = DeltaAssembler(SMALL)
    for _ in range(50):
        asm.feed("not json")
    r = asm.finish()
    assert len(r.protocol_errors) == 5 and r.protocol_errors[-1] == "… and 46 more protocol errors"


def test_lone_surrogates_are_replaced_and_noted():
    r, _ = feed_all(
        [
            '{"id":"r\\ud800","choices":[{"index":0,"delta":{"content":"a\\ud800b",'
            '"tool_calls":[{"index":0,"id":"c","function":{"name":"f\\udfff","arguments":"{\\"p\\": \\"\\udc00\\"}"}}]}}]}',
            chunk({}, finish="tool_calls"),
            "[DONE]",
        ]
    )
    assert r.content == "a\ufffdb" and r.tool_calls[0].name == "f\ufffd" and r.response_id == "r\ufffd"
    assert r.surrogates_replaced == ["content", "tool_calls[0].arguments"]
    assert sum("surrogate" in e for e in r.protocol_errors) == 2  # the id and the name
    json.dumps(r.to_json(), ensure_ascii=False).encode("utf-8")  # encodable throughout


def test_tool_calls_or_reasoning_of_the_wrong_type_are_noted_not_dropped_unsaid():
    call = {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    r, _ = feed_all([chunk({"tool_calls": call, "reasoning_content": 5}), chunk({}, finish="tool_calls"), "[DONE]"])
    assert r.tool_calls == [] and r.reasoning == ""
    assert r.protocol_errors == ["chunk 1: reasoning is not a string", "chunk 1: tool_calls is not a list"]


def test_fields_of_the_wrong_type_are_findings():
    r, _ = feed_all(
        [
            json.dumps(
                {
                    "id": 7,
                    "model": ["m"],
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "content": ["x"],
                                "tool_calls": [{"index": 0, "id": "c", "function": "read_file"}],
                            },
                            "finish_reason": ["stop"],
                        }
                    ],
                }
            ),
            json.dumps({"choices": "abc"}),
            "[" * 100_000,
            "[DONE]",
        ]
    )
    errs = " | ".join(r.protocol_errors)
    assert "id is not a string" in errs and "content is not a string" in errs and "function is not an object" in errs
    assert "finish_reason is not a string" in errs and "choices is not a list" in errs and "is not JSON" in errs
    assert r.finish_reason == '["stop"]' and r.response_id == "7"


def test_non_stream_hostile_bodies():
    calls = [{"id": f"c{i}", "function": {"name": "f", "arguments": "{}"}} for i in range(10)]
    r = assemble_completion({"choices": [{"message": {"content": "a\ud800", "tool_calls": calls}}]}, SMALL)
    assert len(r.tool_calls) == 3 and "tool calls" in r.stopped_at_bound and r.content == "a\ufffd"
    r = assemble_completion({"choices": [{"message": "text", "finish_reason": "stop"}]})
    assert "message is not an object" in " ".join(r.protocol_errors)
    r = assemble_completion(
        {"choices": [{"message": {"content": [{"type": "text", "text": "hi"}], "tool_calls": ["x", {"function": 3}]}}]}
    )
    errs = " | ".join(r.protocol_errors)
    assert "content is not a string" in errs and "tool_calls[0] is not an object" in errs
    assert "tool_calls[1].function is not an object" in errs


def test_raw_lines_keep_head_and_tail_only():
    out: list[str] = []
    raw = RawLines(out, SMALL)
    for i in range(100):
        raw.add(f"line {i:03d} " + "z" * 10)
    raw.add("w" * 1000)
    raw.close()
    assert out[0].startswith("line 000") and out[-1].startswith("w" * 40 + "…[+960 chars]")
    assert any("not kept" in line for line in out) and sum(map(len, out)) < 400
    assert clip_raw("q" * 1000, SMALL).count("chars not kept") == 1


def test_encode_body_survives_lone_surrogates():
    assert json.loads(encode_body({"content": "a\ud800b"})) == {"content": "a\ud800b"}
    assert encode_body({"content": "é"}) == '{"content":"é"}'.encode()


def test_encode_body_writes_what_json_reads_back():
    rng = random.Random(0)
    leaves = [None, True, 0, -3, 2**70, 0.1, 1e-5, 1e16, "", "ü\u2028\x00\x7f", '"\\/']
    for _ in range(300):
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": rng.choice(leaves),
                    "x": [rng.choice(leaves) for _ in range(rng.randint(0, 4))],
                }
            ],
            "temperature": rng.choice(leaves),
            "nested": {"a": {"b": rng.choice(leaves)}},
        }
        assert json.loads(encode_body(body)) == body
    for bad in (float("nan"), float("inf"), -float("inf")):  # JSON has none: null, never a bad body
        assert json.loads(encode_body({"messages": [], "top_p": bad})) == {"messages": [], "top_p": None}


def _turn(handler, body=None, bounds=SMALL):
    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await chat_turn(
                client,
                "http://test/v1/chat/completions",
                body or {"stream": True},
                Deadlines(ttft_s=5, total_s=5),
                bounds=bounds,
            )

    return anyio.run(main)


def _sse_response(pieces, content_type="text/event-stream", status=200, headers=None):
    async def stream():
        for p in pieces:
            yield p

    return httpx.Response(status, headers={"content-type": content_type, **(headers or {})}, content=stream())


def test_chat_turn_stops_reading_a_long_line_and_keeps_bounded_evidence():
    sent = []

    def pieces():
        yield b"data: " + chunk({"content": "hi"}).encode() + b"\n\n"
        for _ in range(1000):  # 1 MB in all, never a newline
            sent.append(1)
            yield b"x" * 1000

    out = _turn(lambda req: _sse_response(pieces()))
    assert out.status is TurnStatus.OK and "SSE line longer than 1,000" in out.response.stopped_at_bound
    assert len(sent) < 10  # it stopped reading, it did not drain the stream
    assert sum(map(len, out.raw_lines)) < 200 and out.response.content == "hi"


def test_chat_turn_bounds_bodies_and_reports_retry_after():
    out = _turn(lambda req: httpx.Response(200, json={"content": "x" * 10_000}), body={"stream": False})
    assert "response body larger than 5,000 bytes" in out.response.stopped_at_bound
    assert sum(map(len, out.raw_lines)) < 400
    out = _turn(lambda req: httpx.Response(429, headers={"retry-after": "7"}, json={"error": {"message": "slow"}}))
    assert out.status is TurnStatus.ERROR and out.error == "HTTP 429: slow (Retry-After: 7)"
    out = _turn(lambda req: _sse_response([b"<html>hi</html>"], content_type="text/html"))
    assert out.response.protocol_errors == ["not an SSE stream: Content-Type 'text/html'"]
    assert out.raw_lines == ["<html>hi</html>"]


def test_chat_turn_an_undecodable_body_is_a_connection_error():
    out = _turn(
        lambda req: httpx.Response(200, headers={"content-encoding": "gzip"}, content=b"not gzip"),
        body={"stream": False},
    )
    assert out.status is TurnStatus.ERROR and out.error_kind == "connection_error" and "DecodingError" in out.error


# --- the reader is httpx-sse's decoding; msgspec decodes as json does -------------------


def _httpx_sse_events(pieces: list[str]) -> list[str]:
    from httpx_sse._decoders import SSEDecoder, SSELineDecoder

    lines, events, out = SSELineDecoder(), SSEDecoder(), []
    for piece in pieces:
        for line in lines.decode(piece):
            if (e := events.decode(line)) is not None:
                out.append(e.data)
    for line in lines.flush():
        if (e := events.decode(line)) is not None:
            out.append(e.data)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_reader_reads_what_httpx_sse_reads(seed):
    import random

    rng = random.Random(seed)
    lines = [
        'data: {"a": 1}',
        'data:{"b":2}',
        "data",
        "data:  two spaces",
        ": a comment",
        "event: ping",
        "id: 7",
        "id: a\0b",
        "retry: 30",
        "retry: x",
        "field: ignored",
        "",
        "",
        "data: [DONE]",
        "data: é ｜",
    ]
    ends = ["\n", "\r\n", "\r"]
    text = "".join(rng.choice(lines) + rng.choice(ends) for _ in range(rng.randint(0, 60)))
    cuts = sorted(rng.sample(range(1, max(2, len(text))), min(len(text) - 1, rng.randint(0, 12)))) if text else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)]) if text[a:b]]
    reader = SSEEventReader()
    got = [d for piece in pieces for d in reader.feed(piece)] + reader.flush()
    assert got == _httpx_sse_events(pieces)


@pytest.mark.parametrize(
    "data",
    [
        '{"id":"r","choices":[{"index":0,"delta":{"content":"a\\ud800b"}}]}',  # msgspec refuses: json's path
        '{"id":"r","usage":{"prompt_tokens":1e400},"choices":[]}',
        '{"id":"r","usage":{"prompt_tokens":123456789012345678901234567890},"choices":[]}',
        '{"id":"r","choices":[{"index":0,"delta":{"content":"é \\u00e9 ｜"},"finish_reason":null}]}',
        '{"id":7,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f"}}]}}]}',
        "[" * 5000 + "]" * 5000,
        "not json",
    ],
)
def test_the_fast_decoder_assembles_what_json_assembles(data, monkeypatch):
    import dsv4bench.wire.sse as sse

    def run() -> dict:
        asm = DeltaAssembler()
        for d in [
            '{"id":"r","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
            data,
            data,
            "[DONE]",
        ]:
            asm.feed(d)
        return asm.finish().to_json()

    fast = run()

    def refuse(_: str) -> None:
        raise ValueError("json's path")

    monkeypatch.setattr(sse, "_fast_decode", refuse)
    assert fast == run()


def test_sglangs_split_of_cached_tokens_is_kept_streamed_and_whole_and_a_bad_one_is_dropped():
    tiers = {"device": 3000, "host": 5000}
    ext = json.dumps({"id": "r1", "choices": [], "usage": None, "sglext": {"cached_tokens_details": tiers}})
    r, _ = feed_all([chunk({"content": "hi"}), chunk(finish="stop"), ext, "[DONE]"])
    assert r.cached_tokens_details == tiers and r.content == "hi" and not r.protocol_errors
    body = {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}], "sglext": {}}
    assert assemble_completion({**body, "sglext": {"cached_tokens_details": tiers}}).cached_tokens_details == tiers
    # what a server sends in its place is no split: none is kept, and nothing breaks
    for bad in ("device", ["x"], {"cached_tokens_details": "host"}, None):
        assert assemble_completion({**body, "sglext": bad}).cached_tokens_details is None
        r, _ = feed_all([chunk({"content": "hi"}), json.dumps({"choices": [], "sglext": bad}), "[DONE]"])
        assert r.cached_tokens_details is None and r.content == "hi"
    assert feed_all([chunk({"content": "hi"}), "[DONE]"])[0].cached_tokens_details is None
