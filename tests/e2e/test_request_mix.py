"""End to end: `agents --request-mix` against a server that breaks each term on purpose (every
break caught under its code, nothing else flagged under those codes, the report split by variant,
a thinking turn's reasoning sent back), and against the bundled engine, CLEAN."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

from dsv4bench.history.request_terms import RequestTerms

from .conftest import only_run_dir, run_cli, start_fixture_server

TERMS_CODES = ("tool_choice_violation", "parallel_calls_violation", "stop_sequence_ignored", "reasoning_only")


@pytest.fixture
def terms_server(tmp_path):
    ledger = tmp_path / "terms-ledger.jsonl"
    ledger.touch()
    srv = start_fixture_server("terms_server.py", tmp_path, "/v1/models", "--ledger", str(ledger))
    yield f"{srv.root}/v1", ledger
    srv.stop()


def _turns(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "turns.jsonl").read_text().splitlines()]


def test_every_broken_term_is_caught_and_the_report_splits_codes_by_variant(terms_server, tmp_path):
    url, ledger = terms_server
    out = tmp_path / "runs"
    # Every dimension varied; more thinking and stop turns than the default, so each break shows.
    mix = "frameworks;tool_choice=auto,required,named,none;thinking=off:3,on,high,max;stop=none,set"
    r = run_cli(
        "agents",
        "--url",
        url,
        "--concurrency",
        "8",
        "--sessions",
        "24",
        "--max-turns",
        "6",
        "--request-mix",
        mix,
        "--out",
        str(out),
        "-q",
        timeout=240,
    )
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stdout.startswith("CORRUPTION"), r.stdout + r.stderr
    run_dir = only_run_dir(out)
    turns = _turns(run_dir)
    planted = {(d["session"], d["turn"]): d for d in map(json.loads, ledger.read_text().splitlines())}
    assert {d["broke"] for d in planted.values()} == {"none", "required", "named", "parallel", "stop", "reasoning"}

    found = {(t["session"], t["turn"]): {v["code"] for v in t["verdicts"] if v["code"] in TERMS_CODES} for t in turns}
    for key, d in planted.items():
        assert d["code"] in found[key], (key, d, found[key])
    flagged = {key for key, codes in found.items() if codes}
    assert flagged == set(planted), flagged ^ set(planted)  # nothing kept to its terms is flagged

    # The thinking turns' reasoning went back with their tool results: the server, as DeepSeek's
    # API, refuses a request without it, and no turn was refused.
    assert all(t["status"] == "ok" for t in turns), Counter(t["status"] for t in turns)
    after_thinking = [t for t in turns if t["turn"] > 0 and t["request"]["terms"]["thinking"]]
    assert after_thinking

    summary = json.loads((run_dir / "summary.json").read_text())
    by = summary["by_variant"]
    assert set(by["tool_choice"]) == {"auto", "required", "named", "none"}
    assert set(by["thinking"]) == {"off", "on", "high", "max"}
    broke_none = sum(d["broke"] == "none" for d in planted.values())
    assert by["tool_choice"]["none"]["codes"]["tool_choice_violation"] == broke_none
    assert "tool_choice_violation" not in by["tool_choice"]["auto"]["codes"]
    assert by["stop"]["set"]["codes"]["stop_sequence_ignored"] == sum(d["broke"] == "stop" for d in planted.values())
    assert "stop_sequence_ignored" not in by["stop"]["none"]["codes"]
    report = (run_dir / "report.md").read_text()
    section = report.split("## Codes by request variant", 1)[1].split("\n## ", 1)[0]
    assert "| tool_choice | `none` |" in section and "`reasoning_only`" in section

    # The same run re-judged offline from its history gives the same terms codes.
    verdicts = tmp_path / "audit.jsonl"
    a = run_cli("audit", str(run_dir), "--out", str(verdicts))
    assert a.returncode in (0, 1) and "Traceback" not in a.stderr, a.stderr
    audited = {
        (x["session"], x["turn"])
        for x in map(json.loads, verdicts.read_text().splitlines())
        if any(v["code"] in TERMS_CODES for v in x["verdicts"])
    }
    assert audited == set(planted)


def test_a_thinking_request_without_its_reasoning_is_refused_by_the_fixture(terms_server):
    """The fixture's refusal is what the test above relies on to see the reasoning sent back."""
    url, _ = terms_server
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True, "reasoning_effort": "high"}
    assert RequestTerms.of_body(body).thinking
    for turn in range(8):  # a turn it answers with a call (it breaks the terms on some turns)
        headers = {
            "X-Dsv4bench-Scenario": "coding",
            "X-Dsv4bench-Seed": "3",
            "X-Dsv4bench-Session": "s",
            "X-Dsv4bench-Turn": str(turn),
        }
        first = httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=10)
        deltas = [json.loads(line[6:])["choices"] for line in first.text.splitlines() if line.startswith("data: {")]
        calls = [tc for choices in deltas for c in choices for tc in c["delta"].get("tool_calls") or [] if tc.get("id")]
        if calls:
            break
    call = calls[0]
    call = {"id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": "{}"}}
    messages = [
        *body["messages"],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "a.py"},
    ]
    body = {**body, "messages": messages}
    r = httpx.post(f"{url}/chat/completions", json=body, timeout=10)
    assert r.status_code == 400 and "reasoning_content" in r.text
    messages[1]["reasoning_content"] = "look first"
    assert httpx.post(f"{url}/chat/completions", json=body, timeout=10).status_code == 200


def test_the_bundled_engine_is_clean_under_the_mix_its_model_can_answer(tmp_path):
    """The shipped weights were trained on tool_choice auto with thinking off: under required,
    parallel_tool_calls and stop sequences they answer as under auto, and the engine keeps each
    term (tests/engine/test_tool_choice_decoding.py holds it to none and a named function)."""
    out = tmp_path / "runs"
    mix = "tool_choice=auto:6,required:2;parallel_tool_calls=unset,true,false;stop=none:3,set"
    r = run_cli(
        "agents",
        "--concurrency",
        "8",
        "--sessions",
        "8",
        "--max-turns",
        "6",
        "--request-mix",
        mix,
        "--out",
        str(out),
        "-q",
        timeout=600,
    )
    assert r.stdout.startswith("CLEAN"), r.stdout + r.stderr
    summary = json.loads((only_run_dir(out) / "summary.json").read_text())
    by = summary["by_variant"]
    assert set(by["tool_choice"]) == {"auto", "required"} and set(by["parallel_tool_calls"]) == {
        "unset",
        "true",
        "false",
    }
    assert set(by["stop"]) == {"none", "set"} and all(not g["codes"] for v in by.values() for g in v.values())
