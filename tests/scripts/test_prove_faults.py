"""The proof's bookkeeping: corrupt turns and when they came, the reference recipe's row (found
by reference_mismatch, with the compared-turn counts), the race's own counter, and the router
column (SGLang's router in front of every run, its own /health lie kept apart)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from tests.scripts.script_loader import load_script

prove = load_script("prove_faults")


def _run_dir(path: Path, turns: list[tuple[str, int, str, list[str]]]) -> Path:
    """A run folder with a run_start event and one ok turn per (session, turn, text, codes)."""
    path.mkdir()
    (path / "events.jsonl").write_text(json.dumps({"kind": "run_start", "t_ns": 1_000_000_000}) + "\n")
    with open(path / "turns.jsonl", "w") as f:
        for session, n, text, codes in turns:
            f.write(
                json.dumps(
                    {
                        "session": session,
                        "turn": n,
                        "status": "ok",
                        "timings": {"end_ns": 3_000_000_000},
                        "response": {"content": text, "tool_calls": []},
                        "verdicts": [{"code": c, "detail": ""} for c in codes],
                    }
                )
                + "\n"
            )
    return path


def test_corrupt_turns_are_timed_from_the_run_start(tmp_path):
    run_dir = _run_dir(
        tmp_path / "fault",
        [
            ("s1", 0, "a", []),
            ("s1", 1, "b?", ["schema_violation"]),
            ("s2", 0, "c", ["reference_mismatch", "parser_disagreement"]),
        ],
    )
    corrupt = prove.read_turns(run_dir, prove.read_jsonl(run_dir / "events.jsonl")[0])
    # parser_disagreement is not a verdict about the server
    assert corrupt == {("s1", 1, "schema_violation"): 2.0, ("s2", 0, "reference_mismatch"): 2.0}


def test_the_reference_recipes_row_counts_mismatches_and_a_clean_mismatch_is_dirty():
    [recipe] = [r for r in prove.RECIPES if r.reference]
    assert recipe.expect == frozenset({"reference_mismatch"})
    found = prove.RunResult(
        recipe.fault,
        False,
        "CORRUPTION",
        {"reference_mismatch": 2},
        31.5,
        unguarded_reads=400,
        reference={"compared": 300, "mismatched": 2},
    )
    missed = prove.RunResult(
        recipe.fault, False, "CLEAN", {}, None, unguarded_reads=350, reference={"compared": 310, "mismatched": 0}
    )
    clean = prove.RunResult(recipe.fault, True, "CLEAN", {}, None, reference={"compared": 320, "mismatched": 0})
    dirty = prove.RunResult(
        recipe.fault, True, "CORRUPTION", {"reference_mismatch": 1}, None, reference={"compared": 320, "mismatched": 1}
    )
    text = prove.table([found, missed, clean, dirty], (recipe,), 2)
    row = next(line for line in text.splitlines() if line.startswith(f"| `{recipe.fault}`"))
    assert "| 1/2 |" in row and "2 of 610 compared turns answered differently" in row
    assert "350-400 unguarded index-K reads" in row and "31.5 s" in row and "--reference CLEAN_RUN" in row
    assert "| 1/2 clean |" in text.splitlines()[-1]


def test_unguarded_reads_come_from_the_last_scrape(tmp_path):
    key = 'dsv4mini:hicache_unguarded_index_k_reads_total{engine_type="unified",model_name="dsv4-mini"}'
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"values": {key: v, "sglang:num_running_reqs": 3.0}}) for v in (0.0, 17.0, 42.0)) + "\n"
    )
    assert prove.read_unguarded_reads(tmp_path) == 42
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"values": {"sglang:num_running_reqs": 0.0}}) + "\n")
    assert prove.read_unguarded_reads(tmp_path) is None


def _recipe(name: str):
    return next(r for r in prove.RECIPES if r.fault == name)


def test_the_sglang_router_column_passes_engine_router_to_every_run(tmp_path):
    recipe = _recipe("abort-leak")
    bundled = prove.agents_command(recipe, False, 3, tmp_path)
    assert "--engine-router" not in bundled and "--engine-fault=abort-leak" in bundled
    routed = prove.agents_command(recipe, True, 3, tmp_path, router="sglang")
    assert routed[-2:] == ["--engine-router", "sglang"] and "--engine-arg=--pd" in routed
    assert not any(a.startswith("--engine-fault") for a in routed)  # the clean replay keeps the router
    assert prove.router_label("bundled") == "bundled"
    assert prove.router_label("sglang") in (
        f"SGLang {importlib.metadata.version('sglang-router')}",
        "SGLang (not installed)",
    )


def _wedged(router_root: str) -> tuple[dict, list[dict]]:
    """A bootstrap-stall run's summary as SGLang's router in front of two halves leaves it."""
    summary = {
        "counts": {},
        "wedge": {
            "http://127.0.0.1:9002/metrics": {"codes": ["queue_stuck"]},
            f"{router_root}/v1": {"codes": ["canary_timeout", "health_lies"]},
            "http://127.0.0.1:9003/health_generate": {"codes": []},
        },
    }
    events = [
        {"kind": "run_start", "t_ns": 0},
        {"kind": "drain_end", "t_ns": 30_000_000_000},
        {"kind": "health", "endpoint": f"{router_root}/health", "role": "router"},
        {"kind": "health", "endpoint": "http://127.0.0.1:9002/health", "role": "prefill"},
    ]
    return summary, events


def test_sglang_routers_own_health_lie_is_kept_apart_and_finds_no_fault():
    summary, events = _wedged("http://127.0.0.1:9000")
    routers = prove.router_roots(events)
    assert routers == {"http://127.0.0.1:9000"}
    codes, first = prove.read_findings(summary, {"health_lies"}, {}, events, routers)
    assert codes == {"queue_stuck": 1, "canary_timeout": 1, "health_lies@router": 1} and first is None
    codes, first = prove.read_findings(summary, {"queue_stuck", "canary_timeout"}, {}, events, routers)
    assert first == 30.0  # the stall itself is still found, at the end of the drain window
    # behind our own router /health is a generation through both halves: its lie is the fault's
    codes, first = prove.read_findings(summary, {"health_lies"}, {}, events)
    assert codes["health_lies"] == 1 and first == 30.0
    # a server behind SGLang's router that lies is the fault found
    summary["wedge"]["http://127.0.0.1:9003/health_generate"]["codes"] = ["health_lies"]
    codes, first = prove.read_findings(summary, {"health_lies"}, {}, events, routers)
    assert codes["health_lies"] == 1 and codes["health_lies@router"] == 1 and first == 30.0


def test_the_table_has_a_router_column_and_says_what_the_routers_own_lie_is():
    recipe = _recipe("health-lies")
    lied = prove.RunResult(recipe.fault, False, "WEDGE", {"canary_timeout": 1, "health_lies@router": 1}, None)
    clean = prove.RunResult(recipe.fault, True, "CLEAN", {}, None)
    label = prove.router_label("sglang")
    lines = prove.table([lied, clean], (recipe,), 1, "sglang").splitlines()
    assert lines[0].startswith("| fault | router | expected code | found |")
    assert lines[2].startswith(
        f"| `health-lies` | {label} | health_lies | 0/1 | canary_timeout (1), health_lies@router (1) | - |"
    )
    assert lines[2].endswith("--canary-timeout 5 --engine-router sglang` |")  # the row's recipe reproduces it
    assert lines[3].startswith(f"| clean (recipes' settings, no fault) | {label} | none | 1/1 clean |")
    assert lines[-1].startswith("`health_lies@router`: SGLang's router answered its own /health 200")
    text = prove.table([clean], (recipe,), 1)
    assert "| bundled |" in text and "@router" not in text and "--engine-router" not in text


def test_with_recheck_the_reference_recipe_is_judged_in_one_run_by_an_answer_changed():
    [original] = [r for r in prove.RECIPES if r.reference]
    recipe = original.rechecked(1.0)
    assert recipe.expect == frozenset({"answer_changed_under_load"}) and not recipe.reference
    for clean in (False, True):  # the clean runs are rechecked too: a change there is a false alarm
        cmd = prove.agents_command(recipe, clean, 3, Path("/tmp/x"))
        assert cmd[cmd.index("--recheck") + 1] == "1" and "--reference" not in cmd
    # its own load and engine, not the reference recipe's 90 s over 1,024 device pages
    duration = cmd[cmd.index("--duration") + 1]
    assert duration == original.recheck_load[original.recheck_load.index("--duration") + 1] != "90"
    assert "--engine-arg=--num-pages=512" in cmd and "--engine-arg=--num-pages=1024" not in cmd
    untouched = [r for r in prove.RECIPES if not r.reference][0]
    assert untouched.rechecked(1.0) is untouched
    found = prove.RunResult(
        recipe.fault,
        False,
        "CORRUPTION",
        {"answer_changed_under_load": 1},
        118.0,
        triage={"recheck": {"rechecked": 130, "changed": 1}},
    )
    missed = prove.RunResult(
        recipe.fault, False, "CLEAN", {}, None, triage={"recheck": {"rechecked": 120, "changed": 0}}
    )
    row = next(line for line in prove.table([found, missed], (recipe,), 2).splitlines() if recipe.fault in line)
    assert "| 1/2 |" in row and "1 of 250 rechecked turns answered differently alone" in row and "--recheck 1" in row


def test_a_recheck_verdict_is_timed_at_the_last_alone_send_of_the_first_turn_found():
    def alone(session: str, turn: int, purpose: str, t_s: float) -> dict:
        return {"kind": "alone_request", "purpose": purpose, "session": session, "turn": turn, "t_ns": int(t_s * 1e9)}

    events = [
        {"kind": "run_start", "t_ns": 10_000_000_000},
        alone("s1", 2, "recheck_screen", 50),  # a screen judges nothing
        alone("s2", 3, "recheck_screen", 51),
        alone("s2", 3, "recheck", 52),
        alone("s2", 3, "recheck", 53),  # s2 turn 3 found here: 43 s after the start
        alone("s4", 1, "recheck", 54),  # sent alone, not a finding
        alone("s3", 4, "recheck", 60),
    ]
    finding = {"codes": ["answer_changed_under_load"]}
    summary = {
        "triage": {"findings": [{**finding, "session": "s3", "turn": 4}, {**finding, "session": "s2", "turn": 3}]}
    }
    assert prove.recheck_verdict_s(summary, events) == 43.0
    assert prove.recheck_verdict_s({"triage": {"findings": []}}, events) is None
    assert prove.recheck_verdict_s(summary, events[1:]) is None  # no run start: not timed
