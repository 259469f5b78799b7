"""A request that raises inside the engine loop fails alone: its client gets an error (a 500
JSON, or an in-band error ending the stream), a concurrent request completes, the loop keeps
serving and /health stays 200. Unified engine and both PD engines, each with the real model
runner and sampler (a tiny random-weight model)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dsv4bench.engine.server_loop import AsyncSink
from dsv4bench.engine.model_runner import ModelRunner
from dsv4bench.engine.request import Request, SamplingParams
from dsv4bench.engine.serve import build_engine
from dsv4bench.engine.pd.bootstrap_server import BootstrapServer
from dsv4bench.engine.server import ServerConfig, build_app

from .pd.helpers import ServedPD, ServerThread, build_tiny, prompt, quiet, tiny_cfg, wait_until

DOOMED_SEED = 13  # a seed the edge accepts; the patched sampler raises on it


def doom(runner: ModelRunner, seed: int = DOOMED_SEED) -> None:
    """Make `runner`'s sampling raise for requests with `seed`, as a refused seed once did."""
    sample = runner._sample

    def failing(req: Any, logits: Any) -> int:
        if req.params.seed == seed:
            raise RuntimeError("Overflow when unpacking long")
        return sample(req, logits)

    runner._sample = failing  # type: ignore[method-assign]  # the failing sampler is the test


def body(seed: int, stream: bool, max_tokens: int = 6) -> dict:
    return {
        "model": "dsv4-mini",
        "messages": [{"role": "user", "content": "Read main.py please."}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": seed,
        "stream": stream,
    }


async def one(client: httpx.AsyncClient, api: str, seed: int, stream: bool) -> tuple[int, Any]:
    """(status, JSON body) or, streamed, (status, the SSE data payloads)."""
    if not stream:
        r = await client.post(f"{api}/chat/completions", json=body(seed, False))
        return r.status_code, r.json()
    async with client.stream("POST", f"{api}/chat/completions", json=body(seed, True, max_tokens=12)) as r:
        return r.status_code, [line[5:].strip() async for line in r.aiter_lines() if line.startswith("data:")]


def exercise(api: str, roots: list[str]) -> None:
    """A doomed request beside a good one, non-streamed and streamed, then the engine is asked again."""

    async def main() -> list[tuple[int, Any]]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                one(client, api, DOOMED_SEED, False),
                one(client, api, 5, False),
                one(client, api, DOOMED_SEED, True),
                one(client, api, 5, True),
            )

    (bad, bad_body), (good, good_body), (bad_s, bad_events), (good_s, good_events) = asyncio.run(main())
    assert bad == 500 and bad_body["error"]["code"] == "engine_error", bad_body
    assert "RuntimeError" in bad_body["error"]["message"] and bad_body["error"]["type"] == "server_error"
    assert good == 200 and good_body["choices"][0]["finish_reason"] in ("stop", "length")
    assert bad_s == 200 and bad_events and "[DONE]" not in bad_events  # the stream had begun: in-band
    assert json.loads(bad_events[-1])["error"]["code"] == "engine_error"
    assert good_s == 200 and good_events[-1] == "[DONE]"
    for root in roots:
        assert httpx.get(f"{root}/health", timeout=10).status_code == 200
    assert asyncio.run(main())[1][0] == 200  # and it goes on serving


@pytest.fixture(scope="module")
def single() -> Iterator[Any]:
    built = build_engine(tiny_cfg(pd=False), random_weights=True)
    srv = ServerThread(build_app(built.engine, built.frontend, ServerConfig()))
    yield built, srv.url
    srv.stop()
    built.stop()


def test_a_request_failing_in_the_loop_fails_alone(single):
    built, url = single
    doom(built.loop.runner)
    exercise(f"{url}/v1", [url])
    assert built.loop.alive() and built.loop.error is None
    wait_until(lambda: not built.loop.scheduler.has_work, what="the loop to drain")
    assert built.loop.stats.num_aborted_total >= 2


