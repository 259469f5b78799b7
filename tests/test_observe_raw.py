"""The --raw oracle's prompt per family and server: deepseek-recipe's for DeepSeek-V4, the
server's own /tokenize rendering for other families, and "not offered", said once, where the
server cannot render: on stderr, and in a run's history as an event the report lists."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx

from dsv4bench.harness import server_watch as observe
from dsv4bench.history.run_folder import HistoryWriter, read_history

BODY = {
    "messages": [{"role": "user", "content": "Read src/main.py"}],
    "max_tokens": 64,
    "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}],
}


def ask(
    model: str,
    tokenize: bool,
    not_offered: observe.RawNotOffered | None = None,
) -> tuple[list[str | None], list[tuple[str, dict[str, Any]]]]:
    """Two turns' raw completions from a fake server, and every request it got (path, body)."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [1, 2, 3], "count": 3}) if tokenize else httpx.Response(404)
        return httpx.Response(200, json={"choices": [{"text": "raw text", "finish_reason": "stop"}]})

    async def main() -> list[str | None]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            return [
                await observe.raw_completion(
                    client, f"http://{model.replace('/', '-')}.test/v1", {**BODY, "model": model}, {}, 5.0, not_offered
                )
                for _ in range(2)
            ]

    return anyio.run(main), seen


def test_a_deepseek_v4_model_gets_deepseek_recipes_prompt() -> None:
    texts, seen = ask("DeepSeek-V4-Pro", tokenize=True)
    assert texts == ["raw text", "raw text"] and [p for p, _ in seen] == ["/v1/completions"] * 2
    prompt = seen[0][1]["prompt"]
    assert isinstance(prompt, str) and prompt.startswith("<｜begin▁of▁sentence｜>")
    assert seen[0][1]["skip_special_tokens"] is False


def test_another_family_gets_the_servers_own_rendering() -> None:
    texts, seen = ask("Qwen/Qwen3-32B", tokenize=True)
    assert texts == ["raw text", "raw text"]
    assert [p for p, _ in seen] == ["/tokenize", "/v1/completions"] * 2
    assert seen[0][1]["messages"] == BODY["messages"] and seen[0][1]["tools"] == BODY["tools"]
    assert seen[1][1]["prompt"] == [1, 2, 3]


def test_a_server_that_cannot_render_is_not_offered_the_oracle_said_once(capsys) -> None:
    texts, seen = ask("Qwen/Qwen3-32B-norender", tokenize=False)
    assert texts == [None, None] and [p for p, _ in seen] == ["/tokenize"]  # asked once, no raw request
    err = capsys.readouterr().err
    assert err.count("--raw: the raw oracle is not offered for qwen models") == 1 and "goes on without it" in err


def test_a_model_of_no_known_family_falls_back_to_deepseek_recipe() -> None:
    texts, seen = ask("mystery-model", tokenize=False)
    assert texts == ["raw text", "raw text"]
    assert [p for p, _ in seen] == ["/tokenize", "/v1/completions", "/v1/completions"]
    assert isinstance(seen[-1][1]["prompt"], str)


def test_a_runs_history_records_the_oracle_not_offered_once_per_run(tmp_path, capsys) -> None:
    events = []
    for run in ("a", "b"):  # two runs of one process against the same server: each says it and records it
        history = HistoryWriter(tmp_path / run, {"run": run})
        texts, _ = ask("Qwen/Qwen3-32B-history", tokenize=False, not_offered=observe.RawNotOffered(history))
        history.close()
        assert texts == [None, None]
        events.append([e for e in read_history(tmp_path / run).events if e.get("kind") == observe.NOT_OFFERED_EVENT])
    for said in events:
        assert [(e["family"], e["server"], e["reason"]) for e in said] == [
            ("qwen", "http://Qwen-Qwen3-32B-history.test/v1", "no /tokenize")
        ]
    assert capsys.readouterr().err.count("--raw: the raw oracle is not offered for qwen models") == 2


def test_a_server_that_renders_records_no_not_offered_event(tmp_path) -> None:
    history = HistoryWriter(tmp_path / "r", {"run": "r"})
    texts, _ = ask("Qwen/Qwen3-32B-renders", tokenize=True, not_offered=observe.RawNotOffered(history))
    history.close()
    assert texts == ["raw text", "raw text"]
    assert [e for e in read_history(tmp_path / "r").events if e.get("kind") == observe.NOT_OFFERED_EVENT] == []
