"""Raw completions of every family read by the family's reference reader: a clean turn agrees with
the server's answer, a server that changed the answer disagrees, and a text no reader can read
is "not read", never a disagreement.

Raw texts follow each format as SGLang's own detector for it documents it (its docstring and
`structure_info`); Mistral's is rendered by mistral-common's own tokenizer where it is installed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsv4bench.checks import sglang_oracle
from dsv4bench.checks.oracle import check_parser_disagreement, oracle_reading
from dsv4bench.checks.parser_view import NOT_READ, first_reader, kept_oracles, not_read, read_oracles
from dsv4bench.checks.raw_readers import families_for
from dsv4bench.checks.sglang_oracle import sglang_missing
from dsv4bench.history.codes import ORACLE_CODE
from dsv4bench.history.records import TurnContext

from .turns import BLOCK, turn

installed = pytest.mark.skipif(sglang_missing() is not None, reason=sglang_missing() or "")
ARGS = {"path": "src/main.py", "max_lines": 5}
J = json.dumps(ARGS)
SAY = "I'll read it."

# family: (raw completion, the content a correct server sends beside the read_file call)
RAW: dict[str, tuple[str, str]] = {
    "deepseek-v3": (
        "Plan.</think>" + SAY + "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n"
        f"```json\n{J}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        SAY,
    ),
    "deepseek-v3.1": (
        SAY + f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{J}<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        SAY,
    ),
    "deepseek-v4": (
        "Plan.</think>"
        + SAY
        + "\n\n"
        + BLOCK.replace(
            "</｜DSML｜invoke>",
            '<｜DSML｜parameter name="max_lines" string="false">5</｜DSML｜parameter>\n</｜DSML｜invoke>',
        ),
        SAY,
    ),
    "qwen": (
        "<think>\nPlan.\n</think>\n\n" + SAY + f'\n<tool_call>\n{{"name": "read_file", "arguments": {J}}}\n</tool_call>'
        "<|im_end|>",
        SAY,
    ),
    "qwen3-coder": (
        SAY + "\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/main.py\n</parameter>\n"
        "<parameter=max_lines>\n5\n</parameter>\n</function>\n</tool_call><|im_end|>",
        SAY,
    ),
    "kimi-k2": (
        SAY + "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0<|tool_call_argument_begin|>"
        f"{J}<|tool_call_end|><|tool_calls_section_end|>",
        SAY,
    ),
    "glm": (
        "<think>Plan.</think>\n" + SAY + "\n<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>src/main.py"
        "</arg_value>\n<arg_key>max_lines</arg_key>\n<arg_value>5</arg_value>\n</tool_call><|observation|>",
        SAY,
    ),
    "gpt-oss": (
        "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary to=functions.read_file "
        f"<|constrain|>json<|message|>{J}<|call|>",
        "",
    ),
    "llama3": (f'<|python_tag|>{{"name": "read_file", "parameters": {J}}}<|eom_id|>', ""),
    "mistral": (SAY + f"[TOOL_CALLS]read_file[ARGS]{J}</s>", SAY),
    "gemma": (SAY + '<|tool_call>call:read_file{max_lines:5,path:<|"|>src/main.py<|"|>}<tool_call|>', SAY),
}
FAMILIES = list(RAW)


def server(
    family: str,
    *,
    stream: bool = True,
    content: str | None = None,
    args: Any = ARGS,
    calls: int = 1,
    known: bool = False,
) -> TurnContext:
    """The turn a correct server answers with (changed as asked), with its raw completion; the
    server's family known (`TurnContext.family`) or left for the text to tell."""
    raw, said = RAW[family]
    ctx = turn(said if content is None else content, calls=[("read_file", args)] * calls, raw=raw, stream=stream)
    ctx.family = family if known else None
    return ctx