def test_a_seed_torch_refuses_fails_only_its_request(single):
    """The seed that killed the loop, sent past the edge: its generator refuses it in the loop."""
    built, url = single
    fatal = SamplingParams(max_tokens=4, temperature=0.7, seed=1, stop_token_ids=(built.engine.eos_token_id,))
    object.__setattr__(fatal, "seed", 2**64)  # what SamplingParams itself now refuses
    ids = built.frontend.tokenizer.encode("hi")

    async def main() -> tuple[list[Any], list[Any]]:
        async def fatal_request() -> list[Any]:  # straight into the loop, past generate()'s own checks
            sink = AsyncSink(asyncio.get_running_loop())
            built.loop.submit(Request("fatal", ids, fatal), sink)
            events = [await sink.queue.get()]
            while events[-1].finish_reason is None:
                events.append(await sink.queue.get())
            return events

        async def fine_request() -> list[Any]:
            return [ev async for ev in built.engine.generate("fine", ids, SamplingParams(4, 0.7, seed=3))]

        return await asyncio.gather(fatal_request(), fine_request())

    fatal_events, fine_events = asyncio.run(main())
    assert fatal_events[-1].finish_reason.value == "abort" and "Overflow" in fatal_events[-1].error
    assert fine_events[-1].finish_reason.value in ("stop", "length") and fine_events[-1].error is None
    assert built.loop.alive() and httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_sampling_params_refuse_what_the_sampler_cannot_take():
    for bad in (
        {"seed": 2**64},
        {"seed": -1},
        {"seed": 1.5},
        {"max_tokens": 2.0},
        {"temperature": float("nan")},
        {"top_p": float("inf")},
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_a_request_failing_in_a_pd_engine_fails_alone(where):
    served = ServedPD()
    built = served.pd
    doom(getattr(built, where).runner)
    try:
        exercise(served.api, [served.router, served.prefill, served.decode])
        wait_until(lambda: quiet(built), what="the PD engine to drain")
        assert built.prefill.alive() and built.decode.alive()
        assert built.prefill.allocator.num_used == built.prefill.cache.num_cached_pages
        assert built.decode.allocator.num_used == 0
        for engine in (built.prefill, built.decode):
            engine.scheduler.check_integrity()
    finally:
        served.stop()


def test_the_prefill_s_failure_reaches_the_decode_side_s_client():
    """Driven by hand: the error travels on the transfer; the decode's client hears it."""
    from .pd.helpers import ListSink, Pump

    built = build_tiny()
    doom(built.prefill.runner)
    sink = ListSink()
    built.dispatch("r1", prompt(40, seed=1), SamplingParams(max_tokens=4, temperature=0.7, seed=DOOMED_SEED), sink)
    pump = Pump(built)
    pump.until(lambda: sink.finish is not None)
    pump.until_quiet()
    assert sink.finish.value == "abort" and "RuntimeError" in sink.events[-1].error


def test_a_retry_with_a_fresh_room_after_a_prefill_error_leaves_no_room_behind():
    """What SGLang's router does when a prefill fails: the same request again, to both halves,
    with a new room. The failed room must be gone from both halves, and the retry served."""
    served = ServedPD()
    doom(served.pd.prefill.runner)
    prefill_half = served.halves["prefill"]
    bootstrap_server = prefill_half.parts[1]
    assert isinstance(bootstrap_server, BootstrapServer)

    def attempt(room: int, seed: int) -> list[httpx.Response]:
        routed = {
            **body(seed, False),
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": prefill_half.bootstrap_port,
            "bootstrap_room": room,
        }

        async def main() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                return list(
                    await asyncio.gather(
                        *(
                            client.post(f"{root}/v1/chat/completions", json=routed)
                            for root in (served.prefill, served.decode)
                        )
                    )
                )

        return asyncio.run(main())

    try:
        failed = attempt(101, DOOMED_SEED)
        assert [r.status_code for r in failed] == [500, 500], [r.text for r in failed]
        assert "RuntimeError" in failed[1].json()["error"]["message"]  # the decode's client hears why
        retried = attempt(102, 5)
        assert [r.status_code for r in retried] == [200, 200], [r.text for r in retried]
        assert retried[1].json()["choices"][0]["finish_reason"] in ("stop", "length")
        wait_until(lambda: quiet(served.pd), what="both halves to be empty")
        assert not bootstrap_server._opened and not bootstrap_server._pending and not bootstrap_server._connected
        assert served.pd.decode.allocator.num_used == 0
        assert served.pd.prefill.allocator.num_used == served.pd.prefill.cache.num_cached_pages
    finally:
        served.stop()
