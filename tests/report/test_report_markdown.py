"""render_report() on literal histories: verdict first, code table, breakdowns, examples."""

from __future__ import annotations

from pathlib import Path

from dsv4bench.history.codes import AVAILABILITY_CODES, CODE_MEANINGS, CORRUPTION_CODES, EVIDENCE_CODES, WEDGE_CODES
from dsv4bench.history.run_folder import read_history
from dsv4bench.history.records import AssembledResponse, OracleReadings, SglangReading, TurnRecord, Verdict
from dsv4bench.report.markdown import excerpt, fence, render_report
from dsv4bench.report.summary import summarize


def render(run_dir: Path, plots: list[str] | None = None) -> str:
    history = read_history(run_dir)
    return render_report(history, summarize(history), plots or [])


def test_every_code_has_one_sentence_meaning() -> None:
    for code in (*CORRUPTION_CODES, *AVAILABILITY_CODES, *WEDGE_CODES, *EVIDENCE_CODES):
        text = CODE_MEANINGS[code]
        assert text.endswith(".") and text.count(". ") == 0, code


def test_corruption_report(corruption_run: Path) -> None:
    md = render(corruption_run)
    lines = md.splitlines()
    assert lines[0] == "# dsv4bench report: run-test"
    # The verdict comes first, on one line, with the headline figures.
    assert lines[2].startswith("**CORRUPTION** — 3 of 6 completed turns (50.0%) corrupt; 3 of 7 tool calls bad")
    assert "; 1 turn killed by the nemesis (not judged)." in lines[2]
    assert "Partial history" not in md
    assert "| sessions ended by | final answer 1, killed 1 |" in md
    # Code table: count, rate per turn, rate per tool call, meaning.
    assert "| `schema_violation` | corruption | 2 | 33.33% | 28.57% | A tool call's arguments are JSON" in md
    assert "| `http_error` | availability | 1 | 14.29% | – |" in md
    assert "| `truncated` | corruption | 0 |" in md  # found only on a killed turn
    # Breakdowns.
    assert "## Corruption by turn depth" in md and "| 1 | 3 | 3 | 1 | 2 | 66.7% | 0 | 0 |" in md
    assert "## Corruption by scenario" in md and "| sql | 5 | 3 | 2 | 1 | 33.3% | 1 | 1 |" in md
    # Examples: one heading per fired code, with session, turn, response id and a raw excerpt.
    for code in ("dsml_leak_content", "args_not_json", "schema_violation", "http_error"):
        assert f"### `{code}`" in md
    assert "### `truncated`" not in md
    assert "session `s1`, turn 1 (coding), response id `chatcmpl-s1-1`, at `content`" in md
    assert "<｜DSML｜tool_calls>" in md
    assert md.count("session `s2`, turn 1 (sql)") == 1
    # Server facts and configuration.
    assert "deepseek-ai/DeepSeek-V4" in md and "| `tp_size` | 8 |" in md and "unrelated_key" not in md
    assert "| `concurrency` | 8 |" in md
    assert "```sh\ndsv4bench agents --concurrency 8 --seed 7 --kill every:10s\n```" in md
    assert "## Latency" in md and "| TTFT | 6 | 350 ms |" in md
    assert "## Wedge" not in md  # run.json has no wedge block


def test_examples_capped_at_three(run_folder, make_turn) -> None:
    turns = [make_turn(f"s{i}", 0, verdicts=[("args_not_json", "tool_calls[0].arguments")]) for i in range(5)]
    md = render(run_folder(turns))
    assert md.count("### `args_not_json`") == 1
    assert md.count("- session `s") == 3


def test_wedge_section(run_folder, make_turn) -> None:
    run = {
        "run": "w",
        "command": "dsv4bench agents",
        "wedge": {"decode": {"codes": ["queue_stuck", "health_lies"], "gauges": {"decode_transfer_q": 60}}},
    }
    md = render(run_folder([make_turn()], run=run))
    assert md.splitlines()[2].startswith("**WEDGE** — 1 of 1 endpoints wedged (decode)")
    assert "| decode | `queue_stuck`, `health_lies` | decode_transfer_q=60 |" in md


def test_errors_headline(run_folder, make_turn) -> None:
    turns = [make_turn("s1", 0), make_turn("s1", 1, status="timeout", verdicts=[("timeout_total", "")])]
    md = render(run_folder(turns))
    assert (
        "**ERRORS** (wedge not checked: no --metrics endpoint) — 1 of 2 turns failed (error or timeout); "
        "no corruption in 1 completed turns"
    ) in md


def test_empty_history_renders(run_folder) -> None:
    md = render(run_folder([], run={}, duration_s=None))
    assert (
        "**CLEAN** (partial: run did not finish; wedge not checked: no --metrics endpoint) — "
        "no turns recorded; nothing was judged."
    ) in md
    assert "Partial history" in md
    assert "No server facts recorded." in md and "run.json records no command." in md
    assert "No verdict codes fired." in md and "## Plots" not in md


def test_partial_history_renders(run_folder, make_turn) -> None:
    md = render(run_folder([make_turn("s1", 0)], duration_s=None, torn_line=True))
    assert "Partial history" in md and "1 unreadable history line(s) skipped" in md


