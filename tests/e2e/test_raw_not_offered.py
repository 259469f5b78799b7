"""End to end: `agents --raw` against a server of another family that cannot render its prompt
(no /tokenize). The oracle is not offered there: said once on stderr, written once to the
history as an event, named in the report; the run goes on and its verdict is the server's."""

from __future__ import annotations

import json

import httpx
import pytest

from dsv4bench.history.run_folder import read_history

from .conftest import only_run_dir, run_cli, start_fixture_server


@pytest.fixture
def qwen_server(tmp_path):
    srv = start_fixture_server("raw_family_server.py", tmp_path, "/v1/models")
    yield srv.root
    srv.stop()


def test_raw_not_offered_for_the_family_is_said_once_recorded_and_reported(qwen_server, tmp_path):
    out = tmp_path / "runs"
    r = run_cli(
        "agents",
        "--url",
        f"{qwen_server}/v1",
        "--raw",
        "--sessions",
        "3",
        "--concurrency",
        "3",
        "--max-turns",
        "2",
        "--quiet",
        "--drain-timeout",
        "1",
        "--canary-timeout",
        "2",
        "--ttft-timeout",
        "5",
        "--out",
        str(out),
        timeout=180,
    )
    run_dir = only_run_dir(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert r.returncode == 0 and summary["verdict"] == "CLEAN", (summary, r.stderr[-2000:])
    assert summary["turns"]["ok"] >= 3
    assert r.stderr.count("--raw: the raw oracle is not offered for qwen models") == 1
    said = [e for e in read_history(run_dir).events if e.get("kind") == "raw_not_offered"]
    assert [(e["family"], e["server"], e["reason"]) for e in said] == [("qwen", f"{qwen_server}/v1", "no /tokenize")]
    report = (run_dir / "report.md").read_text()
    assert "raw oracle not offered for family `qwen` on this server (no /tokenize)" in report
    assert httpx.get(f"{qwen_server}/raw_count").json() == {"raw_completions": 0}  # no raw request was sent
