"""summary.json's shape, held against a golden list: other tools read these names, so a block or a
field renamed, dropped or moved fails here by name; and the file read back through the codec."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from dsv4bench.history.run_folder import SUMMARY_FILE, read_history
from dsv4bench.history.verdict import RunVerdict
from dsv4bench.report import build_report
from dsv4bench.report.summary import VERDICTS, summarize, summary_of
from dsv4bench.report.summary_types import Summary, decode_summary

# summary.json's top-level keys, in the file's order. A new block: its name here, where it goes.
SUMMARY_KEYS = [
    "summary_version",
    "run",
    "verdict",
    "wedge_checked",
    "wedge_unchecked_reason",
    "history",
    "partial",
    "end_reason",
    "skipped_lines",
    "duration_s",
    "turns",
    "corrupt_rate",
    "tool_calls",
    "bad_tool_calls",
    "counts",
    "rates",
    "check_errors",
    "unjudged",
    "sessions",
    "by_depth",
    "by_scenario",
    "by_variant",
    "percentile_method",
    "latency",
    "events",
    "harness",
    "wedge",
    "reference",
    "deployment",
    "slo",
    "triage",
    "persistence",
    "first_findings",
    "cache",
    "coverage",
]
TURNS_KEYS = ["total", "ok", "good", "killed", "corrupt", "error"]
# The contract blocks with a fixed shape: where each is found in the file, and its keys in order.
BLOCK_KEYS = {
    "turns": TURNS_KEYS,
    "history": ["complete", "gaps", "finished"],
    "sessions": ["count", "finished", "ended_by"],
    "latency": ["ttft_s", "itl_s", "e2e_s"],
    "latency.ttft_s": ["p50", "p90", "p99", "max", "n"],
    "rates.schema_violation": ["per_turn", "per_tool_call"],
    "by_depth.0": TURNS_KEYS,
    "by_scenario.coding": TURNS_KEYS,
    "reference": ["run_dir", "answers", "conflicts", "compared", "mismatched"],
}
VERDICT_SPELLINGS = ["WEDGE", "POISONED", "CORRUPTION", "INCOMPLETE", "ERRORS", "CLEAN"]


def renamed(want: list[str], got: list[str]) -> str:
    """What a reader of the file would see changed: names gone, names new, or the order."""
    gone, new = [k for k in want if k not in got], [k for k in got if k not in want]
    return f"gone {gone}, new {new}" if gone or new else f"order now {got}"


@pytest.fixture
def written(corruption_run: Path) -> dict:
    """summary.json of the eight-turn corruption run, with a --reference block, read back."""
    run = json.loads((corruption_run / "run.json").read_text())
    run["reference"] = {"run_dir": "/runs/ref", "answers": 3}
    (corruption_run / "run.json").write_text(json.dumps(run))
    return json.loads(summary_of(read_history(corruption_run)).to_json())  # the bytes build_report writes


def test_the_summary_keeps_its_top_level_names_in_order(written: dict) -> None:
    assert list(written) == SUMMARY_KEYS, renamed(SUMMARY_KEYS, list(written))


@pytest.mark.parametrize("path", list(BLOCK_KEYS))
def test_each_contract_block_keeps_its_names(written: dict, path: str) -> None:
    block = written
    for part in path.split("."):
        block = block[part]
    assert list(block) == BLOCK_KEYS[path], f"{path}: " + renamed(BLOCK_KEYS[path], list(block))


def test_verdicts_keep_their_spellings_worst_first() -> None:
    assert [v.value for v in RunVerdict] == VERDICT_SPELLINGS == list(VERDICTS)
    assert f"{RunVerdict.CLEAN}" == "CLEAN"  # what the verdict line prints


def test_the_file_reads_back_through_the_codec_as_the_summary_it_was(corruption_run: Path) -> None:
    build_report(corruption_run)
    data = (corruption_run / SUMMARY_FILE).read_bytes()
    typed = summary_of(read_history(corruption_run))
    back = decode_summary(data)
    assert back == typed and back.verdict is RunVerdict.CORRUPTION
    assert back.to_json() == data
    # The dict consumers read is the file's JSON, verdict as its plain string.
    assert summarize(read_history(corruption_run)) == json.loads(data) and type(json.loads(data)["verdict"]) is str


def test_a_block_without_a_field_fails_by_name() -> None:
    with pytest.raises(TypeError, match="surprise"):
        Summary.from_blocks({"surprise": 1})


def test_a_verdict_outside_the_enum_fails(corruption_run: Path) -> None:
    blocks = summary_of(read_history(corruption_run)).to_dict()
    blocks["verdict"] = "FINE"
    with pytest.raises(msgspec.ValidationError, match="verdict"):
        Summary.from_blocks(blocks)


def test_text_utf8_cannot_hold_reads_back_as_itself(run_folder, make_turn) -> None:
    """A run id with a lone surrogate (a hand-edited run.json) is written with ASCII escapes."""
    run_dir = run_folder([make_turn()], run={"run": "run-\udc80-é"})
    build_report(run_dir)
    data = (run_dir / SUMMARY_FILE).read_bytes()
    assert data.isascii() and json.loads(data)["run"] == "run-\udc80-é"


def test_secrets_are_masked_by_structure_in_the_file(run_folder, make_turn) -> None:
    """Wedge findings keep the keys a monitor wrote; one that names a credential is masked."""
    run = {"run": "r", "wedge": {"http://decode:30000": {"codes": [], "gauges": {}, "api_key": "sk-live-123456"}}}
    run_dir = run_folder([make_turn()], run=run)
    summary = build_report(run_dir)
    assert summary["wedge"]["http://decode:30000"]["api_key"] == "sk-live-123456"  # the finding was kept
    assert "sk-live" not in (run_dir / SUMMARY_FILE).read_text()
