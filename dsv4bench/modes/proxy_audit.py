"""The audit side of `dsv4bench proxy`: what becomes of the bytes the pass-through forwards.

Each chat completion the proxy forwards is an exchange: its request, then the upstream's head,
body chunks and end (or a break, a refusal to connect, a client that left), fed to the same
sans-IO reading `agents` uses (turn_answer.py) and, once it ends, judged by the same checkers
into one TurnRecord of the run's history (ProxyRun).

Where that work runs is the audit's (`Audit`): `InlineAudit` does it in the serving loop, step by
step as the bytes pass; `WorkerAudit` hands each step, stamped with when it happened, to a process
of its own (`python -m dsv4bench.modes.proxy_audit`), so the reading, judging and writing cost
the forwarding loop nothing but a list append per step and a pipe write per loop pass (bench-plan.md, "`dsv4bench proxy`"). The
records are the same either way: each step carries its own CLOCK_MONOTONIC stamp (one clock for
every process of the machine), so a turn's timings are those of the forwarding, not of when the
worker got round to them.

The audit never stands in the way: a step that raises stops the audit of that exchange, never
its bytes; a worker that falls more than WORKER_BACKLOG bytes behind drops the chunks of the
exchanges it is behind on (each such turn says so in its check errors), and a worker that dies
costs the rest of the history, said on stderr, never a byte of any answer.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import datetime as dt
import itertools
import json
import os
import pickle
import secrets
import signal
import struct
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
from rich.console import Console

from dsv4bench.checks import run_checks
from dsv4bench.harness.turn_judge import client_request_summary, keeps_evidence, outcome_record, request_context
from dsv4bench.history.records import Timings, TurnContext, TurnRecord, TurnStatus
from dsv4bench.history.redact import MASK, Redactor
from dsv4bench.history.run_folder import HistoryWriter
from dsv4bench.terminal import markup_safe
from dsv4bench.wire.charset import Charset
from dsv4bench.wire.stream_reader import DEFAULT_BOUNDS, StreamBounds
from dsv4bench.wire.turn_answer import (
    StreamedAnswer,
    TurnOutcome,
    finish,
    is_event_stream,
    is_http_error,
    take_completion,
    take_connection_error,
    take_http_error,
    take_not_a_stream,
)

# Header names whose values are credentials: learnt as secrets, masked where headers are kept.
_SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie", "password")
SESSION_HEADER = "x-dsv4bench-session"
# A request body at most this large is kept whole in a failing (or --capture) turn's record; a
# larger one keeps its size and an excerpt of its start, so a turn line stays a bounded size.
RECORDED_BODY_BYTES = 2 << 20
RECORDED_EXCERPT_CHARS = 4096
# How far the worker may fall behind (bytes queued for it and not yet written to its pipe) before
# the chunks of exchanges in flight pass unjudged rather than held in this process's memory.
WORKER_BACKLOG = 256 << 20
# The worker's niceness, added to the proxy's. Why lower its priority: on a machine whose cores
# are all busy (the agent, its server and the proxy on one box), every CPU-millisecond the audit
# takes at once is one the forwarding waits for, and the user's agent feels it; the audit's own
# latency is nobody's, so it reads behind the traffic and catches up when a core is free
# (WORKER_BACKLOG bounds how far). 10: a weight of a tenth of the forwarding's under Linux's CFS,
# not so low that a steady load starves it (bench-plan.md, "`dsv4bench proxy`").
WORKER_NICE = 10
_FRAME = struct.Struct("!I")  # a frame's length, before its pickled batch of steps


def _frame(steps: list[tuple]) -> bytes:
    """Steps as the worker reads them: their pickle, after its length."""
    data = pickle.dumps(steps, protocol=pickle.HIGHEST_PROTOCOL)
    return _FRAME.pack(len(data)) + data


def new_run_id() -> str:
    """A proxy run's id: when it started, and four hex digits so two in one second differ."""
    return f"{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-proxy-{secrets.token_hex(2)}"


