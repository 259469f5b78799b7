"""SGLang's DeepSeek-V4 parsers as the second --raw oracle, next to deepseek-recipe's: where the
two read DSV4 output alike, where not, and the one-line state when SGLang is not installed."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from dsv4bench.checks import sglang_oracle
from dsv4bench.checks.common import decode_json
from dsv4bench.checks.recipe_reader import parse_raw_completion
from dsv4bench.checks.sglang_oracle import read_with_sglang, sglang_missing, sglang_state
from dsv4bench.history.records import AssembledResponse

from .turns import BLOCK, TOOLS

installed = pytest.mark.skipif(sglang_missing() is not None, reason=sglang_missing() or "")

BODY = {
    "model": "DeepSeek-V4-Pro",
    "messages": [{"role": "user", "content": "."}],
    "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in TOOLS.items()],
    "chat_template_kwargs": {"thinking": True},
}
EOS, END = "<｜end▁of▁sentence｜>", "</think>"
CALL = [("read_file", {"path": "src/main.py"})]


def param(name: str, value: str, string: bool = False) -> str:
    return f'<｜DSML｜parameter name="{name}" string="{str(string).lower()}">{value}</｜DSML｜parameter>\n'


def invoke(name: str, body: str) -> str:
    return f'<｜DSML｜invoke name="{name}">\n{body}</｜DSML｜invoke>\n'


def block(*invokes: str) -> str:
    return "<｜DSML｜tool_calls>\n" + "".join(invokes) + "</｜DSML｜tool_calls>"


def with_param(extra: str) -> str:
    """BLOCK's read_file call with one more parameter."""
    return BLOCK.replace("</｜DSML｜invoke>", extra + "</｜DSML｜invoke>")


def seen(r: AssembledResponse | None) -> tuple[str, str, list[tuple[str | None, Any]]]:
    """What a reading says: content, reasoning, calls (arguments decoded where they are JSON)."""
    assert r is not None

    def args(text: str) -> Any:
        try:
            return decode_json(text)
        except ValueError:
            return text

    return r.content.strip(), r.reasoning.strip(), [(c.name, args(c.arguments)) for c in r.tool_calls]


def three(raw: str, finish: str = "stop") -> tuple[Any, Any, Any]:
    """deepseek-recipe's reading, SGLang's whole and SGLang's streamed one."""
    sg = read_with_sglang(raw, BODY, finish_reason=finish)
    return seen(parse_raw_completion(raw, BODY, finish_reason=finish)), seen(sg.whole), seen(sg.stream)


AGREE = {
    "canonical, prose and EOS": (
        "Let me look." + END + "I'll read it.\n\n" + BLOCK + EOS,
        ("I'll read it.", "Let me look.", CALL),
    ),
    "two calls in one block": (
        END
        + block(
            invoke("read_file", param("path", "a.py", True)),
            invoke("run_shell", param("command", "ls", True) + param("background", "true")),
        ),
        ("", "", [("read_file", {"path": "a.py"}), ("run_shell", {"command": "ls", "background": True})]),
    ),
    "JSON parameters": (
        END
        + block(
            invoke("edit_file", param("path", "a.py", True) + param("edits", '[{"old": "x = 1", "new": "x = 2"}]'))
        ),
        ("", "", [("edit_file", {"path": "a.py", "edits": [{"old": "x = 1", "new": "x = 2"}]})]),
    ),
    "a number": (
        END + with_param(param("max_lines", "5")),
        ("", "", [("read_file", {"path": "src/main.py", "max_lines": 5})]),
    ),
    "a bare invoke": (END + "ok\n\n" + invoke("read_file", param("path", "src/main.py", True)), ("ok", "", CALL)),
    "zero arguments, self-closing": (
        END + block('<｜DSML｜invoke name="list_services"/>\n'),
        ("", "", [("list_services", {})]),
    ),
    "zero arguments": (END + block(invoke("list_services", "")), ("", "", [("list_services", {})])),
    "special tokens in a string": (
        END + BLOCK.replace("src/main.py", f"a{EOS}b</think>c｜DSML｜d"),
        ("", "", [("read_file", {"path": f"a{EOS}b</think>c｜DSML｜d"})]),
    ),
    "ASCII bars": (END + BLOCK.replace("｜", "|"), (BLOCK.replace("｜", "|"), "", [])),
    "lower-case dsml": (END + BLOCK.replace("DSML", "dsml"), (BLOCK.replace("DSML", "dsml"), "", [])),
    "prose after the block": (END + "Sure.\n\n" + BLOCK + "\n\nMore.", ("Sure.", "", CALL)),
    "prose only": ("Hmm." + END + "All tests pass." + EOS, ("All tests pass.", "Hmm.", [])),
    "reasoning cut off": ("still thinking", ("", "still thinking", [])),
    "a trailing <": (END + "a < b and c <", ("a < b and c <", "", [])),
}


