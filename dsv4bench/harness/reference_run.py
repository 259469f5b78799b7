"""A reference run's answers, keyed by the request that produced them: the differential check.

A cache bug that hands the model wrong context (a race on a KV or index buffer, a stale prefix)
often leaves every tool call well formed: the model just writes something else. No checker of a
single turn can see that. What can: the same greedy request, sent to a server that does not have
the bug (the same server with HiCache off, an older build, or simply a run before the change),
must get the same answer. `dsv4bench agents --reference RUN` replays the tasks of RUN (same
--seed and flags) and judges every turn whose request RUN also sent: a different answer is
`reference_mismatch`. Sessions part ways after their first mismatch, so later turns send
requests RUN never saw and are not compared; each mismatch is a session's first.

It needs a server that answers greedy requests deterministically, whatever else is in the batch:
the bundled engine does; SGLang needs `--enable-deterministic-inference`. Only turns at
temperature 0 are keyed and compared.

The key covers what the model sees and how it samples: the messages (tool-call ids left out:
servers make them up), tools, tool choice, chat template flags, max_tokens and sampling
settings; not the model name, the `user` tag or whether the answer streams.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bench.errors import UsageError
from dsv4bench.history.run_folder import TURNS_FILE, find_run_folder, read_jsonl
from dsv4bench.history.records import ReferenceAnswer

# Request fields that do not change what a deterministic server writes.
_NOT_IN_KEY = ("model", "user", "stream", "stream_options")


class ReferenceRunError(UsageError):
    """The --reference folder cannot serve as a reference; the CLI prints it as one line."""


def _message_for_key(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if k != "tool_call_id"}
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [
            {k: v for k, v in c.items() if k != "id"} if isinstance(c, dict) else c for c in out["tool_calls"]
        ]
    return out


# NOTE: one encoder, built once: json.dumps with any argument builds a new one on every call.
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def request_key(body: dict[str, Any]) -> str:
    """A short hash of everything in a chat request that decides a deterministic server's answer."""
    canon = {k: v for k, v in body.items() if k not in _NOT_IN_KEY}
    canon["messages"] = [_message_for_key(m) if isinstance(m, dict) else m for m in body.get("messages") or []]
    return _hash(_canonical(canon))


class SessionKeys:
    """request_key of one session's requests, each message's canonical text encoded once.

    A session's transcript only grows, and every request sends the same message objects again,
    so the sorted dump of the whole transcript (most of a key's cost by a late turn) is redone
    only for the new messages. A kept text is reused only for the same object, unchanged since
    (a shallow copy compared), so a message replaced or edited is encoded again: the key is
    always request_key's, byte for byte (tests/test_reference_key.py).
    """

    def __init__(self) -> None:
        self._messages: list[tuple[Any, Any, str]] = []  # (message, its copy then, its text)
        self._tools: tuple[Any, Any, str] | None = None

    def key(self, body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        if not isinstance(messages, list) or not all(isinstance(k, str) for k in body):
            return request_key(body)
        parts = []
        for name in sorted({k for k in body if k not in _NOT_IN_KEY} | {"messages"}):
            if name == "messages":
                text = "[" + ",".join(self._message_text(i, m) for i, m in enumerate(messages)) + "]"
            elif name == "tools":
                text = self._tools_text(body[name])
            else:
                text = _canonical(body[name])
            parts.append(f"{_canonical(name)}:{text}")
        return _hash("{" + ",".join(parts) + "}")

    def _message_text(self, i: int, m: Any) -> str:
        if i < len(self._messages):
            kept, copy, text = self._messages[i]
            if kept is m and _unchanged(m, copy):
                return text
            del self._messages[i:]
        text = _canonical(_message_for_key(m) if isinstance(m, dict) else m)
        self._messages.append((m, _shallow(m), text))  # messages come in order: this is entry i
        return text

    def _tools_text(self, tools: Any) -> str:
        if self._tools is not None and self._tools[0] is tools and _unchanged(tools, self._tools[1]):
            return self._tools[2]
        text = _canonical(tools)
        self._tools = (tools, _shallow(tools), text)
        return text


def _shallow(value: Any) -> Any:
    return value.copy() if isinstance(value, (dict, list)) else value


def _unchanged(value: Any, copy: Any) -> bool:
    # NOTE: == on the same element objects is an identity check each, so this is cheap; and a
    # message's nested tool-call list is built whole once, never edited in place.
    return type(value) is type(copy) and value == copy


def is_greedy(body: dict[str, Any]) -> bool:
    """Whether a deterministic server must give this request the same answer every time (a
    request body, or the summary turns.jsonl keeps of one)."""
    t = body.get("temperature", 1.0)  # OpenAI's default temperature is 1
    return isinstance(t, (int, float)) and t == 0


@dataclass
class ReferenceAnswers:
    """The answers of one reference run, by request key."""

    run_dir: Path
    answers: dict[str, ReferenceAnswer]
    # Keys the reference itself answered two ways: its server was not deterministic there.
    conflicts: int = 0

    def get(self, key: str) -> ReferenceAnswer | None:
        return self.answers.get(key)

    @classmethod
    def load(cls, path: Path) -> ReferenceAnswers:
        """Read a run folder (or an --out folder holding exactly one run)."""
        run_dir = find_run_folder(path, "--reference", ReferenceRunError)
        try:
            records, _ = read_jsonl(run_dir / TURNS_FILE)
        except OSError as e:  # a folder in its place, no permission
            raise ReferenceRunError(f"--reference {run_dir}: cannot read {TURNS_FILE} ({e.strerror or e})") from None
        answers: dict[str, ReferenceAnswer] = {}
        conflicts = 0
        for rec in records:
            req, resp = rec.get("request"), rec.get("response")
            if not isinstance(req, dict) or not isinstance(resp, dict) or rec.get("status") != "ok":
                continue
            key = req.get("key")
            if not isinstance(key, str) or not key or not is_greedy(req):
                continue
            try:
                answer = ReferenceAnswer.from_response_json(
                    resp, session=str(rec.get("session", "")), turn=rec.get("turn")
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue  # a record of the wrong shape (edited by hand) answers nothing
            seen = answers.setdefault(key, answer)
            conflicts += seen.output != answer.output
        if not answers:
            raise ReferenceRunError(
                f"--reference {path}: no completed greedy turn with a request key in {run_dir / TURNS_FILE} "
                "(the run was at --temperature above 0, had no completed turn, or was recorded by a "
                "dsv4bench without request keys)"
            )
        return cls(run_dir, answers, conflicts)
