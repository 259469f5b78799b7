"""The bundled engine keeps an answer to its request's tool_choice and parallel_tool_calls
(engine/tool_choice_decoding.py): the constraint on its own with the shipped tokenizer, then the
shipped model served, asked what the shipped weights were never trained to be asked."""

from __future__ import annotations

import json

import httpx
import pytest

from dsv4bench.agents import family_for_session
from dsv4bench.engine.launcher import start_engine
from dsv4bench.engine.tokenizer import load_tokenizer
from dsv4bench.engine.tool_choice_decoding import ToolChoiceDecoding, for_request
from dsv4bench.harness.session import AgentSession, SessionConfig

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("read_file", "list_dir")
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_auto_and_required_are_left_to_the_model(tok) -> None:
    assert for_request({"tools": TOOLS}, tok) is None
    assert for_request({"tools": TOOLS, "tool_choice": "required"}, tok) is None
    assert for_request({"tool_choice": "none"}, tok) is None  # no tools: nothing to call


def test_none_masks_the_dsml_token(tok) -> None:
    c = for_request({"tools": TOOLS, "tool_choice": "none"}, tok)
    assert c is not None and c.banned_ids == (tok.special_id("｜DSML｜"),)
    assert c.forced_next([1, 2, 3]) is None


def test_a_named_function_forces_its_opening_then_one_call(tok) -> None:
    named = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "list_dir"}}}
    c = for_request(named, tok)
    assert isinstance(c, ToolChoiceDecoding) and not c.banned_ids
    assert tok.decode(c.prefix_ids) == '<｜DSML｜invoke name="list_dir">\n'
    out = [c.forced_next([])]
    while (nxt := c.forced_next(out)) is not None:
        out.append(nxt)
    assert list(c.prefix_ids) == out  # forced to the end of the opening, then the model's own
    # The model writes its parameter and closes the call: the block's close and EOS follow.
    out += tok.encode('<｜DSML｜parameter name="path" string="true">src</｜DSML｜parameter>\n</｜DSML｜invoke>')
    forced = []
    while (nxt := c.forced_next(out)) is not None:
        forced.append(nxt)
        out.append(nxt)
    assert forced[-1] == tok.eos_token_id and tok.decode(forced[:-1]) == "\n</｜DSML｜tool_calls>"
    assert c.forced_next(out) is None


def _forced_to_the_end(c: ToolChoiceDecoding, out: list[int]) -> list[int]:
    while (nxt := c.forced_next(out)) is not None:
        out = [*out, nxt]
    return out


def test_parallel_false_ends_the_block_after_the_first_call(tok) -> None:
    c = for_request({"tools": TOOLS, "parallel_tool_calls": False}, tok)
    assert c is not None and c.prefix_ids == ()
    call = '<｜DSML｜invoke name="read_file">\n</｜DSML｜invoke>'
    # Closed at its `>`, or with the model's own newline after it: the same block end either way.
    for text in (call, call + "\n"):
        out = _forced_to_the_end(c, tok.encode(text))
        assert out[-1] == tok.eos_token_id
        assert tok.decode(out[:-1]) == call + "\n</｜DSML｜tool_calls>"
    assert c.forced_next(tok.encode('<｜DSML｜invoke name="read_file">\n')) is None  # still open


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    ep = start_engine(["--num-pages", "4096"], log_dir=tmp_path_factory.mktemp("engine"))
    yield ep
    ep.stop()


def _first_turns(n: int) -> list[tuple[AgentSession, dict]]:
    out = []
    for i in range(n):
        s = AgentSession(
            f"s{i}",
            family_for_session("mixed", i),
            1000 + i,
            SessionConfig(model="dsv4-mini", stream=False, max_tokens=200),
        )
        out.append((s, s.next_request()))
    return out


def test_the_shipped_model_served_keeps_to_none_named_and_one_call(engine) -> None:
    """The shipped weights were trained on tool_choice auto alone: asked for none, they write
    tool-call markup anyway (which a server's parser would leave in content), and under a named
    function they call whichever tool the conversation points at. The server keeps both answers
    to what was asked."""
    with httpx.Client(timeout=120) as client:
        for s, body in _first_turns(3):
            name = s.tools[-1]["function"]["name"]
            for extra, check in (
                ({"tool_choice": "none"}, lambda m: not m.get("tool_calls") and "DSML" not in (m["content"] or "")),
                (
                    {"tool_choice": {"type": "function", "function": {"name": name}}},
                    lambda m: [c["function"]["name"] for c in m.get("tool_calls") or []] == [name],
                ),
                ({"parallel_tool_calls": False}, lambda m: len(m.get("tool_calls") or []) <= 1),
            ):
                r = client.post(f"{engine.url}/chat/completions", json={**body, **extra})
                assert r.status_code == 200, r.text
                msg = r.json()["choices"][0]["message"]
                assert check(msg), (extra, json.dumps(msg)[:400])
