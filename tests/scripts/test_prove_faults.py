"""The proof's bookkeeping: corrupt turns and when they came, the reference recipe's row (found
by reference_mismatch, with the compared-turn counts), and the race's own counter."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("prove_faults", Path(__file__).parents[2] / "scripts" / "prove_faults.py")
assert _spec and _spec.loader
prove = sys.modules["prove_faults"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(prove)


def _run_dir(path: Path, turns: list[tuple[str, int, str, list[str]]]) -> Path:
    """A run folder with a run_start event and one ok turn per (session, turn, text, codes)."""
    path.mkdir()
    (path / "events.jsonl").write_text(json.dumps({"kind": "run_start", "t_ns": 1_000_000_000}) + "\n")
    with open(path / "turns.jsonl", "w") as f:
        for session, n, text, codes in turns:
            f.write(json.dumps({"session": session, "turn": n, "status": "ok",
                                "timings": {"end_ns": 3_000_000_000},
                                "response": {"content": text, "tool_calls": []},
                                "verdicts": [{"code": c, "detail": ""} for c in codes]}) + "\n")
    return path


def test_corrupt_turns_are_timed_from_the_run_start(tmp_path):
    run_dir = _run_dir(tmp_path / "fault", [("s1", 0, "a", []), ("s1", 1, "b?", ["schema_violation"]),
                                            ("s2", 0, "c", ["reference_mismatch", "parser_disagreement"])])
    corrupt = prove.read_turns(run_dir, prove.read_jsonl(run_dir / "events.jsonl")[0])
    # parser_disagreement is not a verdict about the server
    assert corrupt == {("s1", 1, "schema_violation"): 2.0, ("s2", 0, "reference_mismatch"): 2.0}


def test_the_reference_recipes_row_counts_mismatches_and_a_clean_mismatch_is_dirty():
    [recipe] = [r for r in prove.RECIPES if r.reference]
    assert recipe.expect == frozenset({"reference_mismatch"})
    found = prove.RunResult(recipe.fault, False, "CORRUPTION", {"reference_mismatch": 2}, 31.5,
                            unguarded_reads=400, reference={"compared": 300, "mismatched": 2})
    missed = prove.RunResult(recipe.fault, False, "CLEAN", {}, None, unguarded_reads=350,
                             reference={"compared": 310, "mismatched": 0})
    clean = prove.RunResult(recipe.fault, True, "CLEAN", {}, None, reference={"compared": 320, "mismatched": 0})
    dirty = prove.RunResult(recipe.fault, True, "CORRUPTION", {"reference_mismatch": 1}, None,
                            reference={"compared": 320, "mismatched": 1})
    text = prove.table([found, missed, clean, dirty], (recipe,), 2)
    row = next(line for line in text.splitlines() if line.startswith(f"| `{recipe.fault}`"))
    assert "| 1/2 |" in row and "2 of 610 compared turns answered differently" in row
    assert "350-400 unguarded index-K reads" in row and "31.5 s" in row and "--reference CLEAN_RUN" in row
    assert "| 1/2 clean |" in text.splitlines()[-1]


def test_unguarded_reads_come_from_the_last_scrape(tmp_path):
    key = 'dsv4mini:hicache_unguarded_index_k_reads_total{engine_type="unified",model_name="dsv4-mini"}'
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps({"values": {key: v, "sglang:num_running_reqs": 3.0}})
                                                      for v in (0.0, 17.0, 42.0)) + "\n")
    assert prove.read_unguarded_reads(tmp_path) == 42
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"values": {"sglang:num_running_reqs": 0.0}}) + "\n")
    assert prove.read_unguarded_reads(tmp_path) is None
