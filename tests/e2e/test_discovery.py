"""One URL is enough: `agents --url ROUTER/v1` with no --metrics finds the bundled PD engine's
halves at the router's /workers, scrapes them, and lists them in the report's header."""

from __future__ import annotations

import json

from dsv4bench.engine.launcher import start_engine

from .conftest import only_run_dir, run_cli


def test_agents_with_the_routers_url_alone_scrapes_the_halves_it_lists(tmp_path):
    with start_engine(["--pd", "--num-pages", "1024"], log_dir=tmp_path / "engine") as engine:
        router, prefill, decode = engine.roots
        r = run_cli(
            "agents",
            "--url",
            engine.url,
            "--sessions",
            "1",
            "--max-turns",
            "1",
            "--no-stream",
            "--metrics-interval",
            "0.2",
            "--drain-timeout",
            "2",
            "--out",
            str(tmp_path / "runs"),
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert "deployment: 3 servers (from " in r.stderr and "transfer tcp" in r.stderr, r.stderr
        assert f"found 2 servers behind the router at {router} (its /workers)" in r.stderr, r.stderr
        run_dir = only_run_dir(tmp_path / "runs")
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["verdict"] == "CLEAN" and summary["wedge_checked"], summary
        assert {f"{prefill}/metrics", f"{decode}/metrics"} <= set(summary["wedge"])
        assert [(e["root"], e["role"]) for e in summary["deployment"]["endpoints"]] == [
            (router, "router"),
            (prefill, "prefill"),
            (decode, "decode"),
        ]
        run = json.loads((run_dir / "run.json").read_text())
        assert run["server"]["deployment"]["found_via"] == [router]
        header = (run_dir / "report.md").read_text().split("## Run", 1)[0]
        assert "**Deployment** (3 servers, from " in header
        for role, root in (("router", router), ("prefill", prefill), ("decode", decode)):
            assert f"{role} `{root.removeprefix('http://')}`" in header, header
        assert "| `disaggregation_transfer_backend` | – | tcp | tcp |" in header, header
        assert "| `disable_overlap_schedule` | – | off | off |" in header, header
