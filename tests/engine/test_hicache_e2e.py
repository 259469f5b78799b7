"""`engine serve --hicache` in its own process: a prompt whose pages other prompts pushed out of
a small device pool is served from the host tier, with the same answer as the first time."""

from __future__ import annotations

import httpx
import pytest

from dsv4bench.engine.launcher import start_engine

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
PAGES, PAGE = 48, 32


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    ep = start_engine(["--hicache", "--num-pages", str(PAGES)], log_dir=tmp_path_factory.mktemp("engine"))
    yield ep
    ep.stop()


def ask(engine, topic: str) -> tuple[dict, dict]:
    body = {
        "model": "dsv4-mini",
        "tools": TOOLS,
        "max_tokens": 24,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You are a coding agent. " + topic * 40},
            {"role": "user", "content": "Read main.py please."},
        ],
    }
    r = httpx.post(f"{engine.url}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    message = out["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return {"content": message.get("content"), "calls": calls}, out["usage"]


def test_a_prefix_pushed_to_the_host_tier_is_served_from_it_with_the_same_answer(engine):
    first, usage = ask(engine, "alpha beta gamma ")
    assert usage["prompt_cache_hit_tokens"] == 0
    others = [ask(engine, topic)[1] for topic in ("delta epsilon zeta ", "eta theta iota ")]
    # The three prompts and their outputs need more pages than the pool has: the first one's
    # pages left the device (least recently used) before it comes back.
    used = sum(-(-(u["prompt_tokens"] + u["completion_tokens"]) // PAGE) for u in [usage, *others])
    assert used > PAGES
    again, usage2 = ask(engine, "alpha beta gamma ")
    assert usage2["prompt_cache_hit_tokens"] == (usage["prompt_tokens"] - 1) // PAGE * PAGE
    assert again == first
    metrics = httpx.get(engine.metrics_url, timeout=10).text
    loaded = [line for line in metrics.splitlines() if line.startswith("dsv4mini:hicache_pages_loaded_total{")]
    assert loaded and float(loaded[0].rsplit(" ", 1)[1]) >= usage2["prompt_cache_hit_tokens"] // PAGE > 0
    assert "dsv4mini:hicache_unguarded_index_k_reads_total{" in metrics
