"""--triage and --recheck end to end: the real CLI against tests/fixtures/triage_server.py on
loopback, one server per cause of corruption, each finding classed as its cause says; a server
whose greedy answers vary is said to be so and nothing on it is classed."""

from __future__ import annotations

import json

import pytest

from dsv4bench.history.run_folder import read_history

from .conftest import only_run_dir, run_cli, start_fixture_server

# Three sessions side by side, two turns each: the second turn is the one the server corrupts.
RUN = ("--sessions", "3", "--concurrency", "3", "--max-turns", "2", "--seed", "5", "--quiet", "--persist-sessions", "0")


def _run(tmp_path, mode: str, *flags: str, above: int = 1, load: tuple[str, ...] = RUN) -> tuple[dict, object]:
    srv = start_fixture_server("triage_server.py", tmp_path, "/health", "--mode", mode, "--above", str(above))
    try:
        out = tmp_path / "runs"
        r = run_cli("agents", "--url", f"{srv.root}/v1", *load, *flags, "--out", str(out))
        assert "Traceback" not in r.stderr, r.stderr
        run_dir = only_run_dir(out)
        return json.loads((run_dir / "summary.json").read_text()), run_dir
    finally:
        srv.stop()


def _classes(summary: dict) -> set[str]:
    return {f["class"] for f in summary["triage"]["findings"]}


@pytest.mark.parametrize(
    ("mode", "cls"),
    [("deterministic", "deterministic"), ("load", "load_dependent"), ("cache", "cache_state")],
)
def test_each_cause_is_classed_as_it_is(tmp_path, mode, cls):
    s, run_dir = _run(tmp_path, mode)
    t = s["triage"]
    assert s["verdict"] == "CORRUPTION" and t["determinism"]["deterministic"] is True
    assert t["findings"] and _classes(s) == {cls}
    assert all(f["codes"] == ["dsml_leak_content"] for f in t["findings"])
    # What was sent alone is in the history as events, and never a turn of the run.
    h = read_history(run_dir)
    alone = [e for e in h.events if e.get("kind") == "alone_request"]
    assert len(alone) == t["requests"] > 0 and s["turns"]["total"] == len(h.turns) == 6
    assert all(e["purpose"] in ("determinism", "triage", "triage_cold") for e in alone)
    report = (run_dir / "report.md").read_text()
    section = report.split("## Triage", 1)[1].split("\n## ", 1)[0]
    hits = {"load": 0}.get(mode, 3)
    assert section.count("\n- s0") == section.count(f"alone {hits} of 3") == len(t["findings"])
    if mode == "cache":
        # The probe's own cold send missed the cache and answered otherwise: evidence, not nondeterminism.
        assert t["determinism"]["cold_differs"] is True
        assert all(f["alone_hits"] == f["alone_sent"] and f["cold_hit"] is False for f in t["findings"])


def test_a_server_whose_greedy_answers_vary_is_said_so_and_nothing_is_classed(tmp_path):
    s, run_dir = _run(tmp_path, "vary")
    t = s["triage"]
    assert t["determinism"]["deterministic"] is False
    assert t["findings"] and _classes(s) == {"not_classed"}
    assert "not deterministic at temperature 0" in (run_dir / "report.md").read_text()


def test_triage_off_sends_nothing_alone(tmp_path):
    s, run_dir = _run(tmp_path, "deterministic", "--triage", "off")
    assert s["verdict"] == "CORRUPTION" and s["triage"] is None
    assert not [e for e in read_history(run_dir).events if e.get("kind") == "alone_request"]


def test_recheck_finds_an_answer_the_load_changed_and_a_clean_server_gives_none(tmp_path):
    # the answer changes with 2 requests in flight: only a screen of one at a time can see it
    s, run_dir = _run(tmp_path, "changed", "--recheck", "1", "--recheck-group", "1")
    t = s["triage"]
    changed = [f for f in t["findings"] if f["codes"] == ["answer_changed_under_load"]]
    assert s["verdict"] == "CORRUPTION" and s["turns"]["corrupt"] == 0  # no checker saw it
    assert changed and s["counts"]["answer_changed_under_load"] == len(changed) == t["recheck"]["changed"]
    assert {f["class"] for f in changed} == {"load_dependent"}
    assert all(f["where"] == "content" for f in changed)
    # Every (scenario, depth) pair was kept at least once at share 1: every clean greedy turn.
    assert t["recheck"]["kept"] == t["recheck"]["seen"] == t["recheck"]["rechecked"]

    (tmp_path / "clean").mkdir()
    clean, _ = _run(tmp_path / "clean", "deterministic", "--recheck", "1", "--max-turns", "1")
    assert clean["verdict"] == "CLEAN" and clean["counts"]["answer_changed_under_load"] == 0
    assert clean["triage"]["recheck"]["rechecked"] > 0 and not clean["triage"]["findings"]


def test_the_screen_finds_a_change_above_its_group(tmp_path):
    # 12 sessions at once; the answer changes above 8 requests in flight. The default screen (8
    # at once) gets the answer the load should have given, and the alone confirmation judges.
    # (What the screen gives up, a change within its group, is tests/test_triage.py's: here the
    # recheck's last sessions run with fewer beside them, so it would show by chance.)
    load = ("--sessions", "12", "--concurrency", "12", "--max-turns", "2", "--seed", "5", "--quiet")
    s, run_dir = _run(tmp_path, "changed", "--recheck", "1", "--persist-sessions", "0", above=8, load=load)
    t = s["triage"]
    assert t["recheck"]["changed"] > 0 and s["verdict"] == "CORRUPTION"
    assert {f["class"] for f in t["findings"]} == {"load_dependent"} and t["recheck"]["screen_only"] == 0
    purposes = [e["purpose"] for e in read_history(run_dir).events if e.get("kind") == "alone_request"]
    assert purposes.count("recheck") == 2 * t["recheck"]["changed"]  # each change confirmed alone twice
    assert purposes.count("recheck_screen") == t["recheck"]["rechecked"]


def test_recheck_drops_the_prefix_cache_first_so_a_cached_wrong_answer_is_not_handed_back(tmp_path):
    # `stale` caches the answer the load changed, as a cache holding KV a race wrote: sent again
    # over that cache, the request gets the load's answer back and nothing differs.
    s, run_dir = _run(tmp_path, "stale", "--recheck", "1", "--recheck-group", "1")
    t = s["triage"]
    assert t["cache_flush"] == {"path": "/flush_cache", "flushed": True, "detail": "/flush_cache: HTTP 200"}
    assert t["recheck"]["changed"] > 0 and s["verdict"] == "CORRUPTION"
    events = [e["kind"] for e in read_history(run_dir).events]
    assert events.index("cache_flush") < events.index("alone_request")  # dropped before any recheck

    (tmp_path / "kept").mkdir()
    kept, _ = _run(tmp_path / "kept", "stale", "--recheck", "1", "--recheck-group", "1", "--recheck-keep-cache")
    assert "cache_flush" not in kept["triage"] and kept["triage"]["recheck"]["changed"] == 0
    assert kept["triage"]["recheck"]["rechecked"] > 0 and kept["verdict"] == "CLEAN"
