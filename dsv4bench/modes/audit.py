"""`dsv4bench audit FILE`: the checkers over traffic recorded elsewhere (production logs, a proxy
capture, a run of our own), and with `--reference RUN` a recorded run judged against another.

Each JSONL line is one exchange, in any of these shapes:
  {"request": {chat body}, "response": {chat.completion body}}      a non-streamed pair
  {"request": {chat body}, "sse": "data: {...}\\n\\ndata: [DONE]\\n\\n"}  a captured stream (text)
  {"request": {chat body}, "sse": ["data: {...}", "data: [DONE]"]}    ... or its lines
  a dsv4bench turns.jsonl record (request.body + raw_sse)             re-audit a run
Optional fields: "http_status" (an error status, 3xx included, makes it an http_error), "raw_completion" (the
--raw oracle's text; a turns.jsonl record keeps it in "oracles"), "tools" (when the request is
not recorded). With a raw completion, the parsers' view (checks/parser_view.py) is printed
beside the verdicts: where the server, deepseek-recipe and SGLang read it differently.

A run folder (an `agents` run, or what `dsv4bench proxy` captured) is read as its turns.jsonl.
A passing turn keeps only a summary of its request and its assembled answer, not the request
body nor the raw stream: it cannot be re-judged from what was on the wire, only its recorded
answer re-checked (without the offered tools). Such turns are counted and said, never passed
off as re-judged.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import EventSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dsv4bench.checks import run_checks
from dsv4bench.checks.parser_view import (
    Disagreement,
    disagreements,
    family_read_as,
    first_reader,
    oracle_versions,
    read_oracles,
)
from dsv4bench.checks.reference import check_reference_mismatch
from dsv4bench.errors import UsageError
from dsv4bench.history.codes import AVAILABILITY_CODES, CORRUPTION_CODES, REFERENCE_CODE
from dsv4bench.history.run_folder import TURNS_FILE
from dsv4bench.families import AUTO, chosen_family, family_for
from dsv4bench.history.records import AssembledResponse, GivenText, OracleReadings, TurnContext, TurnStatus, Verdict
from dsv4bench.harness.reference_run import ReferenceAnswers, is_greedy, request_key
from dsv4bench.history.request_terms import RequestTerms
from dsv4bench.wire.sse import DeltaAssembler, assemble_completion
from dsv4bench.wire.turn_answer import is_http_error
from dsv4bench.terminal import visible
from dsv4bench.harness.turn_judge import token_cap

# Without the offered tools, these two cannot be judged and are left out.
_NEED_TOOLS = ("unknown_tool", "schema_violation")


class AuditError(UsageError):
    """The file cannot be audited at all (missing, unreadable)."""


@dataclass
class AuditResult:
    line: int
    response_id: str | None
    verdicts: list[Verdict] = field(default_factory=list)
    check_errors: list[str] = field(default_factory=list)
    problem: str | None = None  # the line could not be read as an exchange
    oracles: OracleReadings | None = None  # the --raw oracles' readings, where there was a raw completion
    parsers: list[Disagreement] = field(default_factory=list)  # where they and the server disagree
    session: str | None = None  # a turns.jsonl record's session and turn
    turn: int | None = None
    # A turn record that kept neither its request body nor its raw stream (it passed when
    # recorded): only its recorded answer was re-checked, nothing re-read from the wire.
    summary_only: bool = False
    reference_compared: bool = False  # --reference: judged against the reference run's answer
    reference_parted: bool = False  # ... had one, but its session had parted from the reference before

    @property
    def where(self) -> str:
        """How a finding names this exchange: its line, and its session and turn where recorded."""
        turn = f" (session {self.session} turn {self.turn})" if self.session is not None else ""
        return f"line {self.line}{turn}"

    @property
    def corrupt(self) -> bool:
        return any(v.code in CORRUPTION_CODES for v in self.verdicts)

    @property
    def errors(self) -> bool:
        return any(v.code in AVAILABILITY_CODES for v in self.verdicts)


def sse_payloads(sse: Any) -> list[str]:
    """The data payloads of a captured stream, given as text or as a list of lines/payloads."""
    if isinstance(sse, list):
        text_lines = [str(x) for x in sse]
        if not any(x.startswith(("data:", "event:", "id:", ":")) for x in text_lines):
            return text_lines  # already payloads (as turns.jsonl stores them)
        sse = "\n\n".join(text_lines) + "\n\n"
    # A byte order mark at the start is dropped, as the live reader drops it (stream_reader.py).
    text = str(sse).removeprefix("\ufeff")
    resp = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())
    return [ev.data for ev in EventSource(resp).iter_sse()]


def _offered_tools(rec: dict[str, Any], req: dict[str, Any]) -> dict[str, dict[str, Any]]:
    src = rec.get("tools") if isinstance(rec.get("tools"), list) else req.get("tools")
    if not isinstance(src, list):
        return {}
    tools = {}
    for t in src:
        fn = (t.get("function") or t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            tools[fn["name"]] = fn.get("parameters") or {}
    return tools


def _family(rec: dict[str, Any], req: dict[str, Any]) -> str | None:
    """The server's model family as the exchange says it: a `family` or `tool_call_parser` the
    capture names, else the model names of the answer and the request (None: every family)."""
    resp = v if isinstance(v := rec.get("response"), dict) else {}
    named = rec.get("family")
    if isinstance(named, str) and named:
        return family_for(parser=named, models=(named,))
    parser = rec.get("tool_call_parser")
    models = [m for m in (resp.get("model"), rec.get("model"), req.get("model")) if isinstance(m, str)]
    return family_for(parser=parser if isinstance(parser, str) else None, models=models)


def exchange_context(rec: dict[str, Any], family: str = AUTO) -> TurnContext:
    """Build the checkers' view of one recorded exchange (`family`: audit's --family). Raises ValueError on an unusable line
    (KeyError or TypeError where a turn record lacks a field or holds one of the wrong type)."""
    req = v if isinstance(v := rec.get("request"), dict) else {}
    is_turn_record = "session" in rec and "status" in rec  # a dsv4bench turns.jsonl line
    if isinstance(req.get("body"), dict):
        req = req["body"]
    kept = rec.get("oracles")  # a turns.jsonl record keeps its raw completion there
    raw = rec.get("raw_completion", kept.get("raw_completion") if isinstance(kept, dict) else None)
    # What the request asked: its body's own terms, else those its summary kept.
    terms = RequestTerms.of_body(req) if "messages" in req else RequestTerms.from_json(req.get("terms"))
    ctx = TurnContext(
        response=None,
        tools=_offered_tools(rec, req),
        stream=bool(req.get("stream", True)),
        max_tokens=token_cap(req),
        raw_completion=raw,
        thinking=terms.thinking,
        terms=terms,
        given=GivenText.of_body(req),
        family=chosen_family(family, _family(rec, req)),
    )
    status_code = rec.get("http_status")
    if is_turn_record and rec["status"] != TurnStatus.OK.value:
        ctx.status, ctx.http_status = TurnStatus(rec["status"]), status_code
        ctx.error, ctx.error_kind = rec.get("error"), rec.get("error_kind")
        return ctx
    if isinstance(status_code, int) and is_http_error(status_code):
        ctx.status, ctx.http_status, ctx.error_kind = TurnStatus.ERROR, status_code, "http_error"
        ctx.error = f"HTTP {status_code}"
        return ctx
    sse = rec.get("sse") if rec.get("sse") is not None else rec.get("raw_sse")
    resp = rec.get("response")
    if isinstance(resp, dict) and "choices" in resp:
        ctx.response = assemble_completion(resp)
    elif is_turn_record and sse and not (resp or {}).get("stream", True):
        try:  # a non-streamed turn keeps its raw body
            ctx.response = assemble_completion(json.loads(sse[0]))
        except ValueError:
            ctx.response = AssembledResponse(stream=False, protocol_errors=["response body is not JSON"])
    elif sse is not None and (not is_turn_record or (resp or {}).get("stream", True)):
        asm = DeltaAssembler()
        for data in sse_payloads(sse):
            asm.feed(data)
        ctx.response = asm.finish()
    elif is_turn_record and isinstance(resp, dict):
        ctx.response = AssembledResponse.from_json(resp)  # a clean turn: no raw stream was kept
    else:
        raise ValueError("no 'response' body and no 'sse' stream")
    return ctx


def audit_records(records: list[tuple[int, Any]], family: str = AUTO) -> list[AuditResult]:
    results: list[AuditResult] = []
    for line, rec in records:
        if not isinstance(rec, dict):
            results.append(
                AuditResult(
                    line,
                    None,
                    problem="not a JSON object" if rec is not None else "not JSON (torn, binary or not UTF-8)",
                )
            )
            continue
        try:
            ctx = exchange_context(rec, family)
        except (KeyError, TypeError, ValueError) as e:  # also a turn record of the wrong shape (records.py)
            results.append(AuditResult(line, None, problem=str(e) if isinstance(e, ValueError) else repr(e)))
            continue
        verdicts, check_errors = run_checks(ctx)
        if not ctx.tools:
            verdicts = [v for v in verdicts if v.code not in _NEED_TOOLS]
        rid = ctx.response.response_id if isinstance(ctx.response, AssembledResponse) else None
        oracles = read_oracles(ctx)
        parsers = disagreements(ctx.response, oracles) if oracles is not None and ctx.response else []
        result = AuditResult(line, rid, verdicts, check_errors, oracles=oracles, parsers=parsers)
        if _is_turn_record(rec):
            result.session, result.turn = str(rec["session"]), rec.get("turn")
            result.summary_only = _kept_no_evidence(rec)
        results.append(result)
    return results


def _is_turn_record(rec: Any) -> bool:
    return isinstance(rec, dict) and "session" in rec and "status" in rec


def _kept_no_evidence(rec: dict[str, Any]) -> bool:
    req = v if isinstance(v := rec.get("request"), dict) else {}
    return rec.get("raw_sse") is None and rec.get("sse") is None and not isinstance(req.get("body"), dict)


def exchanges_file(path: Path) -> Path:
    """The JSONL file to audit: the path itself, or a run folder's turns.jsonl."""
    if path.is_dir():
        if not (path / TURNS_FILE).is_file():
            raise AuditError(f"{path} is a folder with no {TURNS_FILE}; give a run folder or a JSONL file")
        return path / TURNS_FILE
    if not path.exists():
        raise AuditError(f"{path}: no such file")
    return path


