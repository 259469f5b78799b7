"""The delta assembler on literal chunk sequences, clean and broken."""

import json

from dsv4bench.sse import DeltaAssembler, assemble_completion


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
    r, carried = feed_all([
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me "}),
        chunk({"content": "look."}),
        chunk({"tool_calls": [{"index": 0, "id": "c0", "type": "function", "function": {"name": "read_file", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a.py"}'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]}),
        chunk({}, finish="tool_calls"),
        chunk(choices=False, usage={"prompt_tokens": 10, "completion_tokens": 5}),
        "[DONE]",
    ])
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
    r, _ = feed_all([chunk({"reasoning_content": "think "}), chunk({"reasoning": "more"}),
                     chunk({"content": "ok"}, finish="stop"), "[DONE]"])
    assert r.reasoning == "think more" and r.content == "ok" and not r.protocol_errors


def test_index_gap_is_a_protocol_error():
    r, _ = feed_all([chunk({"tool_calls": [{"index": 1, "id": "c", "function": {"name": "f", "arguments": "{}"}}]}),
                     chunk({}, finish="tool_calls"), "[DONE]"])
    assert any("index gap" in e for e in r.protocol_errors)


def test_missing_id_or_name_on_first_delta():
    r, _ = feed_all([chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                     chunk({}, finish="tool_calls"), "[DONE]"])
    assert any("no id" in e for e in r.protocol_errors)
    assert any("no function name" in e for e in r.protocol_errors)


def test_delta_after_finish_and_no_done():
    r, _ = feed_all([chunk({"content": "a"}, finish="stop"), chunk({"content": "b"})])
    assert any("after finish_reason" in e for e in r.protocol_errors)
    assert any("without [DONE]" in e for e in r.protocol_errors)


def test_usage_chunk_after_finish_is_fine():
    r, _ = feed_all([chunk({"content": "a"}, finish="stop"), chunk(choices=False, usage={"x": 1}), "[DONE]"])
    assert r.protocol_errors == []


def test_cut_stream_without_finish_is_left_to_truncated():
    r, _ = feed_all([chunk({"content": "a"})])
    assert r.finish_reason is None and r.protocol_errors == [] and not r.saw_done


def test_garbage_chunks_are_findings_not_crashes():
    r, _ = feed_all(["{not json", "[1,2]", json.dumps({"error": {"message": "boom"}}), chunk({"content": "x"}, finish="stop"),
                     "[DONE]", chunk({"content": "late"})])
    errs = " | ".join(r.protocol_errors)
    assert "not JSON" in errs and "not an object" in errs and "boom" in errs and "after [DONE]" in errs
    assert r.content == "x"


def test_changed_id_and_name_are_flagged():
    r, _ = feed_all([
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}, rid="r2"),
        chunk({}, finish="tool_calls"), "[DONE]",
    ])
    errs = " | ".join(r.protocol_errors)
    assert "id changed from 'r1'" in errs and "id changed from 'a'" in errs and "name changed" in errs


def test_non_stream_body():
    r = assemble_completion({"id": "x", "choices": [{"message": {"content": "hi", "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}]}, "finish_reason": "tool_calls"}]})
    assert r.tool_calls[0].arguments == '{"a": 1}' and r.finish_reason == "tool_calls" and not r.stream
    bad = assemble_completion({"choices": []})
    assert bad.protocol_errors == ["response has no choices"]
