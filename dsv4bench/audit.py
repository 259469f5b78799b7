"""`dsv4bench audit FILE`: the checkers over traffic recorded elsewhere (production logs).

Each JSONL line is one exchange, in any of these shapes:
  {"request": {chat body}, "response": {chat.completion body}}      a non-streamed pair
  {"request": {chat body}, "sse": "data: {...}\\n\\ndata: [DONE]\\n\\n"}  a captured stream (text)
  {"request": {chat body}, "sse": ["data: {...}", "data: [DONE]"]}    ... or its lines
  a dsv4bench turns.jsonl record (request.body + raw_sse)             re-audit a run
Optional fields: "http_status" (>= 400 makes it an http_error), "raw_completion" (the
--raw oracle's text; a turns.jsonl record keeps it in "oracles"), "tools" (when the request is
not recorded). With a raw completion, the parsers' view (checks/parser_view.py) is printed
beside the verdicts: where the server, deepseek-recipe and SGLang read it differently.
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

from .checks import run_checks
from .checks.parser_view import Disagreement, disagreements, oracle_versions, read_oracles
from .codes import AVAILABILITY_CODES, CORRUPTION_CODES
from .records import AssembledResponse, OracleReadings, TurnContext, TurnStatus, Verdict
from .sse import DeltaAssembler, assemble_completion

# Without the offered tools, these two cannot be judged and are left out.
_NEED_TOOLS = ("unknown_tool", "schema_violation")


class AuditError(Exception):
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
    resp = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=str(sse).encode())
    return [ev.data for ev in EventSource(resp).iter_sse()]


def _offered_tools(rec: dict[str, Any], req: dict[str, Any]) -> dict[str, dict[str, Any]]:
    src = rec.get("tools") if isinstance(rec.get("tools"), list) else req.get("tools")
    if not isinstance(src, list):
        return {}
    tools = {}
    for t in src:
        fn = (t.get("function") or t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            tools[fn["name"]] = fn.get("parameters") or {}
    return tools


def exchange_context(rec: dict[str, Any]) -> TurnContext:
    """Build the checkers' view of one recorded exchange. Raises ValueError on an unusable line."""
    req = rec.get("request") if isinstance(rec.get("request"), dict) else {}
    is_turn_record = "session" in rec and "status" in rec  # a dsv4bench turns.jsonl line
    if isinstance(req.get("body"), dict):
        req = req["body"]
    kept = rec.get("oracles")  # a turns.jsonl record keeps its raw completion there
    raw = rec.get("raw_completion", kept.get("raw_completion") if isinstance(kept, dict) else None)
    ctx = TurnContext(response=None, tools=_offered_tools(rec, req), stream=bool(req.get("stream", True)),
                      max_tokens=req.get("max_tokens"), raw_completion=raw)
    status_code = rec.get("http_status")
    if is_turn_record and rec["status"] != TurnStatus.OK.value:
        ctx.status, ctx.http_status = TurnStatus(rec["status"]), status_code
        ctx.error, ctx.error_kind = rec.get("error"), rec.get("error_kind")
        return ctx
    if isinstance(status_code, int) and status_code >= 400:
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


def audit_records(records: list[tuple[int, Any]]) -> list[AuditResult]:
    results: list[AuditResult] = []
    for line, rec in records:
        if not isinstance(rec, dict):
            results.append(AuditResult(line, None, problem="not a JSON object" if rec is not None
                                       else "not JSON (torn, binary or not UTF-8)"))
            continue
        try:
            ctx = exchange_context(rec)
        except ValueError as e:
            results.append(AuditResult(line, None, problem=str(e)))
            continue
        verdicts, check_errors = run_checks(ctx)
        if not ctx.tools:
            verdicts = [v for v in verdicts if v.code not in _NEED_TOOLS]
        rid = ctx.response.response_id if isinstance(ctx.response, AssembledResponse) else None
        oracles = read_oracles(ctx)
        parsers = disagreements(ctx.response, oracles) if oracles is not None and ctx.response else []
        results.append(AuditResult(line, rid, verdicts, check_errors, oracles=oracles, parsers=parsers))
    return results


def audit_file(path: Path) -> list[AuditResult]:
    """Read and check every exchange of a JSONL file; unreadable lines are reported as results
    (`problem`), and a file with no readable exchange at all is an AuditError."""
    if path.is_dir():
        raise AuditError(f"{path} is a folder; give a JSONL file (a run's turns.jsonl, say)")
    if not path.exists():
        raise AuditError(f"{path}: no such file")
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
    results = audit_records(records)
    if not any(r.problem is None for r in results):
        raise AuditError(f"{path} holds no readable exchange ({len(results)} lines, none a JSON exchange): "
                         "is it a JSONL capture?")
    return results


def unreadable_summary(results: list[AuditResult]) -> str | None:
    """One line on the lines that could not be audited, or None when every line was."""
    bad = [r for r in results if r.problem is not None]
    if not bad:
        return None
    return (f"{len(bad)} of {len(results)} lines could not be audited (first: line {bad[0].line}, "
            f"{bad[0].problem}); a torn or mixed file?")


def render_audit(results: list[AuditResult], console: Console) -> None:
    counts: Counter[str] = Counter(code for r in results for code in {v.code for v in r.verdicts})
    bad = [r for r in results if r.verdicts or r.problem or r.parsers]
    console.print(f"{len(results)} exchanges, {sum(r.corrupt for r in results)} corrupt, "
                  f"{sum(r.errors for r in results)} errors, {sum(r.problem is not None for r in results)} unreadable")
    read = [r for r in results if r.oracles is not None]
    if read:
        console.print(f"parser oracles ({'; '.join(oracle_versions().values())}): {len(read)} raw completions, "
                      f"{sum(bool(r.parsers) for r in read)} read differently (evidence, not verdicts)",
                      highlight=False, markup=False)
    if counts:
        t = Table("verdict code", "exchanges")
        for code, n in counts.most_common():
            t.add_row(code, str(n))
        console.print(t)
    for r in bad[:20]:
        what = r.problem or "; ".join(f"{v.code}: {v.detail}" for v in r.verdicts) or "parsers disagree"
        console.print(f"line {r.line} {r.response_id or ''}: {what}", highlight=False, markup=False)
        for d in r.parsers:
            console.print(f"  {d.describe()}", highlight=False, markup=False)


def write_results(results: list[AuditResult], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps({"line": r.line, "response_id": r.response_id, "problem": r.problem,
                                "verdicts": [v.to_json() for v in r.verdicts], "check_errors": r.check_errors,
                                "oracles": r.oracles.to_json() if r.oracles else None,
                                "parsers": [d.describe() for d in r.parsers]},
                               ensure_ascii=False) + "\n")
