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

from .history import TURNS_FILE, find_run_folder, read_jsonl
from .records import ReferenceAnswer

# Request fields that do not change what a deterministic server writes.
_NOT_IN_KEY = ("model", "user", "stream", "stream_options")


class ReferenceRunError(Exception):
    """The --reference folder cannot serve as a reference; the CLI prints it as one line."""


def _message_for_key(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if k != "tool_call_id"}
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} if isinstance(c, dict) else c
                             for c in out["tool_calls"]]
    return out


def request_key(body: dict[str, Any]) -> str:
    """A short hash of everything in a chat request that decides a deterministic server's answer."""
    canon = {k: v for k, v in body.items() if k not in _NOT_IN_KEY}
    canon["messages"] = [_message_for_key(m) if isinstance(m, dict) else m for m in body.get("messages") or []]
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


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
        records, _ = read_jsonl(run_dir / TURNS_FILE)
        answers: dict[str, ReferenceAnswer] = {}
        conflicts = 0
        for rec in records:
            req, resp = rec.get("request") or {}, rec.get("response")
            key = req.get("key")
            if rec.get("status") != "ok" or not resp or not key or not is_greedy(req):
                continue
            answer = ReferenceAnswer.from_response_json(resp, session=str(rec.get("session", "")),
                                                        turn=rec.get("turn"))
            seen = answers.setdefault(key, answer)
            conflicts += seen.output != answer.output
        if not answers:
            raise ReferenceRunError(
                f"--reference {path}: no completed greedy turn with a request key in {run_dir / TURNS_FILE} "
                "(the run was at --temperature above 0, had no completed turn, or was recorded by a "
                "dsv4bench without request keys)")
        return cls(run_dir, answers, conflicts)


