"""Every family's markup, caught where a parser failed and passed where a correct server sends it.

Per family: a whole call block left in content, in the reasoning and inside another call's
arguments; its special tokens, in the spellings seen in the wild; and the clean look-alikes: the
same markup inside an argument string or quoted in prose when the request gave it to the model,
text before a call, an empty-argument call, numbers and unicode keeping their types. The blocks
(tests/fixtures/family_markup.py, shared with scripts/bench_verdicts.py) are the formats' own:
each is read as a call by SGLang's detector for the family where SGLang is installed, and
Mistral's is rendered by mistral-common.
"""

from __future__ import annotations

import json

import pytest

from dsv4bench.checks import run_checks
from dsv4bench.families import BY_NAME, FAMILIES, family_for, find_markup
from tests.fixtures.family_markup import BLOCKS, corpus
from tests.fixtures.family_markup import MARKUP_CODES as CORRUPTION_MARKUP

from .turns import turn

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def codes(ctx) -> set[str]:
    return {v.code for v in run_checks(ctx)[0]} & CORRUPTION_MARKUP


def test_every_family_in_the_registry_has_fixtures() -> None:
    assert {f.name for f in FAMILIES} - set(BLOCKS) == {"deepseek-v3.2"}  # V3.2 writes V4's DSML


@pytest.mark.parametrize("family", BLOCKS)
def test_the_fixture_block_is_a_call_to_the_familys_own_parser(family: str) -> None:
    """Each block is the format's real shape: SGLang's detector for the family reads read_file from it."""
    pytest.importorskip("sglang")
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    block, parser, _, _ = BLOCKS[family]
    assert parser in BY_NAME[family].sglang_parsers or family.startswith("deepseek")
    detector = FunctionCallParser.ToolCallParserEnum[parser]()
    result = detector.detect_and_parse(block, [Tool(**READ_FILE)])
    assert [c.name for c in result.calls] == ["read_file"], result
    assert json.loads(result.calls[0].parameters) == {"path": "src/main.py"}


def test_mistral_block_is_what_mistral_common_renders() -> None:
    """mistral-common's own tokenizer writes a call as `[TOOL_CALLS]name[ARGS]{json}` (v11+)."""
    mc = pytest.importorskip("mistral_common")
    from mistral_common.protocol.instruct.messages import AssistantMessage, ToolMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from pathlib import Path

    data = Path(mc.__file__).parent / "data"
    tokenizer = MistralTokenizer.from_file(str(data / "tekken_240911.json"))
    request = ChatCompletionRequest(
        messages=[
            UserMessage(content="read it"),
            AssistantMessage(
                tool_calls=[
                    ToolCall(
                        id="abcdefghi", function=FunctionCall(name="read_file", arguments='{"path": "src/main.py"}')
                    )
                ]
            ),
            ToolMessage(tool_call_id="abcdefghi", content="print('hi')"),
        ],
        tools=[Tool(function=Function(**READ_FILE["function"]))],
    )
    text = tokenizer.decode(tokenizer.encode_chat_completion(request).tokens, special_token_policy="keep")
    found = [m for m in find_markup(text, "mistral", ["read_file"]) if m.structural]
    assert found and "[TOOL_CALLS]" in text and "read_file" in text


@pytest.mark.parametrize("family", BLOCKS)
@pytest.mark.parametrize("known", [True, False], ids=["family known", "family unknown"])
def test_a_call_left_in_content_or_reasoning_is_a_leak(family: str, known: bool) -> None:
    block = BLOCKS[family][0]
    fam = family if known else None
    want = "dsml" if family.startswith("deepseek") else "markup"
    assert codes(turn("I'll read it.\n" + block, family=fam)) == {f"{want}_leak_content"}
    assert f"{want}_leak_reasoning" in codes(turn("Reading.", reasoning="Plan: " + block, family=fam))
    # structural: a leak even when the request is not known (an audit of answers alone)
    assert f"{want}_leak_content" in codes(turn(block, family=fam, given=None))


@pytest.mark.parametrize("family", BLOCKS)
def test_a_call_block_inside_another_calls_arguments_is_a_leak(family: str) -> None:
    block = BLOCKS[family][0]
    want = "dsml_in_arguments" if family.startswith("deepseek") else "markup_in_arguments"
    ctx = turn(calls=[("run_shell", {"command": "ls " + block})], family=family)
    assert want in codes(ctx)