@installed
@pytest.mark.parametrize("name", list(AGREE))
def test_the_parsers_agree(name: str) -> None:
    raw, expected = AGREE[name]
    assert three(raw) == (expected, expected, expected)


NOT_JSON = '{"path": "src/main.py", "max_lines": 5x}'
# name: raw completion, deepseek-recipe's reading, SGLang's whole one, SGLang's streamed one.
DIFFER = {
    "spaces around a string": (
        END + BLOCK.replace("src/main.py", "  src/main.py\n"),
        ("", "", [("read_file", {"path": "  src/main.py\n"})]),
        ("", "", CALL),
        ("", "", CALL),
    ),
    "a value that is not JSON": (
        END + with_param(param("max_lines", "5x")),
        ("", "", [("read_file", NOT_JSON)]),
        ("", "", [("read_file", {"path": "src/main.py", "max_lines": "5x"})]),
        ("", "", [("read_file", {"path": "src/main.py", "max_lines": "5x"})]),
    ),
    "NaN": (
        END + with_param(param("max_lines", "NaN")),
        ("", "", [("read_file", '{"path": "src/main.py", "max_lines": NaN}')]),
        ("", "", [("read_file", {"path": "src/main.py", "max_lines": "NaN"})]),
        ("", "", [("read_file", {"path": "src/main.py", "max_lines": "NaN"})]),
    ),
    "a plain string as string=false": (
        END + BLOCK.replace('string="true"', 'string="false"'),
        ("", "", [("read_file", '{"path": src/main.py}')]),
        ("", "", CALL),
        ("", "", CALL),
    ),
    "a JSON object as the invoke body": (
        END + block(invoke("read_file", '{"path": "src/main.py"}\n')),
        ("", "", [("read_file", {})]),
        ("", "", CALL),
        ("", "", CALL),
    ),
    "a JSON body that is no object": (
        END + block(invoke("read_file", "[1]\n")),
        ("", "", [("read_file", {})]),
        ("", "", []),
        ("", "", []),
    ),
    "no string attribute": (
        END + BLOCK.replace(' string="true"', ""),
        ("", "", [("read_file", '{"path">src/main.py</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>')]),
        ("", "", []),
        ("", "", []),
    ),
    "a closing tag in a string": (
        END + BLOCK.replace("src/main.py", "a</｜DSML｜parameter>b"),
        ("", "", [("read_file", {"path": "a"})]),
        ("", "", []),
        ("", "", []),
    ),
    "two blocks": (
        END + BLOCK + "\n\n" + BLOCK.replace("src/main.py", "b.py"),
        ("", "", CALL),
        ("", "", [*CALL, ("read_file", {"path": "b.py"})]),
        ("", "", [*CALL, ("read_file", {"path": "b.py"})]),
    ),
    "a block in the reasoning": (
        "Thinking " + BLOCK,
        ("", "Thinking", CALL),
        ("", "Thinking " + BLOCK, []),
        ("", "Thinking " + BLOCK, []),
    ),
    "a written <think>": ("<think>abc" + END + "x", ("x", "<think>abc", []), ("x", "abc", []), ("x", "abc", [])),
    # SGLang's two paths read these apart.
    "an unknown tool": (
        END + BLOCK.replace("read_file", "delete_all"),
        ("", "", [("delete_all", {"path": "src/main.py"})]),
        ("", "", []),
        ("", "", [("delete_all", {"path": "src/main.py"})]),
    ),
    "an unclosed block": (
        END + BLOCK.removesuffix("</｜DSML｜tool_calls>"),
        ("", "", CALL),
        ("", "", []),
        ("", "", CALL),
    ),
    "a stray marker in prose": (
        END + "Use the <｜DSML｜ marker wisely. Done.",
        ("Use the", "", []),
        ("Use the <｜DSML｜ marker wisely. Done.", "", []),
        ("Use the", "", []),
    ),
    "a spaced opener": (
        END + BLOCK.replace("<｜DSML｜tool_calls>", "<｜DSML｜ tool_calls>"),
        ("", "", CALL),
        ("", "", CALL),
        ("<｜DSML｜ tool_calls>", "", CALL),
    ),
    "V3.2's block name": (
        END + BLOCK.replace("tool_calls", "function_calls"),
        ("", "", CALL),
        ("", "", CALL),
        ("<｜DSML｜function_calls>", "", CALL),
    ),
}