@installed
@pytest.mark.parametrize("known", [False, True], ids=["family from the text", "family known"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_clean_turn_of_every_family_agrees(family: str, stream: bool, known: bool) -> None:
    ctx = server(family, stream=stream, known=known)
    reading = oracle_reading(ctx)
    assert reading is not None and reading.family == family and reading.not_read is None
    assert reading.reader == ("deepseek-recipe" if family == "deepseek-v4" else f"SGLang {reading.reader.split()[-1]}")
    assert check_parser_disagreement(ctx) == []
    oracles = read_oracles(ctx)
    assert oracles is not None and not_read(oracles) is None


@installed
@pytest.mark.parametrize("family", FAMILIES)
def test_a_dropped_call_disagrees(family: str) -> None:
    verdicts = check_parser_disagreement(server(family, calls=0))
    assert verdicts[0].code == ORACLE_CODE
    assert verdicts[0].detail == "tool call names: oracle saw ['read_file'], server sent []"


@installed
@pytest.mark.parametrize("family", FAMILIES)
def test_changed_arguments_disagree(family: str) -> None:
    [v] = check_parser_disagreement(server(family, args={**ARGS, "path": "src/main.pyc"}))
    assert v.where == "tool_calls[0].arguments" and "src/main.pyc" in v.detail


@installed
@pytest.mark.parametrize("family", FAMILIES)
def test_markup_left_in_content_disagrees(family: str) -> None:
    raw, said = RAW[family]
    leaked = raw.split("</think>")[-1]  # the server's parser missed the call: all of it is content
    verdicts = check_parser_disagreement(server(family, content=leaked, calls=0))
    assert [v.where for v in verdicts] == ["tool_calls", "content"]


@installed
def test_v3_and_v31_are_no_longer_read_as_dsml() -> None:
    for family in ("deepseek-v3", "deepseek-v3.1"):
        ctx = server(family)
        assert check_parser_disagreement(ctx) == []
        oracles = read_oracles(ctx)
        assert oracles is not None and first_reader(oracles) == f"SGLang {family.replace('-', '').replace('.', '')}"


@installed
def test_a_family_group_reads_the_format_the_text_is_in() -> None:
    # A Qwen server (as it reports itself) whose model writes Qwen3-Coder's XML.
    ctx = server("qwen3-coder")
    ctx.family = "qwen"
    reading = oracle_reading(ctx)
    assert reading is not None and reading.family == "qwen3-coder" and check_parser_disagreement(ctx) == []


@installed
def test_the_servers_family_reads_even_anothers_markup_as_its_parser_would() -> None:
    # A Qwen server leaves V3 markup as text: its own parser would too, so that is no disagreement.
    raw, _ = RAW["deepseek-v3"]
    ctx = turn(
        raw.removeprefix("Plan.</think>").removesuffix("<｜end▁of▁sentence｜>"), raw=raw.removeprefix("Plan.</think>")
    )
    ctx.family = "qwen"
    assert check_parser_disagreement(ctx) == []


def test_prose_with_no_familys_markers_is_read_as_the_answers_model_says() -> None:
    assert [f.name for f in families_for("All done.", None, "Qwen/Qwen3-32B")] == ["qwen"]
    assert [f.name for f in families_for("All done.", None, "mystery-model")] == ["deepseek-v4"]
    assert [f.name for f in families_for(BLOCK, None)] == ["deepseek-v4", "deepseek-v3.2"]


@pytest.mark.parametrize(
    ("raw", "family", "why"),
    [
        (5, None, "the raw completion is not text (int)"),
        ("Hi.", "granite", "no reader for model family 'granite'"),
    ],
)
def test_a_text_no_reader_can_read_is_not_read_and_no_disagreement(raw: Any, family: str | None, why: str) -> None:
    ctx = turn("Something else entirely.", calls=[("read_file", ARGS)], raw=None)
    ctx.raw_completion, ctx.family = raw, family
    assert check_parser_disagreement(ctx) == []
    kept = kept_oracles(ctx)
    assert kept is not None and first_reader(kept) == NOT_READ and (not_read(kept) or "").startswith(why)


def test_without_sglang_another_family_is_not_read_and_dsv4_still_is(monkeypatch) -> None:
    monkeypatch.setattr(sglang_oracle, "_sglang", lambda: "SGLang's parser not installed (No module named 'sglang')")
    qwen = server("qwen", calls=0)  # would disagree, were it read
    assert check_parser_disagreement(qwen) == []
    kept = kept_oracles(qwen)
    assert kept is not None and "SGLang's parser not installed" in (not_read(kept) or "")
    dsv4 = server("deepseek-v4", calls=0)
    assert [v.where for v in check_parser_disagreement(dsv4)] == ["tool_calls"]


@installed
def test_a_reader_that_raises_is_not_read(monkeypatch) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr("dsv4bench.checks.raw_readers.parse_raw_completion", broken)
    monkeypatch.setattr("dsv4bench.checks.raw_readers.read_with_sglang", broken)
    ctx = server("deepseek-v4", calls=0)
    reading = oracle_reading(ctx)
    assert (
        reading is not None
        and reading.oracle is None
        and reading.not_read == "deepseek-v4's reader raised RuntimeError: boom"
    )
    assert check_parser_disagreement(ctx) == []


def test_mistral_commons_own_rendering_is_read_as_sglang_reads_it() -> None:
    pytest.importorskip("mistral_common")
    if sglang_missing():
        pytest.skip(sglang_missing() or "")
    from mistral_common.protocol.instruct.messages import AssistantMessage
    from mistral_common.protocol.instruct.tool_calls import FunctionCall, ToolCall
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    # v3 Tekken: its vocabulary ships inside the package (the SentencePiece ones need another one).
    tokenizer = MistralTokenizer.v3(is_tekken=True).instruct_tokenizer
    call = ToolCall(id="abcdefghi", function=FunctionCall(name="read_file", arguments=J))
    ids = tokenizer.encode_assistant_message(AssistantMessage(tool_calls=[call]), is_before_last_user_message=False)
    raw = tokenizer.decode(ids, special_token_policy=SpecialTokenPolicy.KEEP)  # as a raw completion keeps it
    assert raw.startswith("[TOOL_CALLS][{") and raw.endswith("</s>")
    # SGLang 0.5.23's Mistral detector wants `[TOOL_CALLS] [` (a space) for the JSON-list form and
    # swallows this one: no call, no content. So a server that sends the call disagrees with it:
    # evidence about the two parsers, as parser_disagreement always is, pinned here.
    reading = oracle_reading(turn(calls=[("read_file", ARGS)], raw=raw))
    assert reading is not None and reading.family == "mistral" and reading.oracle is not None
    assert (reading.oracle.content, reading.oracle.tool_calls) == ("", [])
    spaced = raw.replace("[TOOL_CALLS][", "[TOOL_CALLS] [")
    assert check_parser_disagreement(turn(calls=[("read_file", ARGS)], raw=spaced)) == []
    [v] = check_parser_disagreement(turn(calls=[("read_file", {"path": "other.py"})], raw=spaced))
    assert v.where == "tool_calls[0].arguments"
