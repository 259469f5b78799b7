"""The server's planted faults (ghost-decode, health-lies, parser-split) against their clean
form, over HTTP on loopback. The engine is the real loop and scheduler with a scripted runner
in place of the model, so aborts, EOS and max_tokens are the engine's own."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from dsv4bench.engine.config import EngineConfig
from dsv4bench.engine.server_loop import EngineStats
from dsv4bench.engine.unified_engine import AsyncEngine, UnifiedEngine
from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.memory import PageAllocator
from dsv4bench.engine.radix_cache import RadixCache
from dsv4bench.engine.scheduler import ScheduledBatch, Scheduler
from dsv4bench.engine.server import ServerConfig, build_app
from dsv4bench.engine.stream_parse_fault import BLOCK_OPEN
from dsv4bench.wire.sse import DeltaAssembler, assemble_completion

from .fake_engine import FakeEngine
from .test_frontend import TOOLS
from .pd.helpers import ServerThread
from .test_server import MODEL, TOK
from .test_tokenizer import DSML_CALL

TEXT_ID = TOK.encode("ok")[0]
USER = [{"role": "user", "content": "Say ok."}]


class ScriptedRunner:
    """The model's stand-in: each request samples TEXT_ID, or EOS as its `eos_at`-th output
    token; a step takes `step_s`; a cleared `gate` holds the step, as a stuck kernel would."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.reset()

    def reset(self, eos_at: int = 10**9, step_s: float = 0.003) -> None:
        self.eos_at, self.step_s = eos_at, step_s
        self.gate.set()

    def __call__(self, batch: ScheduledBatch) -> dict[str, int]:
        self.gate.wait()
        time.sleep(self.step_s)
        return {
            e.req.rid: TOK.eos_token_id if len(e.req.output_ids) == self.eos_at else TEXT_ID
            for e in batch.entries
            if e.sample
        }


@pytest.fixture(scope="module")
def runner() -> ScriptedRunner:
    return ScriptedRunner()


@pytest.fixture(scope="module")
def loop(runner: ScriptedRunner) -> Iterator[UnifiedEngine]:
    cfg = EngineConfig(num_pages=256)
    allocator = PageAllocator(cfg.num_pages)
    loop = UnifiedEngine(cfg, Scheduler(cfg, allocator, RadixCache(cfg.page_size, allocator), TOK.eos_token_id), runner)
    loop.start()
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def serve(loop: UnifiedEngine) -> Iterator[Callable[..., str]]:
    """serve(*faults) -> base URL of a server with those faults, over the one shared loop."""
    servers: dict[frozenset[str], ServerThread] = {}

    def url(*faults: str) -> str:
        key = frozenset(faults)
        if key not in servers:
            engine = AsyncEngine(EngineConfig(num_pages=256, faults=key), loop, TOK.eos_token_id)
            cfg = ServerConfig(model_name=MODEL, health_generate_timeout_s=0.5)
            servers[key] = ServerThread(build_app(engine, Frontend(TOK, MODEL, 4096), cfg))
        return servers[key].url

    yield url
    for srv in servers.values():
        srv.stop()


@pytest.fixture(autouse=True)
def fresh_runner(runner: ScriptedRunner, loop: UnifiedEngine) -> Iterator[None]:
    runner.reset()
    yield
    runner.reset()
    assert wait_for(lambda: loop.stats.num_running == 0 and loop.stats.num_queued == 0, 10), "requests left over"


def wait_for(ok: Callable[[], bool], timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def stream_then_leave(url: str, max_tokens: int) -> str:
    """Start a streamed chat, read its first chunk, drop the connection; the response id."""
    body = {"model": MODEL, "messages": USER, "max_tokens": max_tokens, "stream": True}
    with httpx.Client(timeout=5) as h, h.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        return json.loads(next(x for x in r.iter_lines() if x.startswith("data: "))[6:])["id"]


def counters(s: EngineStats) -> tuple[int, int, int, int]:
    return s.num_requests_total, s.prompt_tokens_total, s.gen_tokens_total, s.num_aborted_total


def test_clean_disconnect_aborts_at_once(serve, loop):
    before = loop.stats
    stream_then_leave(serve(), max_tokens=400)
    assert wait_for(lambda: loop.stats.num_aborted_total == before.num_aborted_total + 1, 1.0)
    assert loop.stats.num_running == 0
    assert loop.stats.gen_tokens_total - before.gen_tokens_total < 100  # 400 would take 1.2 s


def test_ghost_decode_disconnect_decodes_past_eos_to_max_tokens(serve, loop, runner):
    runner.reset(eos_at=20, step_s=0.004)  # a connected turn would end at its 21st token
    before = loop.stats
    stream_then_leave(serve("ghost-decode"), max_tokens=150)

    def generated() -> int:
        return loop.stats.gen_tokens_total - before.gen_tokens_total

    assert wait_for(lambda: generated() > 30), "the orphan stopped at its EOS"
    running = []  # the running gauge while the orphan decodes on for nobody
    while generated() < 150:
        running.append(loop.stats.num_running)
        assert len(running) < 500, "the orphan stopped decoding"
        time.sleep(0.005)
    assert len(running) > 10 and set(running) == {1}
    assert wait_for(lambda: loop.stats.num_running == 0)
    assert generated() == 150  # max_tokens
    assert loop.stats.num_aborted_total == before.num_aborted_total  # nothing aborted it


def test_ghost_decode_leaves_a_non_streamed_request_running_until_abort_all(serve, loop):
    url = serve("ghost-decode")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up; nobody watches for that
        httpx.post(
            f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 2000}, timeout=0.3
        )
    time.sleep(0.2)
    assert loop.stats.num_running == 1
    aborted = httpx.post(f"{url}/abort_request", json={"abort_all": True}).json()["aborted"]
    assert len(aborted) == 1 and wait_for(lambda: loop.stats.num_running == 0, 1.0)