class LearntSecrets(Redactor):
    """The run's secrets, grown by every credential a client sends through the proxy, so no
    file of the run ever holds one (a server that echoes a key in an error, say)."""

    def __bool__(self) -> bool:
        return True  # applied from the first record on, before any key has come

    def learn(self, value: str) -> None:
        value = value.strip()
        _, _, token = value.partition(" ")  # `Bearer KEY`: the key alone is a secret too
        found = [value, token.strip()] if token else [value]
        if any(v not in self.secrets for v in found):
            self.secrets = Redactor([*self.secrets, *found]).secrets


def is_secret_header(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_HEADER_WORDS)


def _content_decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    """How the audit reads a body of this Content-Encoding (the client gets it as it came);
    None for an encoding it cannot read."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return lambda data: data
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress
    if encoding == "deflate":
        return zlib.decompressobj().decompress
    return None


@dataclass
class ChatExchange:
    """One chat completion as it passes through: the request, and what its answer's bytes
    become, read the way `agents` reads its own (turn_answer.py)."""

    session: str
    turn: int
    scenario: str
    seed: int
    body: dict[str, Any]
    headers: dict[str, str]  # the client's, credentials masked: kept with a failing turn's body
    body_bytes: int = 0  # the request body's size
    excerpt: str = ""  # the start of a body over RECORDED_BODY_BYTES, kept in its place
    bounds: StreamBounds = DEFAULT_BOUNDS
    out: TurnOutcome = field(default_factory=TurnOutcome.starting)
    problems: list[str] = field(default_factory=list)  # what the audit could not read: check_errors
    settled: bool = False  # the outcome is known; later events change nothing
    judged: bool = True  # False: the audit missed part of the answer, so no checker judges it
    _reading: str = ""  # "sse", "body", "error", "not_sse", or "" once nothing more is read
    _answer: StreamedAnswer | None = None
    _content: Callable[[bytes], bytes] | None = None
    _text: Charset | None = None
    _head: bytearray = field(default_factory=bytearray)
    _limit: int = 0
    _over: bool = False
    _resp_headers: httpx.Headers = field(default_factory=httpx.Headers)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def started(self, status: int, headers: httpx.Headers, at_ns: int | None = None) -> None:
        """The upstream's status line and headers arrived (at `at_ns`, CLOCK_MONOTONIC; now when
        not given): how its body will be read."""
        self.out.timings.first_byte_ns = at_ns or time.monotonic_ns()
        self.out.http_status = status
        self._resp_headers = headers
        self._content = _content_decoder(headers.get("content-encoding", ""))
        if self._content is None:
            self.problems.append(
                f"Content-Encoding {headers.get('content-encoding', '')[:40]!r}: the proxy "
                "cannot read it; the answer passed through unjudged"
            )
            return
        if is_http_error(status):
            self._reading, self._limit = "error", self.bounds.error_body_bytes
        elif self.stream and not is_event_stream(headers):
            self._reading, self._limit = "not_sse", 4096
        elif self.stream:
            self._reading, self._answer = "sse", StreamedAnswer(self.out, None, self.bounds)
            self._text = Charset(headers_charset(headers))
        else:
            self._reading, self._limit = "body", self.bounds.body_bytes

    def chunk(self, raw: bytes, at_ns: int | None = None) -> None:
        """The next bytes of the body, as the client got them (passed on at `at_ns`; now when not given)."""
        if not self._reading or self._content is None:
            return
        data = self._content(raw)
        if self._reading == "sse":
            assert self._answer is not None and self._text is not None
            if not self._answer.feed(self._text.decode(data), at_ns):
                self._reading = ""  # a bound, or the stream's end: the rest passes unread
        elif not self._over:
            self._head += data
            if len(self._head) > self._limit:
                del self._head[self._limit :]
                self._over = True

    def ended(self) -> None:
        """The body ended as HTTP says it should."""
        if self.settled:
            return
        if self._reading == "sse" and self._answer is not None and self._text is not None:
            self._answer.feed(self._text.decode(b"", final=True))
            self._answer.end_of_body()
        self._settle_read()

    def broke(self, e: BaseException) -> None:
        """The upstream's body broke off: a stream cut after some output is a truncated answer
        (judged), otherwise the connection failed, as client.py reads it."""
        if self.settled:
            return
        if self._reading in ("error", "not_sse") or (self._answer is not None and self._answer.any_output):
            self._settle_read()
        else:
            take_connection_error(self.out, e)
            self.settled = True

    def unreachable(self, e: BaseException) -> None:
        """No answer at all: the upstream could not be reached."""
        take_connection_error(self.out, e)
        self.settled = True

    def killed(self, why: str) -> None:
        """The exchange ended before its answer did (the client left, the proxy stopped): not judged.
        A stream that had said [DONE] had ended for its client, which may close at once (the
        OpenAI SDK does) before the upstream's last bytes, the chunked body's end, arrive: judged."""
        if self.settled:
            return
        if self._answer is not None and self._answer.asm.response.saw_done:
            self.ended()
            return
        self.out.status, self.out.error_kind, self.out.error = TurnStatus.KILLED, None, why
        if self._answer is not None:
            self._answer.close()
            self.out.response = self._answer.asm.response
        self.settled = True

    def stop_reading(self) -> None:
        """Read nothing more of the body: what came so far is what the record judges."""
        self._reading = ""

    def audit_failed(self, e: BaseException) -> None:
        """Reading the answer raised: the turn is recorded with what is known, the rest unread. A
        body its charset cannot decode is the server's answer, as client.py reads it, not ours."""
        if isinstance(e, httpx.DecodingError):
            take_connection_error(self.out, e)
            self.settled, self._reading = True, ""
            return
        self.problems.append(f"proxy audit: {type(e).__name__}: {e}"[:300])
        self._reading = ""

    def _settle_read(self) -> None:
        self.settled = True
        status = self.out.http_status or 0
        if self._answer is not None:
            self.out.response = self._answer.finish()
        elif is_http_error(status):
            take_http_error(self.out, status, self._resp_headers, bytes(self._head))
        elif self._content is None:
            return  # an encoding the audit cannot read: `problems` says so
        elif self.stream and not is_event_stream(self._resp_headers):
            take_not_a_stream(self.out, self._resp_headers, bytes(self._head))
        else:
            take_completion(self.out, bytes(self._head), self._over, self.bounds)
        self._reading = ""

    def context(self) -> TurnContext:
        """What the checkers judge of this exchange."""
        return request_context(self.body, self.out)