def test_plots_are_linked(run_folder, make_turn) -> None:
    md = render(run_folder([make_turn()]), plots=["plots/timeline.png"])
    assert "![timeline](plots/timeline.png)" in md


def test_excerpt_focuses_on_dsml_line(make_turn) -> None:
    sse = [f'data: {{"choices":[{{"delta":{{"content":"word {i} "}}}}]}}' for i in range(50)]
    sse.insert(30, 'data: {"choices":[{"delta":{"content":"<｜DSML｜invoke name=\\"x\\">"}}]}')
    turn = make_turn(raw_sse=sse)
    text = excerpt(turn, Verdict("dsml_leak_content", "", "content"), limit=300)
    assert text.startswith("… (29 earlier lines)") and "DSML" in text and text.endswith("…")


def test_excerpt_without_raw_uses_arguments(make_turn) -> None:
    turn = make_turn(tool_calls=2)
    assert excerpt(turn, Verdict("args_not_json", "", "tool_calls[1].arguments")) == '{"path": "a.py"}'


def test_fence_outgrows_backticks() -> None:
    assert fence("a ``` b").startswith("````\n")


def _readings(kept: TurnRecord, whole_content: str) -> TurnRecord:
    """`kept` with --raw readings: deepseek-recipe and SGLang streamed as the server answered, SGLang whole apart."""
    assert kept.response is not None
    answer = AssembledResponse(
        content=kept.response.content, tool_calls=kept.response.tool_calls, finish_reason=kept.response.finish_reason
    )
    whole = AssembledResponse(content=whole_content, stream=False, finish_reason="stop")
    kept.oracles = OracleReadings(
        "</think>" + whole_content,
        answer,
        SglangReading("sglang 0.5.23", answer, whole, ["Dropping unclosed DeepSeek invoke"]),
        reader="deepseek-recipe",
        family="deepseek-v4",
    )
    return kept


def test_parser_oracles_section(run_folder, make_turn) -> None:
    run = {
        "run": "o",
        "command": "dsv4bench agents --raw",
        "oracles": {"deepseek-recipe": "deepseek-recipe 0.2.0", "sglang": "sglang 0.5.23"},
    }
    turns = [make_turn("s1", 0), _readings(make_turn("s1", 1, content="Use the"), "Use the <｜DSML｜ marker.")]
    md = render(run_folder(turns, run=run))
    section = md.split("## Parser oracles\n", 1)[1].split("\n## ", 1)[0]
    assert "beside the server's answer; readers here: deepseek-recipe 0.2.0; sglang 0.5.23." in section
    assert "Evidence, not verdicts" in section and "`parser_disagreement`" in section
    # Each kept turn's family and the reader that read it, with SGLang's detectors for that family.
    assert "| deepseek-v4 | deepseek-recipe | `deepseekv4` / `deepseek-v4` | 1 | 0 |" in section  # SGLang's, for V4
    assert "Not read:" not in section
    assert "| server, deepseek-recipe | 0 |" in section and "| server, SGLang as the server answered | 0 |" in section
    assert "| deepseek-recipe, SGLang as the server answered | 0 |" in section
    assert "| SGLang streamed, SGLang whole | 1 |" in section
    assert "- session `s1`, turn 1 (coding; deepseek-v4 read by deepseek-recipe):" in section
    # Brackets from the parsers' readings are escaped, so they stay text in the rendered report.
    assert (
        "tool call names: server = deepseek-recipe = SGLang streamed '\\[\"read_file\"\\]'; SGLang whole '\\[\\]'"
    ) in section
    assert "  - SGLang: Dropping unclosed DeepSeek invoke" in section
    assert "</think>Use the &lt;" not in section and "</think>Use the <｜DSML｜ marker." in section  # fenced, as is


def test_parser_oracles_section_without_sglang_or_disagreement(run_folder, make_turn) -> None:
    run = {
        "run": "o",
        "oracles": {
            "deepseek-recipe": "deepseek-recipe 0.2.0",
            "sglang": "SGLang's parser not installed (No module named 'sglang')",
        },
    }
    md = render(run_folder([make_turn()], run=run))
    assert "SGLang's parser not installed (No module named 'sglang')" in md
    assert md.split("## Parser oracles\n", 1)[1].split("\n## ", 1)[0].rstrip().endswith("No turn's readings disagreed.")
    assert "## Parser oracles" not in render(run_folder([make_turn()]))  # a run without --raw


def test_the_server_section_says_whose_markup_the_run_checked() -> None:
    from dsv4bench.report.markdown import _family_words

    assert _family_words({"family": "qwen", "from": "tool_call_parser"}) == "`qwen` (from tool_call_parser)"
    assert _family_words({"family": "all", "from": "--family"}) == "every family (`--family all`)"
    assert "each turn's own" in (_family_words({"family": None, "from": "each answer's model"}) or "")
    assert _family_words(None) is None  # a run folder written before the field: no row
    # a family name from a hand-edited run.json cannot break the server table out of its two columns
    from dsv4bench.report.markdown import table

    rendered = table(["fact", "value"], [["model family checked", _family_words({"family": "x|y", "from": "a|b"})]])
    assert all(line.replace("\\|", "").count("|") == 3 for line in rendered.splitlines()), rendered
