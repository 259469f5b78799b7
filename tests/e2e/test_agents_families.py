"""End to end, every model family: the real CLI against the replay server writing its answers in
each family's format, served under that family's model name so the harness tells the family
from the answer's `model` (`--family mixed`: one server for all of them, session N in the N-th
family's format, as a gateway in front of a mixed fleet). Each family's corrupt answers (a call
block left in content or reasoning, its markup in an argument, its special tokens in content, in
an argument and in another spelling) land under exactly the codes the server's ledger names,
streamed and not; its clean answers (text before the calls, an empty-argument call, terminal
escapes, unicode, integers and booleans in arguments, unicode in a final answer) under none; and
the run says CORRUPTION with faults planted, CLEAN with none.

The harness's own requests never hold a family's markup, so the look-alikes that need the
request to hold it (markup copied from the user's or a tool's message into an argument, a marker
quoted in prose) are asked of the same server by requests this test writes, recorded as a
capture and judged by `dsv4bench audit`: clean where the request holds the text, a leak where the
same answer comes to a request that does not.

Four short runs (with faults and without, streamed and not) and one audit, shared by the module.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dsv4bench.families import BY_NAME
from dsv4bench.history.run_folder import read_history

from .conftest import ROOT, only_run_dir, run_cli

sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from replay_server import (
    ANSWER_HEADER,
    FINAL_SUFFIX,
    FORMATS,
    LOOKALIKE_CALLS,
    MIXED,
    SAMPLE_CALL,
    family_faults,
    quoted_markers,
    serve_in_thread,
)

FAMILIES = list(FORMATS)
SESSIONS_PER_FAMILY = 3
FAULT_RATE = 80  # percent of turns with a fault: enough to plant each of a family's faults per run
RUN_ARGS = ("--concurrency", str(len(FAMILIES)), "--scenario", "coding", "--quiet", "--fail-on", "corruption")
# Runs with faults: a few sessions a family, each a few turns; runs without: one session a family,
# long enough for the expert's final answer.
FAULTY_ARGS = ("--sessions", str(SESSIONS_PER_FAMILY * len(FAMILIES)), "--max-turns", "6")
CLEAN_ARGS = ("--sessions", str(len(FAMILIES)), "--max-turns", "14")
FAMILY_OF_MODEL = {f.model: name for name, f in FORMATS.items()}


@dataclass
class Run:
    stream: bool
    dir: Path
    planted: dict[tuple[str, int], dict]  # (session, turn) -> the ledger's line
    returncode: int
    stderr: str

    def turns_of(self, family: str) -> list:
        """The run's turns whose session the server answered in `family`'s format."""
        index = FAMILIES.index(family)
        return [t for t in read_history(self.dir).turns if int(t.session[1:6]) % len(FAMILIES) == index]


def ledger_lines(ledger: Path) -> list[dict]:
    return [json.loads(x) for x in ledger.read_text().splitlines()]


def agents_run(url: str, ledger: Path, out: Path, stream: bool, *args: str) -> Run:
    """One `agents` run against the replay server at `url`, with the ledger lines written during it."""
    before = len(ledger_lines(ledger))
    r = run_cli(
        "agents", "--url", url, "--out", str(out), *RUN_ARGS, *args, *(() if stream else ("--no-stream",)), timeout=180
    )
    planted = {(d["session"], d["turn"]): d for d in ledger_lines(ledger)[before:]}
    return Run(stream, only_run_dir(out) if out.exists() else out, planted, r.returncode, r.stderr)


@dataclass
class Played:
    faulty: list[Run]  # streamed, then not
    clean: list[Run]  # streamed, then not
    audited: dict[tuple[str, str, str, bool], set[str]]  # (family, answer, holds, stream) -> codes


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> Played:
    """The mixed server in this process: two runs with faults (streamed, then not), two without,
    then the scripted answers to requests this test writes, audited as one capture."""
    tmp = tmp_path_factory.mktemp("families")
    ledger = tmp / "ledger.jsonl"
    ledger.touch()
    with serve_in_thread(fault_rate_pct=FAULT_RATE, ledger=ledger, stall_s=1.0, family=MIXED) as (root, srv):
        url = f"{root}/v1"
        faulty = [
            agents_run(url, ledger, tmp / f"faulty-{mode}", mode == "streamed", *FAULTY_ARGS)
            for mode in ("streamed", "unstreamed")
        ]
        srv.rate = 0
        clean = [
            agents_run(url, ledger, tmp / f"clean-{mode}", mode == "streamed", *CLEAN_ARGS)
            for mode in ("streamed", "unstreamed")
        ]
        exchanges = [(family, *key, rec) for family in FAMILIES for key, rec in scripted_exchanges(url, family)]
    capture, out = tmp / "capture.jsonl", tmp / "audit.jsonl"
    capture.write_text("".join(json.dumps(x[-1], ensure_ascii=False) + "\n" for x in exchanges), encoding="utf-8")
    a = run_cli("audit", str(capture), "--out", str(out))
    assert "Traceback" not in a.stderr, a.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(results) == len(exchanges)
    audited = {x[:-1]: {v["code"] for v in res["verdicts"]} for x, res in zip(exchanges, results)}
    return Played(faulty, clean, audited)


def test_the_replay_server_writes_every_family_of_the_registry():
    assert set(FORMATS) == set(BY_NAME)
    assert len({f.model for f in FORMATS.values()}) == len(FORMATS)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_corrupt_answer_lands_under_its_codes_and_each_clean_answer_under_none(played, family):
    fmt = FORMATS[family]
    for run in played.faulty:
        mode = "streamed" if run.stream else "unstreamed"
        assert "Traceback" not in run.stderr, run.stderr
        assert run.returncode == 1, (mode, run.stderr)  # --fail-on corruption, with corruption planted
        turns = run.turns_of(family)
        assert len(turns) >= 2 * SESSIONS_PER_FAMILY, (mode, len(turns))
        assert {t.response.model for t in turns if t.response} == {fmt.model}
        mismatches = []
        for t in turns:
            got = sorted({v.code for v in t.verdicts})
            want = sorted(run.planted[(t.session, t.turn)]["codes"]) if (t.session, t.turn) in run.planted else []
            if got != want:
                mismatches.append((mode, t.session, t.turn, want, got, [v.detail for v in t.verdicts]))
        assert not mismatches, mismatches[:5]
        planted = {k: d for k, d in run.planted.items() if k in {(t.session, t.turn) for t in turns}}
        # Every fault of the family was planted in this run, and some turns were left clean.
        assert {d["fault"] for d in planted.values()} == {f.name for f in family_faults(fmt)}, mode
        assert len(turns) > len(planted), mode
        # The turns the server left clean carried the look-alikes, JSON types and escapes kept.
        clean_calls = [c for t in turns if (t.session, t.turn) not in planted for c in t.response.tool_calls]
        sent = [(c.name, json.loads(c.arguments)) for c in clean_calls]
        assert all((c.name, c.arguments) in sent for c in LOOKALIKE_CALLS[:2]), (mode, sent)
        assert any(
            "\\u001b[1m" in c.arguments
            and '"case_sensitive": true' in c.arguments
            and '"max_results": 5,' in c.arguments
            for c in clean_calls
        )  # the escape and the JSON types as the server wrote them
    for run in played.faulty:
        summary = json.loads((run.dir / "summary.json").read_text())
        assert summary["verdict"] == "CORRUPTION" and summary["turns"]["corrupt"] == len(run.planted)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_answered_only_cleanly_is_clean_streamed_and_not(played, family):
    for run in played.clean:
        assert run.returncode == 0, run.stderr
        assert not run.planted
        turns = run.turns_of(family)
        assert len(turns) >= 6 and all(not t.verdicts for t in turns)
        assert {t.response.model for t in turns} == {FORMATS[family].model}
        assert any(c.name == "list_dir" and json.loads(c.arguments) == {} for t in turns for c in t.response.tool_calls)


def test_runs_with_only_clean_answers_say_clean(played):
    for run in played.clean:
        summary = json.loads((run.dir / "summary.json").read_text())
        assert summary["verdict"] == "CLEAN" and summary["turns"]["corrupt"] == 0
        assert summary["turns"]["total"] >= 6 * len(FAMILIES)
        finals = [t for t in read_history(run.dir).turns if not t.response.tool_calls]
        assert finals and all(t.response.content.endswith(FINAL_SUFFIX) for t in finals)  # unicode, judged clean


# --- look-alikes that need the request to hold the markup: a capture judged by `audit` ----------

WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a text file.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["path", "content"],
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "overwrite": {"type": "boolean"},
                "mode": {"type": "integer"},
            },
        },
    },
}
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def request_messages(family: str, answer: str, holds: str) -> list[dict]:
    """A conversation whose user message (holds="user") or tool result (holds="tool") holds the
    text the scripted `answer` repeats, or neither (holds="none")."""
    fmt = FORMATS[family]
    text = fmt.block((SAMPLE_CALL,)) if answer == "write_block" else "{} and {}".format(*quoted_markers(fmt))
    system = {"role": "system", "content": "You are a coding agent working on a tool-call parser."}
    if holds == "user":
        return [system, {"role": "user", "content": f"What do these mean, and save an example call:\n{text}"}]
    if holds == "tool":
        return [
            system,
            {"role": "user", "content": "Read the parser's fixture and explain it."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": json.dumps({"path": "tests/fixtures/notes.md"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": f"# notes\n{text}\n"},
        ]
    return [system, {"role": "user", "content": "Explain how the model ends a tool call, and save an example call."}]


# (answer, the request holds its text where, stream) -> codes `audit` must give
CASES = [
    (answer, holds, stream)
    for answer in ("quote", "write_block")
    for holds in ("user", "tool", "none")
    for stream in (True, False)
]


def expected_codes(family: str, answer: str, holds: str) -> set[str]:
    if holds != "none":
        return set()
    stem = FORMATS[family].markup_codes
    if answer == "write_block":
        return {f"{stem}_in_arguments"}  # a whole call block the task never showed
    return {f"{stem}_leak_content", "special_token_leak"}  # markers quoted that nothing asked about


def scripted_exchanges(url: str, family: str) -> list[tuple[tuple[str, str, bool], dict]]:
    """Every CASES request to the family's server over HTTP, recorded as `audit` reads a capture."""
    out = []
    with httpx.Client(timeout=10) as client:
        for answer, holds, stream in CASES:
            body = {
                "model": FORMATS[family].model,
                "messages": request_messages(family, answer, holds),
                "tools": [WRITE_FILE, READ_FILE],
                "stream": stream,
            }
            r = client.post(f"{url}/chat/completions", json=body, headers={ANSWER_HEADER: answer})
            assert r.status_code == 200, r.text
            out.append(
                (
                    (answer, holds, stream),
                    {"request": body, "sse": r.text} if stream else {"request": body, "response": r.json()},
                )
            )
    return out


def audited_cases(played: Played, family: str, answer: str, holds: tuple[str, ...]) -> dict:
    return {(h, stream): played.audited[(family, answer, h, stream)] for _, h, stream in CASES if h in holds}


@pytest.mark.parametrize("family", FAMILIES)
def test_markers_quoted_in_prose_are_a_leak_where_the_request_never_showed_them(played, family):
    got = audited_cases(played, family, "quote", ("none",))
    assert got == {key: expected_codes(family, "quote", "none") for key in got} and len(got) == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_markers_quoted_in_prose_are_clean_where_the_request_holds_them(played, family):
    got = audited_cases(played, family, "quote", ("user", "tool"))
    assert got == {key: set() for key in got} and len(got) == 4


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_block_written_into_a_file_is_clean_only_where_the_request_holds_it(played, family):
    got = audited_cases(played, family, "write_block", ("user", "tool", "none"))
    want = {(h, stream): expected_codes(family, "write_block", h) for h, stream in got}
    assert got == want and len(got) == 6
