"""servers/cache_flush.py: the flush asked where the kind has one, asked again while the server
says requests run, and every other answer said, never raised."""

from __future__ import annotations

import anyio
import httpx

from dsv4bench.servers.cache_flush import flush_prefix_cache


def _flush(kind: str | None, *statuses: int) -> tuple[dict, list[str]]:
    asked: list[str] = []
    answers = list(statuses)

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.path}")
        return httpx.Response(answers.pop(0), text="Cache not flushed: requests are running.")

    async def main() -> dict:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return (await flush_prefix_cache(client, "http://h:1", kind)).as_dict()

    return anyio.run(main), asked


def test_sglang_and_the_bundled_engine_are_flushed_by_post_flush_cache():
    for kind in ("sglang", "sglang-router", "bundled"):
        done, asked = _flush(kind, 200)
        assert done["flushed"] is True and asked == ["POST /flush_cache"]


def test_vllm_is_asked_at_its_own_path_and_a_404_is_not_offered():
    done, asked = _flush("vllm", 404)
    assert asked == ["POST /reset_prefix_cache"]
    assert done["flushed"] is False and "not offered" in done["detail"]


def test_a_server_busy_with_requests_is_asked_again():
    done, asked = _flush("sglang", 400, 400, 200)
    assert done["flushed"] is True and len(asked) == 3


def test_a_refusal_that_will_not_change_is_said_once():
    done, asked = _flush("sglang", 403)
    assert done["flushed"] is False and "HTTP 403" in done["detail"] and len(asked) == 1


def test_kinds_without_a_flush_are_not_asked():
    for kind in ("trtllm", "unknown", None):
        done, asked = _flush(kind)
        assert asked == [] and done["flushed"] is False and done["path"] is None