@installed
@pytest.mark.parametrize("name", list(DIFFER))
def test_the_parsers_differ(name: str) -> None:
    raw, recipe, whole, stream = DIFFER[name]
    assert three(raw) == (recipe, whole, stream)
    assert len({repr(recipe), repr(whole), repr(stream)}) > 1


@installed
@pytest.mark.parametrize("cut", ["src/ma", "</｜DSML｜invoke>"])
def test_a_call_cut_by_the_length_limit(cut: str) -> None:
    raw = END + BLOCK[: BLOCK.index(cut)]
    recipe, whole, stream = three(raw, "length")
    assert [name for name, _ in recipe[2]] == ["read_file"] and whole == stream == ("", "", [])
    sg = read_with_sglang(raw, BODY, finish_reason="length")
    assert sg.whole is not None and sg.whole.finish_reason == "length"


@installed
def test_a_reading_is_a_response_with_sglangs_finish() -> None:
    sg = read_with_sglang("ok" + END + "Sure.\n\n" + BLOCK + EOS, BODY)
    assert sg.state == sglang_state() and re.fullmatch(r"sglang \d+\.\d+\.\d+\S*", sg.state)
    assert sg.whole is not None and sg.stream is not None
    assert (sg.whole.stream, sg.stream.stream) == (False, True)
    assert sg.whole.finish_reason == sg.stream.finish_reason == "tool_calls"
    assert [c.index for c in sg.stream.tool_calls] == [0]


@installed
def test_thinking_follows_the_request_else_the_text() -> None:
    raw = "Plan." + END + "Done."
    off = {**BODY, "chat_template_kwargs": {"thinking": False}}
    assert seen(read_with_sglang(raw, off).whole) == ("Plan." + END + "Done.", "", [])
    inferred = {k: v for k, v in BODY.items() if k != "chat_template_kwargs"}
    assert seen(read_with_sglang(raw, inferred).whole) == ("Done.", "Plan.", [])
    assert seen(read_with_sglang("Done.", inferred).whole) == ("Done.", "", [])


@installed
def test_no_tools_or_tool_choice_none_parses_no_calls() -> None:
    raw = END + BLOCK
    for body in ({**BODY, "tool_choice": "none"}, {k: v for k, v in BODY.items() if k != "tools"}):
        sg = read_with_sglang(raw, body)
        assert seen(sg.whole) == seen(sg.stream) == (BLOCK, "", [])


@installed
@pytest.mark.parametrize("size", [1, 3, 7, 10**6])
def test_the_streamed_reading_does_not_depend_on_the_pieces(monkeypatch, size: int) -> None:
    raws = [raw for raw, _ in AGREE.values()] + [raw for raw, *_ in DIFFER.values()]
    expected = [seen(read_with_sglang(raw, BODY).stream) for raw in raws]
    monkeypatch.setattr(sglang_oracle, "_PIECES", re.compile(f".{{1,{size}}}", re.DOTALL))
    assert [seen(read_with_sglang(raw, BODY).stream) for raw in raws] == expected


@installed
def test_what_sglang_logs_is_kept_as_evidence_not_printed(capsys, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        sg = read_with_sglang(END + BLOCK.replace("read_file", "delete_all"), BODY)
        bad = read_with_sglang(END + BLOCK.replace(' string="true"', ""), BODY)
    assert sg.log == ["Model attempted to call undefined function: delete_all"]
    assert bad.log == ["Dropping malformed DeepSeek invoke: Malformed DeepSeek tool parameter"]  # once, for both paths
    assert not caplog.records and capsys.readouterr().err == ""
    assert logging.getLogger("sglang").propagate and not logging.getLogger("sglang").handlers


@installed
def test_a_parser_that_raises_is_a_state_not_a_crash() -> None:
    sg = read_with_sglang(END + BLOCK, {**BODY, "tools": [{"type": "function", "function": {"name": 5}}]})
    assert (sg.whole, sg.stream) == (None, None)
    assert sg.state.startswith(f"{sglang_state()}: its parser raised ValidationError")


def test_without_sglang_the_state_says_so_and_nothing_is_read(monkeypatch) -> None:
    monkeypatch.setattr(sglang_oracle, "_sglang", lambda: "SGLang's parser not installed (No module named 'sglang')")
    sg = read_with_sglang(END + BLOCK, BODY)
    assert (sg.state, sg.whole, sg.stream, sg.log) == (
        "SGLang's parser not installed (No module named 'sglang')",
        None,
        None,
        [],
    )
    assert sglang_state().startswith("SGLang's parser not installed") and sglang_missing() == sglang_state()
