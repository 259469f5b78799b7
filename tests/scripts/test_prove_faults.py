"""The proof's bookkeeping: a fault run's corrupt turns count only where its clean twin lacks
them, and the twin comparison says how many turns the fault changed at all."""

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


def test_twins_credit_only_the_faults_own_corruption_and_count_changed_turns(tmp_path):
    fault_dir = _run_dir(tmp_path / "fault", [("s1", 0, "a", []), ("s1", 1, "b?", ["schema_violation"]),
                                              ("s2", 0, "c", ["unknown_tool"]), ("s3", 0, "only here", [])])
    twin_dir = _run_dir(tmp_path / "twin", [("s1", 0, "a", []), ("s1", 1, "b", []), ("s2", 0, "c", ["unknown_tool"])])
    corrupt, outputs = prove.read_turns(fault_dir, prove.read_jsonl(fault_dir / "events.jsonl")[0])
    assert corrupt == {("s1", 1, "schema_violation"): 2.0, ("s2", 0, "unknown_tool"): 2.0}
    run = prove.RunResult("hicache-index-race", False, "CORRUPTION", corrupt_turns=corrupt, outputs=outputs)
    twin_corrupt, twin_outputs = prove.read_turns(twin_dir, prove.read_jsonl(twin_dir / "events.jsonl")[0])
    run.twin = prove.RunResult("hicache-index-race", True, "CORRUPTION", corrupt_turns=twin_corrupt,
                               outputs=twin_outputs)
    expect = frozenset(prove.CORRUPTION_CODES)
    assert run.attributable(expect) == {("s1", 1, "schema_violation")}  # s2's mistake is the model's own
    assert run.differing_turns() == (1, 3)  # s1 turn 1 changed; s3 has no twin turn to compare


def test_unguarded_reads_come_from_the_last_scrape(tmp_path):
    key = 'dsv4mini:hicache_unguarded_index_k_reads_total{engine_type="unified",model_name="dsv4-mini"}'
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps({"values": {key: v, "sglang:num_running_reqs": 3.0}})
                                                      for v in (0.0, 17.0, 42.0)) + "\n")
    assert prove.read_unguarded_reads(tmp_path) == 42
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"values": {"sglang:num_running_reqs": 0.0}}) + "\n")
    assert prove.read_unguarded_reads(tmp_path) is None
