"""A seeded, bounded fuzz of the bundled engine's HTTP edge: a few hundred hostile requests
(tests/fixtures/hostile_requests.py; scripts/fuzz_engine.py sends all of them) against a real
engine (tiny random-weight model, real loop, scheduler and sampler) on loopback, unified and
PD. No answer may be a 5xx, every 4xx is an OpenAI-style JSON error naming the field at fault,
and the engine is healthy afterwards."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from dsv4bench.engine.serve import build_engine
from dsv4bench.engine.server import ServerConfig, build_app
from tests.fixtures.hostile_requests import CHAT, Case, base, dumps, sample, send

from .pd.helpers import ServedPD, ServerThread, quiet, tiny_cfg, wait_until

MAX_BODY = 256 * 1024
SEED = 16  # the number
N = 300


@pytest.fixture(scope="module")
def single() -> Iterator[dict[str, str]]:
    built = build_engine(tiny_cfg(pd=False), random_weights=True)
    srv = ServerThread(build_app(built.engine, built.frontend, ServerConfig(max_body_bytes=MAX_BODY)))
    yield {"api": srv.url}
    assert built.loop.alive()
    srv.stop()
    built.stop()


@pytest.fixture(scope="module")
def pd() -> Iterator[dict[str, str]]:
    served = ServedPD(server_cfg=ServerConfig(max_body_bytes=MAX_BODY))
    yield {"api": served.router, "prefill": served.prefill, "decode": served.decode}
    wait_until(lambda: quiet(served.pd), what="the PD engine to drain")
    assert served.pd.prefill.alive() and served.pd.decode.alive()
    served.stop()


def fuzz(roots: dict[str, str], cases: list[Case]) -> Counter[tuple[str, int]]:
    problems: list[str] = []
    counts: Counter[tuple[str, int]] = Counter()
    with httpx.Client(timeout=30) as client:
        for case in cases:
            outcome = send(client, roots[case.port], case)
            counts[(case.cls, outcome.status)] += 1
            if outcome.problem:
                problems.append(f"{case.label}: {outcome.problem}")
    assert not problems, f"{len(problems)} of {len(cases)} answered wrong:\n" + "\n".join(problems[:20])
    return counts


def assert_healthy(roots: dict[str, str]) -> None:
    assert all(httpx.get(f"{root}/health", timeout=10).status_code == 200 for root in roots.values())
    r = httpx.post(f"{roots['api']}{CHAT}", content=dumps({**base(CHAT), "temperature": 0.7, "seed": 1}), timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("mode", ["single", "pd"])
def test_hostile_requests_are_4xx_and_the_engine_stays_healthy(mode, request):
    roots = request.getfixturevalue(mode)
    cases = sample(SEED, N, MAX_BODY, pd=mode == "pd")
    counts = fuzz(roots, cases)
    assert not any(status >= 500 or status == 0 for _, status in counts)
    assert {cls for cls, _ in counts} >= {"huge_int", "deep_body", "surrogate", "killer_seed", "abort"}
    assert_healthy(roots)


def test_the_seed_that_killed_the_loop_is_a_400_naming_it(single):
    body = {"prompt": "hi", "max_tokens": 4, "temperature": 0.7, "seed": 2**64}
    for stream in (False, True):
        r = httpx.post(f"{single['api']}/v1/completions", content=dumps({**body, "stream": stream}), timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    assert_healthy(single)


def test_deep_nesting_names_the_field_it_is_in(single):
    deep = b'{"model": "m", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    r = httpx.post(f"{single['api']}{CHAT}", content=deep, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages" and r.json()["error"]["code"] == "nesting_too_deep"
