"""End to end: the real CLI against a hostile server on loopback. Nothing it sends may crash
the harness, go unrecorded, put raw control bytes into the report, or end in a false CLEAN."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dsv4bench.history.run_folder import read_history

from .conftest import ROOT, only_run_dir, run_cli, start_fixture_server

MODES_FILE = ROOT / "tests" / "fixtures" / "hostile_server.py"
# What report.md must never hold: C0 controls but \t \n, DEL, C1, bidi controls, surrogates.
_RAW_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _modes() -> dict[str, frozenset[str] | None]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("hostile_server", MODES_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]  # a file's spec has a loader
    return mod.MODES


def _serve(tmp: Path, modes: str | None = None):
    ledger = tmp / f"ledger-{len(list(tmp.glob('ledger-*')))}.jsonl"
    args = ["--ledger", str(ledger)] + (["--modes", modes] if modes else [])
    return start_fixture_server("hostile_server.py", tmp, "/health", *args), ledger


def _agents(url: str, out: Path, *extra: str):
    return run_cli(
        "agents",
        "--url",
        f"{url}/v1",
        "--concurrency",
        "8",
        "--max-turns",
        "2",
        "--ttft-timeout",
        "4",
        "--total-timeout",
        "3",
        "--canary-timeout",
        "3",
        "--quiet",
        "--out",
        str(out),
        *extra,
        timeout=120,
    )


def _assert_report_safe(run_dir: Path) -> str:
    raw = (run_dir / "report.md").read_bytes()
    text = raw.decode("utf-8")  # strict: valid UTF-8 throughout
    assert not _RAW_UNSAFE.search(text), repr(_RAW_UNSAFE.search(text))
    return text


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """One run of every hostile mode, one session each (streamed), and its ledger."""
    tmp = tmp_path_factory.mktemp("hostile")
    srv, ledger = _serve(tmp)
    try:
        r = _agents(srv.root, tmp / "runs", "--sessions", str(len(_modes())))
    finally:
        srv.stop()
    return r, only_run_dir(tmp / "runs"), ledger


def test_every_hostile_answer_is_recorded_with_its_verdict(hostile_run):
    r, run_dir, ledger = hostile_run
    assert "Traceback" not in r.stderr and "ExceptionGroup" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "CORRUPTION" and summary["history"]["complete"]
    h = read_history(run_dir)
    assert h.complete and h.skipped_lines == 0
    served = [json.loads(line) for line in ledger.read_text().splitlines()]
    by_turn = {(t.session, t.turn): t for t in h.turns}
    modes = _modes()
    missing, wrong = [], []
    for s in served:
        turn = by_turn.get((s["session"], s["turn"]))
        if turn is None:
            missing.append(s)
            continue
        got = {v.code for v in turn.verdicts}
        want = modes[s["mode"]]
        if (want is None and got) or (want is not None and not got & want):
            wrong.append((s["mode"], sorted(got), [v.detail for v in turn.verdicts]))
    assert not missing and not wrong, (missing, wrong)
    assert {s["mode"] for s in served} == set(modes)  # every mode was served
    assert len(h.turns) == len(served)
    details = {v.detail for t in h.turns for v in t.verdicts}
    assert any("more than 128 tool calls" in d for d in details)
    assert any("SSE line longer than" in d for d in details)
    assert any("arguments longer than" in d for d in details)
    assert any("lone UTF-16 surrogate" in d for d in details)
    assert any("Retry-After: 2" in d for d in details)
    # Bounded evidence: no record keeps more than a few hundred KiB of raw SSE.
    assert max(len(line) for line in (run_dir / "turns.jsonl").read_text().splitlines()) < 1_000_000


def test_hostile_report_is_escaped_and_rebuilds_the_same_verdict(hostile_run):
    _, run_dir, _ = hostile_run
    text = _assert_report_safe(run_dir)
    assert "\\x00" in text or "\\u0000" in text  # the NUL is shown, escaped
    before = json.loads((run_dir / "summary.json").read_text())["verdict"]
    r = run_cli("report", str(run_dir))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.split()[0] == before == json.loads((run_dir / "summary.json").read_text())["verdict"]


def test_lost_records_say_incomplete_never_clean(tmp_path):
    srv, _ = _serve(tmp_path, "normal")
    try:
        r = _agents(srv.root, tmp_path / "runs", "--sessions", "4")
    finally:
        srv.stop()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "CLEAN" and summary["wedge_checked"] is False
    # the verdict's qualifiers: the unjudged wedge first, then what else the run could not have found
    assert "**CLEAN** (wedge not checked: no --metrics endpoint; not exercised: " in _assert_report_safe(run_dir)
    lines = (run_dir / "turns.jsonl").read_text().splitlines()
    assert len(lines) == 4

    def tampered(name: str, text: str) -> dict:
        copy = tmp_path / name
        shutil.copytree(run_dir, copy)
        (copy / "turns.jsonl").write_text(text)
        r = run_cli("report", str(copy))
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert r.stdout.startswith("INCOMPLETE"), r.stdout
        assert "Incomplete history" in (copy / "report.md").read_text()
        return json.loads((copy / "summary.json").read_text())

    dropped = tampered("dropped", "\n".join(lines[:2]) + "\n")
    assert dropped["verdict"] == "INCOMPLETE" and not dropped["history"]["complete"]
    torn = tampered("torn", "\n".join([lines[0], lines[1][:40], *lines[2:]]) + "\n")
    assert any("unreadable" in g for g in torn["history"]["gaps"])
    tampered("torn_tail", "\n".join(lines[:3]) + "\n" + lines[3][:50])  # a finished run has no torn tail
