"""`audit` over captured production traffic: pairs, SSE text, SSE lines, unreadable lines."""

import json

from dsv4bench.modes.audit import audit_file, sse_payloads

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
]
REQ = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}


def completion(content="", calls=(), finish="stop"):
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": msg, "finish_reason": finish}]}


def chunk(delta, finish=None):
    return json.dumps(
        {"id": "s", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}, ensure_ascii=False
    )


def test_audit_finds_each_shape_and_passes_clean(tmp_path):
    f = tmp_path / "capture.jsonl"
    lines = [
        {"request": REQ, "response": completion(calls=[("read_file", '{"path": "a.py"}')], finish="tool_calls")},
        {"request": REQ, "response": completion(content='<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read_file">')},
        {"request": REQ, "response": completion(calls=[("read_file", '{"path": 3}')], finish="tool_calls")},
        {
            "request": REQ,
            "sse": f"data: {chunk({'content': 'Hello'})}\n\ndata: {chunk({}, 'stop')}\n\ndata: [DONE]\n\n",
        },
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
    assert sse_payloads("\ufeffdata: a\n\ndata: b\n\n") == ["a", "b"]  # a BOM, as the live reader drops it


def test_audit_shows_where_the_parsers_read_a_raw_completion_apart(tmp_path):
    from rich.console import Console

    from dsv4bench.modes.audit import render_audit, write_results
    from dsv4bench.checks.sglang_oracle import sglang_missing

    block = (
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read_file">\n'
        '<｜DSML｜parameter name="path" string="true">a.py</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'
    )
    answer = completion(calls=[("read_file", '{"path": "a.py"}')], finish="tool_calls")
    f = tmp_path / "capture.jsonl"
    lines = [
        {"request": REQ, "response": answer, "raw_completion": block},
        {"request": REQ, "response": answer, "raw_completion": block + "\n\n" + block.replace("a.py", "b.py")},
        {"request": REQ, "response": answer},
    ]
    f.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n")
    results = audit_file(f)
    assert [r.verdicts for r in results] == [[], [], []]  # deepseek-recipe reads only the first block, as the server
    assert results[0].parsers == [] and results[0].oracles is not None and results[2].oracles is None
    console = Console(record=True, width=200)
    render_audit(results, console)
    text = console.export_text()
    assert "parser oracles (deepseek-recipe 0.2.0; " in text and "2 raw completions" in text and "0 not read" in text
    assert "  read as: deepseek-v4 read by deepseek-recipe 2" in text  # DSML with no family said: DeepSeek-V4's
    if sglang_missing() is None:  # SGLang reads every block
        assert [d.where for d in results[1].parsers] == ["tool call names", "tool_calls[1].arguments"]
        assert (
            "line 2 x: parsers disagree (deepseek-v4 read by deepseek-recipe)\n"
            "  tool call names: server = deepseek-recipe"
        ) in text
    else:
        assert results[1].parsers == [] and sglang_missing() in text
    write_results(results, tmp_path / "out.jsonl")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[1]["oracles"]["raw_completion"] == lines[1]["raw_completion"]
    assert out[1]["parsers"] == [d.describe() for d in results[1].parsers] and out[2]["oracles"] is None


def test_a_reaudited_turn_record_reads_its_kept_raw_completion(tmp_path):
    from dsv4bench.modes.audit import exchange_context

    rec = {
        "session": "s0",
        "status": "ok",
        "request": {"body": REQ},
        "response": {"content": "Hi."},
        "oracles": {"raw_completion": "Hi."},
    }
    assert exchange_context(rec).raw_completion == "Hi."


def test_audit_names_each_lines_family_and_reader_and_says_why_one_was_not_read(tmp_path, monkeypatch):
    from rich.console import Console

    from dsv4bench.modes.audit import render_audit, write_results
    from dsv4bench.checks import sglang_oracle

    # SGLang absent: a Qwen completion (only SGLang's detectors read it) is not read; DeepSeek-V4's still is.
    monkeypatch.setattr(sglang_oracle, "_sglang", lambda: "SGLang's parser not installed (No module named 'sglang')")
    qwen = {**REQ, "model": "Qwen/Qwen3-32B"}
    hermes = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call><|im_end|>'
    called = completion(calls=[("read_file", '{"path": "a.py"}')], finish="tool_calls")
    lines = [
        {"request": qwen, "response": called, "raw_completion": hermes},
        {"request": REQ, "response": completion("Hi."), "raw_completion": "</think>Hi."},
        {"request": REQ, "response": completion("<tool_call>x"), "raw_completion": 5},
    ]
    f = tmp_path / "capture.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    results = audit_file(f)
    first, second, third = (r.oracles for r in results)
    assert first is not None and (first.family, first.reader) == ("qwen", None) and "not installed" in first.not_read
    assert second is not None and (second.family, second.reader, second.not_read) == (
        "deepseek-v4",
        "deepseek-recipe",
        None,
    )
    assert third is not None and third.not_read == "the raw completion is not text (int)"
    console = Console(record=True, width=300)
    render_audit(results, console)
    text = console.export_text()
    assert "3 raw completions, 0 read differently, 2 not read (evidence, not verdicts)" in text
    assert "  read as: deepseek-v4 read by deepseek-recipe 1; family not recorded not read 1; qwen not read 1" in text
    assert (
        "line 1 x: raw completion not read (qwen): qwen is read by SGLang's detectors: SGLang's parser not installed"
    ) in text
    assert "line 2" not in text  # read, and read as the server answered: nothing to show
    # A line with verdicts keeps the oracle's word beneath them.
    assert (
        results[2].verdicts
        and "\n  raw completion not read (family not recorded): the raw completion is not text" in text
    )
    write_results(results, tmp_path / "out.jsonl")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert (out[0]["oracles"]["family"], out[0]["oracles"]["reader"]) == ("qwen", None)
    assert out[1]["oracles"]["reader"] == "deepseek-recipe" and out[0]["oracles"]["not_read"] == first.not_read
