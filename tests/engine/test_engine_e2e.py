"""The real engine in its own process on loopback: the official openai client, 80 concurrent
streams half of which disconnect, malformed requests, and `agents` without --url."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsv4bench.engine.launcher import start_engine

ROOT = Path(__file__).resolve().parents[2]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read main.py please."},
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    ep = start_engine(
        ["--num-pages", "4096", "--max-running-requests", "96"], log_dir=tmp_path_factory.mktemp("engine")
    )
    yield ep
    ep.stop()


def gauges(ep) -> dict[str, float]:
    text = httpx.get(ep.metrics_url, timeout=5).text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_openai_client_streaming_and_not_with_tools(engine):
    with openai.OpenAI(base_url=engine.url, api_key="none", max_retries=0) as client:
        r = client.chat.completions.create(
            model="dsv4-mini", messages=MESSAGES, tools=TOOLS, max_tokens=16, temperature=0
        )
        assert r.id.startswith("chatcmpl-") and r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert r.usage.prompt_tokens > 20 and 1 <= r.usage.completion_tokens <= 16
        chunks = list(
            client.chat.completions.create(
                model="dsv4-mini",
                messages=MESSAGES,
                tools=TOOLS,
                max_tokens=16,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
        # Greedy decoding is deterministic: the same request twice gives the same text.
        again = client.chat.completions.create(
            model="dsv4-mini", messages=MESSAGES, tools=TOOLS, max_tokens=16, temperature=0
        )
        assert again.choices[0].message.content == r.choices[0].message.content
        # The second request reused the prompt's cached pages.
        assert again.usage.prompt_tokens == r.usage.prompt_tokens


def test_80_streams_half_disconnect_leave_nothing_behind(engine):
    async def one(i: int, client: httpx.AsyncClient) -> str:
        body = {
            "model": "dsv4-mini",
            "messages": [*MESSAGES, {"role": "user", "content": f"task {i}"}],
            "tools": TOOLS,
            "max_tokens": 48 if i % 2 else 4000,
            "temperature": 0,
            "stream": True,
        }
        async with client.stream("POST", f"{engine.url}/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            n = 0
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    n += 1
                    if i % 2 == 0 and n >= 3:
                        return "disconnected"  # leaving the block closes the connection mid-stream
            return "finished"

    async def main() -> list[str]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as c:
            return await asyncio.gather(*(one(i, c) for i in range(80)))

    outcomes = asyncio.run(main())
    assert outcomes.count("disconnected") == 40 and outcomes.count("finished") == 40
    last = time.monotonic()
    deadline = last + 1.0
    while True:
        g = gauges(engine)
        if g["sglang:num_running_reqs"] == 0 and g["sglang:num_queue_reqs"] == 0 and g["sglang:token_usage"] == 0:
            break
        assert time.monotonic() < deadline, g
        time.sleep(0.05)
    assert g["sglang:num_aborted_requests_total"] >= 40
    # With the prefix cache flushed, every KV page is free.
    assert httpx.post(f"{engine.url.removesuffix('/v1')}/flush_cache", timeout=10).status_code == 200
    info = httpx.get(f"{engine.url.removesuffix('/v1')}/metrics", timeout=5).text
    used = [
        s.value for f in text_string_to_metric_families(info) for s in f.samples if s.name == "sglang:num_used_tokens"
    ]
    assert used == [0]


@pytest.mark.parametrize(
    "body,raw",
    [
        (None, b"{not json"),
        ({"model": "dsv4-mini", "messages": "hello"}, None),
        ({"model": "dsv4-mini", "messages": MESSAGES, "max_tokens": -5}, None),
        ({"model": "dsv4-mini", "messages": MESSAGES, "temperature": "hot"}, None),
        ({"model": "dsv4-mini", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "sometimes"}, None),
        ({"model": "dsv4-mini", "messages": [{"role": "user", "content": "word " * 40000}]}, None),
    ],
)
def test_malformed_requests_get_4xx_and_the_server_keeps_serving(engine, body, raw):
    url = f"{engine.url}/chat/completions"
    r = (
        httpx.post(url, content=raw, headers={"content-type": "application/json"}, timeout=30)
        if raw
        else httpx.post(url, json=body, timeout=30)
    )
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["message"]
    ok = httpx.post(url, json={"model": "dsv4-mini", "messages": MESSAGES, "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200
    assert httpx.get(f"{engine.url.removesuffix('/v1')}/health", timeout=5).status_code == 200


def test_agents_without_url_starts_the_bundled_engine(tmp_path):
    out = tmp_path / "runs"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "agents",
            "--sessions",
            "2",
            "--concurrency",
            "2",
            "--max-turns",
            "2",
            "--max-tokens",
            "24",
            "--quiet",
            "--out",
            str(out),
            "--engine-arg=--num-pages=1024",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    run_dir = next(out.iterdir())
    run = json.loads((run_dir / "run.json").read_text())
    assert run["server"]["models"] == ["dsv4-mini"] and "bundled_engine" in run["server"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["turns"]["total"] >= 2 and summary["turns"]["error"] == 0
    # The engine's /metrics was wired into the run: scraped during it, and once after the load.
    samples = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert samples and all(s["ok"] for s in samples)
    last = samples[-1]["values"]
    assert last['sglang:num_running_reqs{engine_type="unified",model_name="dsv4-mini"}'] == 0
    assert last['sglang:num_requests_total{engine_type="unified",model_name="dsv4-mini"}'] >= summary["turns"]["total"]


def test_killing_the_harness_stops_its_bundled_engine(tmp_path):
    import os
    import signal

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "agents",
            "--duration",
            "120",
            "--concurrency",
            "2",
            "--quiet",
            "--out",
            str(tmp_path / "runs"),
            "--engine-arg=--num-pages=1024",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    run_json = None
    while time.monotonic() < deadline and run_json is None:
        found = list((tmp_path / "runs").glob("*/run.json")) if (tmp_path / "runs").exists() else []
        run_json = found[0] if found else None
        time.sleep(0.2)
    assert run_json is not None, "the run never started"
    metrics = json.loads(run_json.read_text())["server"]["bundled_engine"]["metrics"]
    assert httpx.get(metrics, timeout=5).status_code == 200
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            httpx.get(metrics, timeout=1)
        except httpx.HTTPError:
            return  # the engine went away with the harness
        time.sleep(0.2)
    raise AssertionError("the bundled engine outlived a SIGKILLed harness")


def test_kill_storm_with_abort_request_leaves_the_engine_idle(engine, tmp_path):
    out = tmp_path / "runs"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "agents",
            "--url",
            engine.url,
            "--concurrency",
            "8",
            "--duration",
            "30",
            "--kill",
            "all@3s,abort",
            "--metrics",
            engine.metrics_url,
            "--metrics-interval",
            "0.25",
            "--drain-timeout",
            "10",
            "--quiet",
            "--out",
            str(out),
            "--fail-on",
            "wedge",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    run_dir = next(out.iterdir())
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    kills = [e for e in events if e["kind"] == "kill"]
    assert len(kills) == 1 and len(kills[0]["sessions"]) == 8
    aborts = [e for e in events if e["kind"] == "abort_request"]
    assert aborts and all(isinstance(v, int) for e in aborts for v in e["results"].values())
    drain = next(e for e in events if e["kind"] == "drain_end")
    assert drain["reason"] == "queues_empty"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["turns"]["killed"] >= 1 and all(not w["codes"] for w in summary["wedge"].values())


def test_triage_classes_the_parser_split_fault_deterministic(tmp_path):
    # parser-split leaks DSML from the server's own stream parse: the same request alone gives the
    # same leak, with the cache and without it: a parser bug, not the load.
    out = tmp_path / "runs"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dsv4bench",
            "agents",
            *("--sessions", "6", "--concurrency", "6", "--max-turns", "3", "--seed", "1"),
            *("--triage", "2", "--persist-sessions", "0", "--quiet", "--out", str(out)),
            "--engine-fault=parser-split",
            "--engine-arg=--num-pages=1024",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    run_dir = next(out.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == "CORRUPTION", r.stderr[-2000:]
    triage = summary["triage"]
    assert triage["determinism"]["deterministic"] is True
    assert triage["findings"] and {f["class"] for f in triage["findings"]} == {"deterministic"}
    assert all(f["alone_hits"] == f["alone_sent"] and f["cold_hit"] for f in triage["findings"])
