"""`audit` over captured production traffic: pairs, SSE text, SSE lines, unreadable lines."""

import json

from dsv4bench.audit import audit_file, sse_payloads

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": False}}}]
REQ = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}


def completion(content="", calls=(), finish="stop"):
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                             for i, (n, a) in enumerate(calls)]
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": msg, "finish_reason": finish}]}


def chunk(delta, finish=None):
    return json.dumps({"id": "s", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}, ensure_ascii=False)


def test_audit_finds_each_shape_and_passes_clean(tmp_path):
    f = tmp_path / "capture.jsonl"
    lines = [
        {"request": REQ, "response": completion(calls=[("read_file", '{"path": "a.py"}')], finish="tool_calls")},
        {"request": REQ, "response": completion(content='<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read_file">')},
        {"request": REQ, "response": completion(calls=[("read_file", '{"path": 3}')], finish="tool_calls")},
        {"request": REQ, "sse": f"data: {chunk({'content': 'Hello'})}\n\ndata: {chunk({}, 'stop')}\n\ndata: [DONE]\n\n"},
        {"request": REQ, "sse": [f"data: {chunk({'content': 'Hel'})}"]},
        {"request": REQ, "http_status": 503},
        {"response": completion(calls=[("anything", "{}")], finish="tool_calls")},
        {"request": REQ},
    ]
    f.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n{torn")
    results = audit_file(f)
    codes = [sorted({v.code for v in r.verdicts}) for r in results]
    assert codes == [[], ["dsml_leak_content"], ["schema_violation"], [], ["truncated"], ["http_error"], [], [], []]
    # Without the offered tools, unknown_tool cannot be judged; unusable lines are reported, not fatal.
    assert results[7].problem and results[8].problem
    assert [r.corrupt for r in results][:5] == [False, True, True, False, True] and results[5].errors


def test_sse_payloads_accepts_text_lines_and_bare_payloads():
    assert sse_payloads("data: a\n\ndata: b\n\n") == ["a", "b"]
    assert sse_payloads(["data: a", "data: b"]) == ["a", "b"]
    assert sse_payloads(["a", "[DONE]"]) == ["a", "[DONE]"]
