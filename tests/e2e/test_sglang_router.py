"""SGLang's real router (`sglang-router`, the Rust model gateway) in front of the bundled engine,
on loopback: `agents --engine-router sglang` through it, kill storms clean and `ghost-decode`
found, and the router registering the bundled PD servers from their own /server_info and
/model_info without reaching for a model hub."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from dsv4bench.cli import app
from dsv4bench.engine import sglang_router
from dsv4bench.engine.launcher import EngineStartError, start_engine

from .conftest import only_run_dir, run_cli

needs_router = pytest.mark.skipif(not sglang_router.installed(), reason=sglang_router.MISSING)


# One kill-all, mid-run. More sessions than slots: a slot whose session ended early takes the
# next, so the kill at 6 s always finds requests in flight (it stops the load: the rest never
# start); with one session a slot, a quick machine finished them all before it.
STORM = ("--concurrency", "6", "--sessions", "18", "--max-turns", "4", "--kill", "all@6s")


def _agents(out: Path, *args: str, load: tuple[str, ...] = STORM, drain_s: float = 8) -> tuple[Path, dict[str, Any]]:
    r = run_cli(
        "agents",
        "--engine-router",
        "sglang",
        "--out",
        str(out),
        "-q",
        "--drain-timeout",
        str(drain_s),
        *load,
        *args,
        timeout=400,
    )
    run_dir = only_run_dir(out)
    return run_dir, {"rc": r.returncode, "stderr": r.stderr, **json.loads((run_dir / "summary.json").read_text())}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@needs_router
def test_kill_storm_through_the_sglang_router_is_clean(tmp_path):
    run_dir, summary = _agents(tmp_path / "out")
    assert summary["rc"] == 0, summary["stderr"]
    assert summary["verdict"] == "CLEAN" and summary["wedge_checked"], summary
    assert summary["turns"]["killed"] > 0 and summary["turns"]["corrupt"] == 0
    router = json.loads((run_dir / "run.json").read_text())["server"]["bundled_engine"]["sglang_router"]
    samples = [s for s in _jsonl(run_dir / "metrics.jsonl") if s["endpoint"] == router["metrics"] and s["ok"]]
    # The router's own metrics were scraped: it counted the run's requests to its worker.
    assert samples and any(
        k.startswith("smg_router_requests_total") and v > 0 for k, v in samples[-1]["values"].items()
    )


@needs_router
def test_ghost_decode_behind_the_sglang_router_is_a_wedge(tmp_path):
    """The router closes its upstream connection when the client leaves, so the engine hears
    the disconnect as it would directly: the planted fault still decodes for nobody. Room for
    4096 tokens keeps every ghost decoding through the drain window: at max_tokens 1024, a
    request killed late in its answer reached it within seconds on a quick machine."""
    run_dir, summary = _agents(tmp_path / "out", "--engine-fault", "ghost-decode", "--max-tokens", "4096")
    assert summary["turns"]["killed"] > 0, summary["turns"]
    assert summary["verdict"] == "WEDGE", summary
    codes = {c for found in summary["wedge"].values() for c in found["codes"]}
    assert "ghost_requests" in codes


# Kill storms every 2 s under a full pool, each of half the sessions still waiting for their first
# token: their KV is on its way between the halves, the abort-leak's trigger.
PD_STORM = (
    "--concurrency",
    "24",
    "--sessions",
    "400",
    "--duration",
    "12",
    "--kill",
    "frac=0.5/every=2s/from=3s,who=ttft",
)
# The drain window for it: the wedge's 5 s without progress, after the two loaded halves have
# finished what was still running when the load stopped (about 1 s here, more on a busier
# machine). A clean engine's window ends when its queues are empty.
PD_DRAIN_S = 12


@needs_router
@pytest.mark.parametrize("fault,verdict", [(None, "CLEAN"), ("abort-leak", "WEDGE")])
def test_pd_halves_as_processes_behind_the_sglang_router(tmp_path, fault, verdict):
    """The prefill and decode halves in two processes, KV between them over loopback TCP, SGLang's
    router in PD mode adding the rooms: the same kill storms leave the clean engine drained and
    wedge the one with the leak."""
    faults = ("--engine-fault", fault) if fault else ()
    run_dir, summary = _agents(tmp_path / "out", "--engine-pd", *faults, load=PD_STORM, drain_s=PD_DRAIN_S)
    assert summary["verdict"] == verdict and summary["wedge_checked"], (summary["turns"], summary["wedge"])
    assert summary["turns"]["killed"] > 0 and summary["turns"]["good"] > 0
    codes = {c for found in summary["wedge"].values() for c in found["codes"]}
    assert codes == (set() if fault is None else {"queue_stuck"}), codes
    # Both halves were scraped, each under its own engine_type.
    samples = [s for s in _jsonl(run_dir / "metrics.jsonl") if s["ok"]]
    types = {k.split('engine_type="')[1].split('"')[0] for s in samples for k in s["values"] if 'engine_type="' in k}
    assert {"prefill", "decode"} <= types


@needs_router
def test_the_sglang_router_registers_the_bundled_pd_servers(tmp_path):
    engine = start_engine(["--pd", "--num-pages", "1024"], log_dir=tmp_path)
    try:
        prefill, decode = engine.roots[1], engine.roots[2]
        router = sglang_router.start_sglang_router(prefill=[(prefill, None)], decode=[decode], log_dir=tmp_path)
        try:
            listed = httpx.get(f"{router.root}/workers", timeout=5).json()["workers"]
            by_url = {w["url"]: w for w in listed}
            assert by_url[prefill]["worker_type"].startswith("prefill") and by_url[decode]["worker_type"] == "decode"
            for w in listed:
                assert w["is_healthy"] and w["model_id"] == "dsv4-mini"
                # The tokenizer comes from a local folder the server names, not from a model hub.
                assert (Path(w["metadata"]["model_path"]) / "tokenizer.json").is_file()
            log = router.log_path.read_text(encoding="utf-8", errors="replace")
            assert "Successfully registered tokenizer" in log and "HuggingFace" not in log
        finally:
            router.stop()
    finally:
        engine.stop()


def test_a_missing_router_is_one_line(monkeypatch):
    monkeypatch.setattr(sglang_router, "installed", lambda: False)
    with pytest.raises(EngineStartError, match=r"pip install 'dsv4bench\[sglang\]'"):
        sglang_router.start_sglang_router(workers=["http://127.0.0.1:1"])
    result = CliRunner().invoke(app, ["agents", "--engine-router", "sglang", "--sessions", "1"])
    assert result.exit_code == 2 and "pip install 'dsv4bench[sglang]'" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--engine-router", "nginx"], "--engine-router must be one of bundled, sglang"),
        (["--engine-router", "sglang", "--url", "http://127.0.0.1:1/v1"], "not with --url"),
    ],
)
def test_bad_engine_router_flags_are_one_line(args, needle):
    result = CliRunner().invoke(app, ["agents", "--sessions", "1", *args])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and needle in lines[0], result.stderr


@needs_router
@pytest.mark.parametrize("fault,code", [(None, 0), ("bootstrap-stall", 1)])
def test_probe_on_the_sglang_router_and_the_halves(tmp_path, fault, code):
    """`probe` on SGLang's router and the two halves behind it: 0 on the healthy deployment
    before and after a storm of clients that leave mid-answer, 1 once the stalled bootstrap
    worker has wedged it (the router still says 200)."""
    routed = start_engine(
        ["--pd", "--router", "sglang", "--num-pages", "2048", *((f"--fault={fault}",) if fault else ())]
    )
    try:
        roots = routed.roots  # SGLang's router, then the prefill and decode processes behind it

        def probe() -> tuple[int, str]:
            r = run_cli("probe", *roots, timeout=120)
            return r.returncode, r.stdout

        assert probe()[0] == 0

        async def storm() -> None:
            async with httpx.AsyncClient(timeout=60, trust_env=False) as client:

                async def one(i: int) -> None:
                    body = {
                        "model": "dsv4-mini",
                        "max_tokens": 200,
                        "stream": True,
                        "messages": [
                            {"role": "user", "content": "Read " + " ".join(f"f{i}_{j}.py" for j in range(40))}
                        ],
                    }
                    async with client.stream("POST", f"{routed.url}/chat/completions", json=body) as r:
                        lines = 0
                        async for _ in r.aiter_lines():
                            lines += 1
                            if lines > 5:
                                return  # the client leaves while its answer streams

                await asyncio.gather(*(one(i) for i in range(12)))

        asyncio.run(storm())
        time.sleep(2)
        found, out = probe()
        assert found == code, out
        if fault:
            assert "canary_timeout" in out and "/health answered 503" in out  # the prefill half says so itself
    finally:
        routed.stop()