def headers_charset(headers: httpx.Headers) -> str:
    """The charset of the Content-Type where Python knows it, else UTF-8, as httpx's
    Response.encoding resolves it for client.py."""
    for param in headers.get("content-type", "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            try:
                return codecs.lookup(value.strip().strip('"')).name
            except LookupError:
                break
    return "utf-8"


class ProxyRun:
    """The run folder of one proxy run: every exchange's turn record, per-session numbering,
    and the lifecycle events that make it a history `dsv4bench report` reads."""

    def __init__(
        self,
        out: Path,
        run_info: dict[str, Any],
        api_key: str | None = None,
        on_turn: Callable[[TurnRecord], None] | None = None,
        capture: bool = False,
        run_id: str | None = None,
    ) -> None:
        self.run_id = run_id or new_run_id()
        self.run_dir = out / self.run_id
        self.secrets = LearntSecrets([api_key])
        info = {"run": self.run_id, **run_info, "started": dt.datetime.now(dt.timezone.utc).isoformat()}
        self.history = HistoryWriter(self.run_dir, info, self.secrets)
        self.on_turn = on_turn
        # Every turn keeps its exact request, not only a failing one's: the run folder is then a
        # capture that `agents --replay` sends again (replay.py).
        self.capture = capture
        self.turns: dict[str, int] = {}  # session -> turns numbered so far
        self.ended = False
        self.history.event("run_start", run=self.run_id)

    def open_exchange(
        self,
        path: str,
        headers: list[tuple[bytes, bytes]],
        raw_body: bytes,
        address: str | None,
        start: tuple[int, int] | None = None,
    ) -> ChatExchange | None:
        """The exchange a chat-completions request to `path` starts, or None (noted as an event) for
        a body that is no JSON object: forwarded all the same, nothing to judge it by. `address`
        names the client (AuditProxy._client_address); `start` is (wall, monotonic) ns of the
        request's forwarding, now when not given."""
        named = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        for name, value in named.items():
            if is_secret_header(name):
                self.secrets.learn(value)
        try:
            body = json.loads(raw_body)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            self.history.event("unaudited_request", path=path, reason="body is not a JSON object", bytes=len(raw_body))
            return None
        user = body.get("user")
        session = named.get(SESSION_HEADER) or (user if isinstance(user, str) and user else None) or address or "client"
        turn = self.turns.get(session, 0)
        if turn == 0:
            self.history.event("session_start", session=session, scenario=named.get("x-dsv4bench-scenario", "proxy"))
        self.turns[session] = turn + 1
        seed = named.get("x-dsv4bench-seed", "")
        return ChatExchange(
            session=session,
            turn=turn,
            scenario=named.get("x-dsv4bench-scenario", "proxy"),
            seed=int(seed) if seed.isdigit() else 0,
            body=body,
            headers={k: MASK if is_secret_header(k) else v for k, v in named.items()},
            body_bytes=len(raw_body),
            excerpt=raw_body[:RECORDED_EXCERPT_CHARS].decode("utf-8", "replace")
            if len(raw_body) > RECORDED_BODY_BYTES
            else "",
            out=TurnOutcome(TurnStatus.OK, Timings(start_wall_ns=start[0], start_ns=start[1]))
            if start
            else TurnOutcome.starting(),
        )

    def record(self, ex: ChatExchange, end_ns: int | None = None) -> TurnRecord | None:
        """Judge the ended exchange (it ended at `end_ns`; now when not given) and write its turn
        record; None when it could not be built."""
        try:
            out = finish(ex.out)
            if end_ns:
                out.timings.end_ns = end_ns
            ctx = ex.context()
            verdicts, check_errors = run_checks(ctx) if ex.judged else ([], [])
            check_errors = [*ex.problems, *check_errors]
            summary = client_request_summary(ex.body)
            failing = keeps_evidence(out.status, verdicts, check_errors)
            if (failing or self.capture) and ex.body_bytes > RECORDED_BODY_BYTES:
                # Too large to keep whole in every failing turn's line: its size and start only.
                summary["body_bytes"], summary["body_excerpt"] = ex.body_bytes, ex.excerpt
                summary["headers"] = ex.headers
            elif failing or self.capture:  # the exact request, so the turn can be replayed and audited
                summary["body"] = ex.body
                summary["headers"] = ex.headers
            where = (self.run_id, ex.session, ex.turn, ex.scenario, ex.seed)
            rec = outcome_record(*where, out, summary, verdicts, check_errors, failing)
        except Exception as e:  # noqa: BLE001 - a record that cannot be built is a lost record, not a crash
            self.history.event(
                "history_write_error", session=ex.session, turn=ex.turn, error=f"{type(e).__name__}: {e}"[:300]
            )
            return None
        self.history.turn(rec)
        if self.on_turn is not None:
            self.on_turn(rec)
        return rec

    def end(self, reason: str) -> None:
        """Close the history: each session's turn count (so a lost record shows as a gap), then run_end.
        Once: a second call changes nothing."""
        if self.ended:
            return
        self.ended = True
        for session, turns in self.turns.items():
            self.history.event("session_end", session=session, reason="proxy_end", turns=turns, tool_calls=0)
        self.history.event("run_end", run=self.run_id, reason=reason)
        self.history.close()


def _audit(exchange: ChatExchange, step: Callable[..., None], *args: Any) -> None:
    """One step of the audit; one that raises stops the audit of this exchange, never its bytes."""
    try:
        step(*args)
    except Exception as e:  # noqa: BLE001 - whatever the audit thinks, the client gets the upstream's bytes
        exchange.audit_failed(e)


class Audit(Protocol):
    """What the pass-through tells the audit of each exchange (AuditProxy calls these in order:
    open, then started or unreachable, chunks, then ended, broke or killed, then close). A handle
    is whatever `open` gave; None means the request is not audited, and no step is told of it.
    No step raises: the audit never breaks the pass-through."""

    run_dir: Path

    def open(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes, address: str | None) -> Any: ...
    def started(self, h: Any, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...
    def chunk(self, h: Any, data: bytes) -> None: ...
    def ended(self, h: Any) -> None: ...
    def broke(self, h: Any, e: BaseException) -> None: ...
    def unreachable(self, h: Any, e: BaseException) -> None: ...
    def killed(self, h: Any, why: str) -> None: ...
    def close(self, h: Any) -> None: ...
    def event(self, kind: str, **fields: Any) -> None: ...
    def learn(self, secret: str) -> None: ...
    def end(self, reason: str) -> None: ...


class InlineAudit:
    """The audit in the serving loop itself: each step applied as it is told."""

    def __init__(self, run: ProxyRun) -> None:
        self.run = run
        self.run_dir = run.run_dir

    def open(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes, address: str | None) -> Any:
        try:
            return self.run.open_exchange(path, headers, body, address)
        except Exception:  # noqa: BLE001 - the audit never breaks the pass-through
            return None

    def started(self, h: ChatExchange, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        _audit(h, h.started, status, httpx.Headers(headers))

    def chunk(self, h: ChatExchange, data: bytes) -> None:
        _audit(h, h.chunk, data)

    def ended(self, h: ChatExchange) -> None:
        _audit(h, h.ended)

    def broke(self, h: ChatExchange, e: BaseException) -> None:
        _audit(h, h.broke, e)

    def unreachable(self, h: ChatExchange, e: BaseException) -> None:
        _audit(h, h.unreachable, e)

    def killed(self, h: ChatExchange, why: str) -> None:
        _audit(h, h.killed, why)

    def close(self, h: ChatExchange) -> None:
        self.run.record(h)

    def event(self, kind: str, **fields: Any) -> None:
        self.run.history.event(kind, **fields)

    def learn(self, secret: str) -> None:
        self.run.secrets.learn(secret)

    def end(self, reason: str) -> None:
        self.run.end(reason)


def _exception(name: str, message: str) -> BaseException:
    """An exception that reads as the one the forwarding process caught: its class name and text
    are what a record keeps of it (take_connection_error)."""
    return type(name, (Exception,), {})(message)


class WorkerAudit:
    """The audit in a process of its own. Each step is appended here with its CLOCK_MONOTONIC
    stamp (under a microsecond); once per pass of the serving loop, what has gathered is pickled
    as one frame and written to the worker's stdin without blocking (what the pipe does not take
    waits here, in `_out`, until it does). No thread: one that woke for each step fought the
    serving loop for the GIL in every burst of requests. `end` sends the run's end and waits for
    the worker to close the history."""

    def __init__(self, out: Path, run_info: dict[str, Any], api_key: str | None, capture: bool, quiet: bool) -> None:
        import subprocess

        self.run_id = new_run_id()
        self.run_dir = out / self.run_id
        self._ids = itertools.count(1)
        self._steps: list[tuple] = []  # gathered since the last frame
        self._out = bytearray()  # frames the pipe has not taken yet
        self._loop: asyncio.AbstractEventLoop | None = None  # the serving loop, once a step came from it
        self._flushing = False  # a flush is scheduled on the loop
        self._waiting = False  # the loop watches the pipe for room
        self._behind: set[int] = set()  # exchanges whose chunks were dropped (WORKER_BACKLOG)
        self.dead: str | None = None  # why the worker can no longer be told anything
        self._ended = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4bench.modes.proxy_audit"], stdin=subprocess.PIPE, close_fds=True
        )
        assert self.proc.stdin is not None
        self._fd = self.proc.stdin.fileno()
        config = {
            "out": str(out),
            "run_id": self.run_id,
            "run_info": run_info,
            "api_key": api_key,
            "capture": capture,
            "quiet": quiet,
        }
        # The first frame, written whole before anything is served: the worker makes the run
        # folder from it at once.
        self.proc.stdin.write(_frame([("config", config)]))
        self.proc.stdin.flush()
        os.set_blocking(self._fd, False)

    def _put(self, step: tuple) -> None:
        if self.dead is not None:
            return
        self._steps.append(step)
        if not self._flushing:
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:  # a step from outside any loop: it goes with the next frame
                return
            self._flushing = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Pickle what gathered as one frame, and hand the pipe what it will take."""
        self._flushing = False
        if self._steps and self.dead is None:
            self._out += _frame(self._steps)
            self._steps = []
        self._send()

    def _send(self) -> None:
        while self._out and self.dead is None:
            try:
                n = os.write(self._fd, self._out)
            except BlockingIOError:
                break
            except OSError as e:
                self._died(f"its pipe failed: {e}")
                break  # on to unwatch the pipe
            del self._out[:n]
        want = bool(self._out) and self.dead is None and self._loop is not None and not self._loop.is_closed()
        if want != self._waiting and self._loop is not None and not self._loop.is_closed():
            if want:
                self._loop.add_writer(self._fd, self._send)
            else:
                self._loop.remove_writer(self._fd)
            self._waiting = want

    def _died(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
            self._out.clear()
            self._steps.clear()
            print(
                f"dsv4bench proxy: the audit worker stopped ({why}); answers pass on unaudited, "
                "and the run's history ends here",
                file=sys.stderr,
            )

    def open(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes, address: str | None) -> Any:
        h = next(self._ids)
        self._put(("open", h, path, headers, body, address, time.time_ns(), time.monotonic_ns()))
        return h

    def started(self, h: int, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._put(("started", h, status, list(headers), time.monotonic_ns()))

    def chunk(self, h: int, data: bytes) -> None:
        if h in self._behind:
            return
        if len(self._out) > WORKER_BACKLOG:
            self._behind.add(h)
            self._put(("behind", h))
            return
        self._put(("chunk", h, data, time.monotonic_ns()))

    def ended(self, h: int) -> None:
        self._put(("ended", h, time.monotonic_ns()))

    def broke(self, h: int, e: BaseException) -> None:
        self._put(("broke", h, type(e).__name__, str(e), time.monotonic_ns()))

    def unreachable(self, h: int, e: BaseException) -> None:
        self._put(("unreachable", h, type(e).__name__, str(e), time.monotonic_ns()))

    def killed(self, h: int, why: str) -> None:
        self._put(("killed", h, why, time.monotonic_ns()))

    def close(self, h: int) -> None:
        self._behind.discard(h)
        self._put(("close", h, time.monotonic_ns()))

    def event(self, kind: str, **fields: Any) -> None:
        self._put(("event", kind, fields))

    def learn(self, secret: str) -> None:
        self._put(("learn", secret))

    def end(self, reason: str, timeout: float = 120.0) -> None:
        """Tell the worker the run ended, and wait for it to close the history. Called once the
        serving loop has stopped: what is left is written here, blocking. Once: a second call
        changes nothing."""
        if self._ended:
            return
        self._ended = True
        if self.dead is None:
            self._out += _frame([*self._steps, ("end", str(reason))])
            self._steps = []
            if self._waiting and self._loop is not None and not self._loop.is_closed():
                self._loop.remove_writer(self._fd)
            self._waiting = False
            os.set_blocking(self._fd, True)
            try:
                while self._out:
                    del self._out[: os.write(self._fd, self._out)]
            except OSError as e:
                self._died(f"its pipe failed: {e}")
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        except Exception:  # noqa: BLE001 - a worker that will not finish is stopped, its history as it is
            self.proc.kill()
            code = self.proc.wait()
        if code != 0:
            self._died(f"exit status {code}")


class _Worker:
    """The worker process's side: the steps applied to an InlineAudit's exchanges, in order."""

    def __init__(self, config: dict[str, Any]) -> None:
        on_turn = None if config["quiet"] else print_finding
        self.run = ProxyRun(
            Path(config["out"]),
            config["run_info"],
            api_key=config["api_key"],
            on_turn=on_turn,
            capture=config["capture"],
            run_id=config["run_id"],
        )
        self.exchanges: dict[int, ChatExchange] = {}
        self.ended = False

    def apply(self, step: tuple) -> None:
        op = step[0]
        if op == "open":
            _, h, path, headers, body, address, wall_ns, ns = step
            try:
                ex = self.run.open_exchange(path, headers, body, address, (wall_ns, ns))
            except Exception:  # noqa: BLE001 - a request the audit cannot open passes unjudged
                ex = None
            if ex is not None:
                self.exchanges[h] = ex
            return
        if op == "event":
            self.run.history.event(step[1], **step[2])
            return
        if op == "learn":
            self.run.secrets.learn(step[1])
            return
        if op == "end":
            self.finish(step[1])
            return
        ex = self.exchanges.get(step[1])
        if ex is None:
            return
        if op == "chunk":
            _audit(ex, ex.chunk, step[2], step[3])
        elif op == "started":
            _audit(ex, ex.started, step[2], httpx.Headers(step[3]), step[4])
        elif op == "ended":
            _audit(ex, ex.ended)
        elif op == "broke":
            _audit(ex, ex.broke, _exception(step[2], step[3]))
        elif op == "unreachable":
            _audit(ex, ex.unreachable, _exception(step[2], step[3]))
        elif op == "killed":
            _audit(ex, ex.killed, step[2])
        elif op == "behind":
            ex.problems.append(
                f"the proxy's audit fell more than {WORKER_BACKLOG >> 20} MiB behind the traffic: the rest of "
                "this answer passed on unread"
            )
            ex.judged = False
            ex.stop_reading()
        elif op == "close":
            del self.exchanges[step[1]]
            self.run.record(ex, step[2])

    def finish(self, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self.run.end(reason)


def print_finding(rec: TurnRecord) -> None:
    """One line on stderr per turn the checkers or the transport found something wrong with."""
    codes = sorted({v.code for v in rec.verdicts})
    if codes or rec.error_kind is not None:
        what = ", ".join(codes) or str(rec.error_kind)
        _stderr().print(markup_safe(f"session {rec.session} turn {rec.turn}: {what}"), highlight=False, soft_wrap=True)


@functools.cache
def _stderr() -> Console:
    return Console(stderr=True)


def _worker_main() -> int:
    """`python -m dsv4bench.modes.proxy_audit`: read frames from stdin until the run's end or EOF
    (the proxy gone: the history is closed as interrupted)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the proxy's to handle; the end comes by the pipe
    with contextlib.suppress(AttributeError, OSError):  # no os.nice (Windows), or not allowed: as it is
        os.nice(WORKER_NICE)
    stdin = sys.stdin.buffer
    worker: _Worker | None = None
    while True:
        head = stdin.read(_FRAME.size)
        if len(head) < _FRAME.size:
            break
        (n,) = _FRAME.unpack(head)
        data = stdin.read(n)
        if len(data) < n:
            break
        for step in pickle.loads(data):
            if step[0] == "config":
                worker = _Worker(step[1])
            elif worker is not None:
                worker.apply(step)
        if worker is not None and worker.ended:
            return 0
    if worker is not None:
        worker.finish("interrupted")
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