def read_exchanges(path: Path) -> list[tuple[int, Any]]:
    """Every non-blank line of a JSONL file (or a run folder's turns.jsonl) with its line number,
    parsed; None for a line that is not JSON."""
    path = exchanges_file(path)
    records: list[tuple[int, Any]] = []
    try:
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    records.append((n, json.loads(raw.decode("utf-8"))))
                except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past reading
                    records.append((n, None))
    except OSError as e:
        raise AuditError(f"{path}: {e.strerror or e}") from None
    return records


def audit_file(path: Path, reference: ReferenceAnswers | None = None, family: str = AUTO) -> list[AuditResult]:
    """Read and check every exchange of a JSONL file or a run folder; unreadable lines are reported
    as results (`problem`), and a file with no readable exchange at all is an AuditError. With a
    `reference`, the recorded turns are judged against it too (judge_against_reference)."""
    records = read_exchanges(path)
    results = audit_records(records, family)
    if not any(r.problem is None for r in results):
        raise AuditError(
            f"{exchanges_file(path)} holds no readable exchange ({len(results)} lines, none a JSON "
            "exchange): is it a JSONL capture?"
        )
    if reference is not None:
        judge_against_reference(path, records, results, reference)
    return results


def judge_against_reference(
    path: Path, records: list[tuple[int, Any]], results: list[AuditResult], reference: ReferenceAnswers
) -> None:
    """`agents --reference`, after the fact: every completed greedy turn whose request the reference
    run also answered is judged by the same checker on the answer it recorded. Each mismatch is
    its session's first, as live: there the session's later requests carry the differing answer,
    so the reference never saw them. Here the rule is kept outright (later turns of a parted
    session are marked `reference_parted`, not compared), so that a difference the next request
    does not carry, or a reference edited after the fact, still gives one verdict per session."""
    turns = [
        (rec, result) for (_, rec), result in zip(records, results) if _is_turn_record(rec) and result.problem is None
    ]
    greedy = [(rec, result) for rec, result in turns if is_greedy(_request_body(rec))]
    if not greedy:
        raise AuditError(
            f"{path}: no greedy turn to compare with --reference "
            f"({len(turns)} dsv4bench turn records; a run at --temperature above 0 has none)"
        )
    parted: set[str] = set()
    for rec, result in sorted(greedy, key=lambda x: (str(x[0]["session"]), _turn_number(x[0]))):
        key = _request_key(rec)
        answer = reference.get(key) if key else None
        if answer is None or rec.get("status") != TurnStatus.OK.value or not isinstance(rec.get("response"), dict):
            continue
        if result.session in parted:
            result.reference_parted = True
            continue
        found = check_reference_mismatch(
            TurnContext(response=AssembledResponse.from_json(rec["response"]), tools={}, reference=answer)
        )
        result.reference_compared = True
        if found:
            result.verdicts.extend(found)
            parted.add(str(result.session))