def test_ghost_decode_ends_a_connected_turn_at_eos_itself(serve, loop, runner):
    runner.reset(eos_at=4)
    url, before = serve("ghost-decode"), loop.stats
    body = {"model": MODEL, "messages": USER, "max_tokens": 100}
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=5).json()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=5) as r:
        lines = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
    text = "".join(c["delta"].get("content") or "" for x in lines[:-1] for c in json.loads(x)["choices"])
    assert whole["choices"][0]["message"]["content"] == text == TOK.decode([TEXT_ID] * 4)
    assert whole["choices"][0]["finish_reason"] == "stop" and lines[-1] == "[DONE]"
    assert whole["usage"]["completion_tokens"] == 5  # four tokens and EOS
    # The engine ignored EOS; the server ended both requests by aborting them.
    assert wait_for(lambda: loop.stats.num_aborted_total == before.num_aborted_total + 2)


def test_health_generates_one_token_and_is_503_when_the_loop_is_stuck(serve, loop, runner):
    clean, lying = serve(), serve("health-lies")
    before = counters(loop.stats)
    assert [httpx.get(f"{clean}{p}").status_code for p in ("/health", "/health_generate")] == [200, 200]
    assert counters(loop.stats) == before  # probes are not user requests
    runner.gate.clear()  # the next step hangs: the loop is alive but cannot generate
    try:
        assert loop.alive()
        assert httpx.get(f"{clean}/health", timeout=5).status_code == 503
        assert (loop.stats.num_queued, loop.stats.num_running) == (0, 0)  # the probe is not in the gauges
        assert httpx.get(f"{lying}/health", timeout=5).status_code == 200  # the same state, the fault
        assert httpx.get(f"{lying}/health_generate", timeout=5).status_code == 503
    finally:
        runner.gate.set()
    assert httpx.get(f"{clean}/health", timeout=5).status_code == 200
    assert counters(loop.stats) == before


def test_health_lies_answers_from_the_liveness_flag_until_the_loop_dies():
    cfg = EngineConfig(num_pages=64, faults=frozenset({"health-lies"}))
    allocator = PageAllocator(cfg.num_pages)
    loop = UnifiedEngine(
        cfg, Scheduler(cfg, allocator, RadixCache(cfg.page_size, allocator), TOK.eos_token_id), lambda batch: 1 // 0
    )  # the first step kills the loop
    loop.start()
    srv = ServerThread(
        build_app(
            AsyncEngine(cfg, loop, TOK.eos_token_id),
            Frontend(TOK, MODEL, 4096),
            ServerConfig(model_name=MODEL, health_generate_timeout_s=0.5),
        )
    )
    try:
        assert httpx.get(f"{srv.url}/health").status_code == 200  # no generation asked, none tried
        assert httpx.get(f"{srv.url}/health_generate").status_code == 503  # its probe's step raised
        assert wait_for(lambda: not loop.alive())
        assert httpx.get(f"{srv.url}/health").status_code == 503
    finally:
        srv.stop()
        loop.stop()


@pytest.fixture(scope="module")
def dsml_servers() -> Iterator[dict[str, tuple[str, FakeEngine]]]:
    """A clean and a parser-split server over fake engines that stream one token per event."""
    out: dict[str, tuple[ServerThread, FakeEngine]] = {}
    for name, faults in (("clean", frozenset()), ("parser-split", frozenset({"parser-split"}))):
        engine = FakeEngine(TOK.encode("\n\n" + DSML_CALL), TOK.eos_token_id, max_context=4096, chunk=1)
        engine.cfg = EngineConfig(faults=faults)
        out[name] = (
            ServerThread(build_app(engine, Frontend(TOK, MODEL, 4096), ServerConfig(model_name=MODEL))),
            engine,
        )
    yield {name: (srv.url, engine) for name, (srv, engine) in out.items()}
    for srv, _ in out.values():
        srv.stop()


def chat(url: str, stream: bool) -> tuple[str, list[str | None], str | None]:
    """Content, tool names and finish of one chat turn, as the harness assembles it."""
    body = {"model": MODEL, "messages": USER, "tools": TOOLS, "stream": stream}
    if stream:
        asm = DeltaAssembler()
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=5) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    asm.feed(line[6:])
        resp = asm.finish()
    else:
        resp = assemble_completion(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=5).json())
    return resp.content, [c.name for c in resp.tool_calls], resp.finish_reason


def test_parser_split_leaks_the_split_opener_only_when_streamed_under_the_fault(dsml_servers):
    clean_url, _ = dsml_servers["clean"]
    fault_url, _ = dsml_servers["parser-split"]
    called = (["read_file"], "tool_calls")
    assert chat(clean_url, stream=True) == ("", *called)
    assert chat(fault_url, stream=False) == ("", *called)  # parsed whole: nothing to split
    assert chat(fault_url, stream=True) == (BLOCK_OPEN[:-1], *called)