@pytest.mark.parametrize("family", BLOCKS)
def test_special_tokens_in_every_spelling_are_leaks(family: str) -> None:
    _, _, token, variant = BLOCKS[family]
    for text in (f"Done.{token}", f"Done.{variant}", f"{token}Done."):
        assert "special_token_leak" in codes(turn(text, family=family)) | codes(turn(text)), text


@pytest.mark.parametrize("family", BLOCKS)
def test_markup_the_task_gave_the_model_is_clean(family: str) -> None:
    """A coding agent editing a parser writes the family's markup into a file; an answer quotes a
    token from the user's question. Both appear in what the request gave the model."""
    block, _, token, _ = BLOCKS[family]
    task = f"Fix the parser. The fixture file must hold exactly:\n{block}\nand the stop token is {token}."
    write = turn(
        "Writing the fixture.",
        calls=[("edit_file", {"path": "tests/fixture.txt", "edits": [{"old": "", "new": block}]})],
        given=task,
        family=family,
    )
    assert (
        codes(write) == set()
        and codes(
            turn("Writing.", calls=[("edit_file", {"path": "f", "edits": [{"old": "", "new": block}]})], given=task)
        )
        == set()
    )
    quoted = turn(f"The model stops at `{token}`, so the parser must drop it.", given=task, family=family)
    assert codes(quoted) == set()


@pytest.mark.parametrize("family", BLOCKS)
def test_markup_not_given_and_not_structural_is_a_leak_known_request_or_evidence_unknown(family: str) -> None:
    _, _, token, _ = BLOCKS[family]
    text = f"The model stops at `{token}`."
    assert codes(turn(text, family=family)) == {"special_token_leak"}
    unknown = run_checks(turn(text, family=family, given=None))[0]
    assert [v.code for v in unknown] == ["markup_unproven"] and "--raw" in unknown[0].detail


CLEAN_ANSWERS = {
    "text before a call": dict(content="Let me read the file first.", calls=[("read_file", {"path": "src/main.py"})]),
    "empty-argument call": dict(calls=[("list_services", {})]),
    "types kept": dict(calls=[("read_file", {"path": "src/数据/naïve 📄.py", "max_lines": 30})]),
    "prose about formats": dict(
        content="Qwen wraps calls in tool_call tags; Mistral uses a TOOL_CALLS token; "
        "GLM writes arg_key and arg_value pairs. Vec<Think> is Rust, <s>x</s> is HTML."
    ),
    "json answer": dict(content='{"name": "Ada", "parameters": {"age": 36}}'),
    "markdown and pipes": dict(content="| a | b |\n|---|---|\n| 1 | 2 |\n`cat x | grep y`"),
    "chinese fullwidth bars": dict(content="选项A｜选项B｜选项C"),
    "shell command with brackets": dict(calls=[("run_shell", {"command": "test [ -f x ] && echo '[INFO] ok'"})]),
}


@pytest.mark.parametrize("answer", CLEAN_ANSWERS.values(), ids=CLEAN_ANSWERS.keys())
@pytest.mark.parametrize("family", [None, *BLOCKS])
def test_clean_answers_pass_on_every_family(answer: dict, family: str | None) -> None:
    assert run_checks(turn(**answer, family=family)) == ([], [])


def test_llama_bare_json_call_needs_an_offered_tool_name() -> None:
    call = '{"name": "read_file", "parameters": {"path": "src/main.py"}}'
    assert codes(turn(call, family="llama3")) == {"markup_leak_content"}
    assert codes(turn('{"name": "Ada", "parameters": {"age": 36}}', family="llama3")) == set()