def _request_body(rec: dict[str, Any]) -> dict[str, Any]:
    """What a turn record kept of its request: the body where kept, else its summary (which keeps
    the temperature and the key)."""
    req = v if isinstance(v := rec.get("request"), dict) else {}
    return req["body"] if isinstance(req.get("body"), dict) else req


def _request_key(rec: dict[str, Any]) -> str | None:
    req = v if isinstance(v := rec.get("request"), dict) else {}
    if isinstance(req.get("key"), str):
        return req["key"]
    return request_key(req["body"]) if isinstance(req.get("body"), dict) else None


def _turn_number(rec: dict[str, Any]) -> int:
    return rec["turn"] if isinstance(rec.get("turn"), int) else 0


def reference_mismatches(results: list[AuditResult]) -> list[tuple[AuditResult, Verdict]]:
    """Each session's first parting from the reference run, in the file's order."""
    return [(r, v) for r in results for v in r.verdicts if v.code == REFERENCE_CODE]


def unreadable_summary(results: list[AuditResult]) -> str | None:
    """One line on the lines that could not be audited, or None when every line was."""
    bad = [r for r in results if r.problem is not None]
    if not bad:
        return None
    return (
        f"{len(bad)} of {len(results)} lines could not be audited (first: line {bad[0].line}, "
        f"{bad[0].problem}); a torn or mixed file?"
    )


