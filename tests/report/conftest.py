"""Literal histories for the report tests, written by hand the way the harness writes them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from dsv4bench.history.records import AssembledResponse, Timings, ToolCall, TurnRecord, TurnStatus, Verdict
from dsv4bench.servers.monitor import MetricSample, parse_metrics

T0_WALL = 1_760_000_000_000_000_000  # epoch ns of the run start
T0_NS = 9_000_000_000  # monotonic ns of the run start
S = 1_000_000_000  # ns per second


def _make_turn(
    session: str = "s0",
    turn: int = 0,
    scenario: str = "coding",
    status: str = "ok",
    verdicts: Iterable[tuple[str, str]] = (),
    tool_calls: int = 1,
    start_s: float = 0.0,
    ttft_s: float | None = 0.1,
    e2e_s: float | None = 1.0,
    gaps_ms: Iterable[float] = (20.0,),
    content: str = "",
    raw_sse: list[str] | None = None,
    error: str | None = None,
    check_errors: Iterable[str] = (),
    usage: dict[str, Any] | None = None,
    cached_tokens_details: dict[str, Any] | None = None,
) -> TurnRecord:
    """One turn record; `verdicts` are (code, where) pairs, `start_s` seconds after the run start;
    `usage` and `cached_tokens_details` as the answer reported them (ok and killed turns only)."""
    start_ns = T0_NS + int(start_s * S)
    timings = Timings(
        start_wall_ns=T0_WALL + int(start_s * S),
        start_ns=start_ns,
        first_byte_ns=None if ttft_s is None else start_ns + int(ttft_s * S) - 1000,
        first_token_ns=None if ttft_s is None else start_ns + int(ttft_s * S),
        end_ns=None if e2e_s is None else start_ns + int(e2e_s * S),
        token_gaps_ms=list(gaps_ms),
    )
    response = None
    if status in ("ok", "killed"):
        calls = [
            ToolCall(index=i, id=f"call_{i}", name="read_file", arguments='{"path": "a.py"}') for i in range(tool_calls)
        ]
        response = AssembledResponse(
            response_id=f"chatcmpl-{session}-{turn}",
            content=content,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            saw_done=status == "ok",
            usage=usage,
            cached_tokens_details=cached_tokens_details,
        )
    return TurnRecord(
        run="run-test",
        session=session,
        turn=turn,
        scenario=scenario,
        seed=7,
        status=TurnStatus(status),
        timings=timings,
        http_status=503 if error else 200,
        error=error,
        response=response,
        verdicts=[Verdict(code, f"{code} found", where) for code, where in verdicts],
        raw_sse=raw_sse,
        check_errors=list(check_errors),
    )


def _event(kind: str, at_s: float, **fields: Any) -> dict[str, Any]:
    return {"t_wall_ns": T0_WALL + int(at_s * S), "t_ns": T0_NS + int(at_s * S), "kind": kind, **fields}


def write_run(
    run_dir: Path,
    turns: Iterable[TurnRecord],
    events: Iterable[dict[str, Any]] = (),
    run: dict[str, Any] | None = None,
    duration_s: float | None = 60.0,
    torn_line: bool = False,
) -> Path:
    """A run folder; run_start at 0 and, unless `duration_s` is None (a killed harness), run_end."""
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {
        "run": "run-test",
        "command": "dsv4bench agents --concurrency 8 --seed 7",
        "config": {"concurrency": 8, "seed": 7, "scenario": ["coding", "sql"]},
    }
    (run_dir / "run.json").write_text(json.dumps(info if run is None else run))
    lines = [json.dumps(t.to_json()) for t in turns]
    text = "".join(line + "\n" for line in lines)
    if torn_line:
        # What SIGKILL leaves: the first half of a record, no newline.
        text += json.dumps(_make_turn(session="torn").to_json())[:80]
    (run_dir / "turns.jsonl").write_text(text)
    evs = [_event("run_start", 0.0), *events] + ([_event("run_end", duration_s)] if duration_s is not None else [])
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    return run_dir


METRICS_PAGES = Path(__file__).parent.parent / "fixtures" / "metrics_text"
METRICS_URL = "http://127.0.0.1:30000/metrics"
SCRAPE_EVERY_S = 5.0


def metrics_page(name: str) -> dict[str, float]:
    """One recorded /metrics page of tests/fixtures/metrics_text, as the monitor keys a scrape."""
    return parse_metrics((METRICS_PAGES / f"{name}.prom").read_text())


def write_metrics(run_dir: Path, pages: Iterable[str], endpoint: str = METRICS_URL, append: bool = False) -> Path:
    """metrics.jsonl of one scrape per page, SCRAPE_EVERY_S apart from the run start; a page named
    "" is a failed scrape. `append`: after the scrapes already there (another endpoint's)."""
    lines = []
    for i, name in enumerate(pages):
        at = int(i * SCRAPE_EVERY_S * S)
        values = metrics_page(name) if name else None
        error = None if values is not None else "ConnectError: [Errno 111] Connection refused"
        sample = MetricSample(T0_WALL + at, T0_NS + at, endpoint, values is not None, values=values, error=error)
        lines.append(json.dumps(sample.as_dict()))
    with (run_dir / "metrics.jsonl").open("a" if append else "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return run_dir


DSML_SSE = [
    'data: {"id":"chatcmpl-s1-1","choices":[{"delta":{"role":"assistant"}}]}',
    'data: {"id":"chatcmpl-s1-1","choices":[{"delta":{"content":"Let me look."}}]}',
    'data: {"id":"chatcmpl-s1-1","choices":[{"delta":{"content":"<｜DSML｜tool_calls>"}}]}',
    'data: {"id":"chatcmpl-s1-1","choices":[{"delta":{"content":"<｜DSML｜invoke name=\\"read_file\\">"}}]}',
    "data: [DONE]",
]


def corruption_turns() -> list[TurnRecord]:
    """Eight turns over three sessions, two scenarios, depths 0-2; three corrupt (see test asserts)."""
    return [
        _make_turn("s1", 0, "coding", tool_calls=2, start_s=1, ttft_s=0.1, e2e_s=1.0),
        _make_turn(
            "s1",
            1,
            "coding",
            verdicts=[("dsml_leak_content", "content")],
            tool_calls=0,
            start_s=3,
            ttft_s=0.2,
            e2e_s=2.0,
            content="Let me look.<｜DSML｜tool_calls>",
            raw_sse=DSML_SSE,
        ),
        _make_turn(
            "s1",
            2,
            "coding",
            verdicts=[("args_not_json", "tool_calls[0].arguments"), ("schema_violation", "tool_calls[1].arguments")],
            tool_calls=2,
            start_s=6,
            ttft_s=0.3,
            e2e_s=3.0,
        ),
        _make_turn("s2", 0, "sql", tool_calls=1, start_s=1, ttft_s=0.4, e2e_s=4.0),
        _make_turn(
            "s2",
            1,
            "sql",
            verdicts=[("schema_violation", "tool_calls[0].arguments")],
            tool_calls=1,
            start_s=6,
            ttft_s=0.5,
            e2e_s=5.0,
        ),
        _make_turn("s2", 2, "sql", status="killed", verdicts=[("truncated", "")], tool_calls=1, start_s=12, e2e_s=0.5),
        _make_turn(
            "s3",
            0,
            "sql",
            status="error",
            verdicts=[("http_error", "")],
            error="HTTP 503",
            start_s=2,
            ttft_s=None,
            e2e_s=0.05,
        ),
        _make_turn("s3", 1, "sql", tool_calls=1, start_s=20, ttft_s=0.6, e2e_s=6.0),
    ]


CORRUPTION_EVENTS = [
    _event("kill", 12.2, session="s2"),
    _event("session_end", 7.0, session="s1", reason="final"),
    _event("session_end", 12.3, session="s2", reason="killed"),
]


@pytest.fixture
def corruption_run(tmp_path: Path) -> Path:
    """The eight-turn corruption history, complete, with a server description."""
    run = {
        "run": "run-test",
        "command": "dsv4bench agents --concurrency 8 --seed 7 --kill every:10s",
        "config": {"concurrency": 8, "seed": 7},
        "server": {
            "models": {"object": "list", "data": [{"id": "deepseek-ai/DeepSeek-V4"}]},
            "server_info": {
                "version": "0.5.9",
                "tp_size": 8,
                "disaggregation_mode": "prefill",
                "unrelated_key": "not shown",
            },
        },
    }
    return write_run(tmp_path / "run", corruption_turns(), CORRUPTION_EVENTS, run=run)


@pytest.fixture
def run_folder(tmp_path: Path) -> Callable[..., Path]:
    """write_run into a fresh folder under tmp_path."""
    counter = iter(range(1000))
    return lambda *a, **kw: write_run(tmp_path / f"run{next(counter)}", *a, **kw)


@pytest.fixture
def make_turn() -> Callable[..., TurnRecord]:
    """Build one turn record: (session, turn, scenario, status, verdicts=[(code, where)], ...)."""
    return _make_turn


@pytest.fixture
def metrics() -> Callable[..., Path]:
    """Write a run folder's metrics.jsonl from recorded pages: (run_dir, [page, ...], endpoint)."""
    return write_metrics


@pytest.fixture
def event() -> Callable[..., dict[str, Any]]:
    """Build one event: (kind, at_s, **fields)."""
    return _event