@pytest.mark.parametrize(
    ("model", "parser", "family"),
    [
        ("deepseek-ai/DeepSeek-V4-Pro", None, "deepseek-v4"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", None, "deepseek-v3.2"),
        ("deepseek-ai/DeepSeek-V3.1-Terminus", None, "deepseek-v3.1"),
        ("deepseek-ai/DeepSeek-R1-0528", None, "deepseek-v3"),
        ("Qwen/Qwen3-Coder-480B-A35B-Instruct", None, "qwen3-coder"),
        ("Qwen/Qwen3-235B-A22B", None, "qwen"),
        ("moonshotai/Kimi-K2-Instruct-0905", None, "kimi-k2"),
        ("zai-org/GLM-4.6", None, "glm"),
        ("openai/gpt-oss-120b", None, "gpt-oss"),
        ("meta-llama/Llama-3.3-70B-Instruct", None, "llama3"),
        ("mistralai/Devstral-Small-2507", None, "mistral"),
        ("google/gemma-3-27b-it", None, "gemma"),
        ("my-finetune", "qwen3_coder", "qwen3-coder"),
        ("gpt-4o", "deepseek_v31", "deepseek-v3.1"),
        ("default", None, None),
    ],
)
def test_the_family_comes_from_the_parser_setting_then_the_model_name(model, parser, family) -> None:
    assert family_for(parser=parser, models=[model]) == family


@pytest.mark.parametrize(
    ("facts", "family"),
    [
        ({"server_info": {"tool_call_parser": "kimi_k2"}, "models": ["served"]}, "kimi-k2"),
        # model names say nothing for the whole run (a gateway lists several families): each turn's own answer does
        ({"server_info": {"model_path": "/models/GLM-4.6"}, "models": [{"id": "zai-org/GLM-4.6"}]}, None),
        ({"server_info": {"tool_call_parser": None}, "models": "not a list"}, None),
        ({"server_info": "not a dict"}, None),
        ({}, None),
    ],
)
def test_a_runs_family_comes_from_what_preflight_read(facts, family) -> None:
    from dsv4bench.families import family_of_server

    assert family_of_server(facts) == family


STRIPPED = {
    "gpt-oss channels glued after their tokens were dropped": (
        "analysisThe user wants the file.assistantfinalHere.",
        "special_token_leak",
    ),
    "Kimi call id and arguments with the tokens dropped": (
        'Reading. functions.read_file:0 {"path": "src/main.py"}',
        "markup_leak_content",
    ),
    "DeepSeek tool token cut at the end": ("I'll read it.<｜tool▁calls", "dsml_leak_content"),
}


@pytest.mark.parametrize(("text", "code"), STRIPPED.values(), ids=STRIPPED.keys())
def test_markup_whose_tokens_were_dropped_or_cut_is_still_seen(text: str, code: str) -> None:
    assert codes(turn(text)) == {code}


@pytest.mark.parametrize(
    "text",
    [
        "The assistant finally answered.",
        "A final assistant message; analysis follows.",
        "call functions.read_file:0 later",
        "<｜end▁of the list",
        "options: a｜b",
    ],
)
def test_their_look_alikes_are_clean(text: str) -> None:
    assert codes(turn(text)) == set()


@pytest.mark.parametrize(
    ("flag", "want"),
    [("auto", "auto"), ("ALL", "all"), ("qwen", "qwen"), ("kimi_k2", "kimi-k2"), ("deepseek_v31", "deepseek-v3.1")],
)
def test_the_family_flag_takes_names_and_parser_names(flag: str, want: str) -> None:
    from dsv4bench.families import chosen_family, family_flag

    assert family_flag(flag) == want
    assert chosen_family("auto", "glm") == "glm" and chosen_family("all", "glm") == "all"


def test_the_family_flag_refuses_what_it_does_not_know_naming_what_it_takes() -> None:
    from dsv4bench.families import family_flag

    with pytest.raises(ValueError, match="deepseek-v4.*qwen3-coder.*gemma"):
        family_flag("gpt-4o")


def test_all_checks_every_family_even_on_a_server_that_reports_one() -> None:
    text = "Done.<|im_end|>"
    assert codes(turn(text, family="deepseek-v4")) == set()
    assert codes(turn(text, family="all")) == {"special_token_leak"}


_CASES = corpus()


@pytest.mark.parametrize("known", [True, False], ids=["family known", "family unknown"])
@pytest.mark.parametrize("case", _CASES, ids=[f"{c.family}: {c.name}" for c in _CASES])
def test_the_corpus_the_recall_figures_count(case, known: bool) -> None:
    """scripts/bench_verdicts.py's cases, each pinned: a failure caught with one of its codes, a
    clean look-alike with no corruption code at all."""
    from dsv4bench.history.codes import CORRUPTION_CODES

    verdicts, errors = run_checks(case.context(family_known=known))
    got = {v.code for v in verdicts} & set(CORRUPTION_CODES)
    assert errors == []
    assert bool(got & case.codes) if case.leak else got == set(), (case.name, got)


REAL_LEAKS = {
    # trtllm-serve, gpt-oss-120b (a final answer holding the call it should have made, recipient lost)
    "harmony call left in content without its recipient": (
        '<|channel|>commentary<|message|>{\n  "path": "/",\n  "name_pattern": "*Chen*"\n}<|end|>',
        "special_token_leak",
    ),
    # a provider that strips harmony's tokens but never splits its channels
    "harmony channels glued to the answer": (
        'analysisWe need to answer "What is 2+2?". The answer is "four".assistantfinalfour',
        "special_token_leak",
    ),
    # DSML with doubled bars, as an orchestrator showed it to its operator
    "doubled-bar DSML block": (
        'Let me check.\n\n<｜｜DSML｜｜tool_calls>\n<｜｜DSML｜｜invoke name="workspace_list">\n'
        "</｜｜DSML｜｜invoke>\n</｜｜DSML｜｜tool_calls>",
        "dsml_leak_content",
    ),
    # Qwen3.x: preamble, then Qwen3-Coder XML left in content by a streaming translator
    "preamble then Qwen3-Coder XML": (
        "I'll investigate systematically.\n<tool_call>\n<function=grep>\n<parameter=pattern>"
        "mountain</parameter>\n</function>\n</tool_call>",
        "markup_leak_content",
    ),
    # Kimi K3 XTML with its channel glued on, in an answer's text
    "Kimi K3 XTML call": (
        '<|open|>toolscall tool="StrReplace" index="1"<|sep|><|open|>argument key="path" type="string"'
        "<|sep|>src/renderer<|close|>argument<|sep|><|close|>call<|sep|>",
        "markup_leak_content",
    ),
    # bare invoke markup with no block around it
    "bare invoke": (
        'Let me read it.\n\n<invoke name="Read">\n<parameter name="file_path">a.md</parameter>\n</invoke>',
        "dsml_leak_content",
    ),
}


@pytest.mark.parametrize(("text", "code"), REAL_LEAKS.values(), ids=REAL_LEAKS.keys())
def test_leak_shapes_seen_in_real_reports_are_caught(text: str, code: str) -> None:
    assert code in codes(turn(text)), codes(turn(text))


def test_markup_in_a_tool_name_is_the_calls_leak() -> None:
    """gpt-oss on a server that missed harmony's end of recipient: `manage_cart<|channel|>commentary`."""
    ctx = turn(calls=[("read_file<|channel|>commentary", {"path": "a"})], family="gpt-oss")
    assert "special_token_leak" in codes(ctx)
    assert codes(turn(calls=[("read_file", {"path": "a"})], family="gpt-oss")) == set()


def test_markup_the_model_wrote_first_and_a_tool_echoed_is_still_the_models() -> None:
    """Given text counts only where the request held it before the model ever wrote it: a token the
    model leaked into a call's arguments, echoed back by the tool, does not clear its next leak; the
    same token first given by the user does."""
    from dsv4bench.history.records import GivenText

    eos = "<｜end▁of▁sentence｜>"
    leaked = {
        "messages": [
            {"role": "user", "content": "Sum the orders."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c0",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": json.dumps({"path": "orders" + eos})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c0", "content": f"no file orders{eos}"},
        ]
    }
    asked = {"messages": [{"role": "user", "content": f"What does {eos} mean?"}, *leaked["messages"][1:]]}
    ctx = turn("Done." + eos, family="deepseek-v4")
    ctx.given = GivenText.of_body(leaked)
    assert codes(ctx) == {"special_token_leak"}
    ctx.given = GivenText.of_body(asked)
    assert codes(ctx) == set()


def test_the_given_text_is_the_request_as_sent() -> None:
    """A session appends its next messages to its own list after the turn: the turn's given text
    is the request it sent."""
    from dsv4bench.history.records import GivenText

    messages = [{"role": "user", "content": "plain task"}]
    given = GivenText.of_body({"messages": messages})
    messages.append({"role": "user", "content": "<|im_end|>"})
    assert given is not None and not given.holds("<|im_end|>") and given.holds("plain task")