def render_audit(results: list[AuditResult], console: Console, reference: ReferenceAnswers | None = None) -> None:
    counts: Counter[str] = Counter(code for r in results for code in {v.code for v in r.verdicts})
    bad = [r for r in results if r.verdicts or r.problem or r.parsers or _unread(r)]
    console.print(
        f"{len(results)} exchanges, {sum(r.corrupt for r in results)} corrupt, "
        f"{sum(r.errors for r in results)} errors, {sum(r.problem is not None for r in results)} unreadable"
    )
    summary_only = [r for r in results if r.summary_only]
    if summary_only:
        console.print(
            f"{len(summary_only)} turns could not be re-judged: the record kept no request body or stream "
            "for them (they passed when recorded); only their recorded answers were re-checked, without "
            "the offered tools",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if reference is not None:
        render_reference(results, reference, console)
    read = [r for r in results if r.oracles is not None]
    if read:
        console.print(
            f"parser oracles ({'; '.join(oracle_versions().values())}): {len(read)} raw completions, "
            f"{sum(bool(r.parsers) for r in read)} read differently, {sum(_unread(r) for r in read)} not "
            "read (evidence, not verdicts)",
            highlight=False,
            markup=False,
        )
        readers = Counter(_read_as(r.oracles) for r in read if r.oracles is not None)
        console.print(
            visible("  read as: " + "; ".join(f"{who} {n}" for who, n in sorted(readers.items()))),
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if counts:
        t = Table("verdict code", "exchanges")
        for code, n in counts.most_common():
            t.add_row(Text(visible(code)), str(n))
        console.print(t)
    for r in bad[:20]:
        what = r.problem or "; ".join(f"{v.code}: {v.detail}" for v in r.verdicts) or _oracle_note(r)
        # What the server answered (response ids, details quoting its content) is made visible
        # before it prints: an ESC or bidi override in it would otherwise drive the terminal.
        console.print(visible(f"{r.where} {r.response_id or ''}: {what}"), highlight=False, markup=False)
        if (r.problem or r.verdicts) and (r.parsers or _unread(r)):  # the oracle's word beside the verdicts
            console.print(visible(f"  {_oracle_note(r)}"), highlight=False, markup=False)
        for d in r.parsers:
            console.print(visible(f"  {d.describe()}"), highlight=False, markup=False)


def _unread(r: AuditResult) -> bool:
    return r.oracles is not None and r.oracles.not_read is not None


def _read_as(oracles: OracleReadings) -> str:
    """'deepseek-v4 read by deepseek-recipe', 'qwen not read'."""
    return f"{family_read_as(oracles)} {'not read' if oracles.not_read is not None else 'read by ' + first_reader(oracles)}"


def _oracle_note(r: AuditResult) -> str:
    """What the oracle made of a line: whose readings of it were apart, or why nothing read it."""
    if r.oracles is None:
        return "parsers disagree"
    if r.oracles.not_read is not None:
        return f"raw completion not read ({family_read_as(r.oracles)}): {r.oracles.not_read}"
    return f"parsers disagree ({_read_as(r.oracles)})"


def render_reference(results: list[AuditResult], reference: ReferenceAnswers, console: Console) -> None:
    """What was compared with the reference run, and where each session first parted from it."""
    mismatches = reference_mismatches(results)
    parted = sum(r.reference_parted for r in results)
    console.print(
        visible(
            f"reference {reference.run_dir}: {sum(r.reference_compared for r in results)} completed "
            f"greedy turns sent a request the reference had answered; {len(mismatches)} got a different "
            f"answer ({REFERENCE_CODE})" + (f"; {parted} later turns of parted sessions not compared" if parted else "")
        ),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    if reference.conflicts:
        console.print(
            f"the reference run itself answered {reference.conflicts} request(s) two ways: its server "
            "was not deterministic there",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    for r, v in mismatches:
        console.print(
            visible(f"  session {r.session} first parts at turn {r.turn} ({v.where}): {v.detail}"),
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def write_results(results: list[AuditResult], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in results:
            f.write(
                json.dumps(
                    {
                        "line": r.line,
                        "response_id": r.response_id,
                        "problem": r.problem,
                        "session": r.session,
                        "turn": r.turn,
                        "summary_only": r.summary_only,
                        "reference_compared": r.reference_compared,
                        "reference_parted": r.reference_parted,
                        "verdicts": [v.to_json() for v in r.verdicts],
                        "check_errors": r.check_errors,
                        "oracles": r.oracles.to_json() if r.oracles else None,
                        "parsers": [d.describe() for d in r.parsers],
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )
