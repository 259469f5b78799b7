"""The incident report as markdown: verdict first, then where, how often, examples, how to reproduce.

Pure: takes the history, its summary and the plot paths, returns text. Every section tolerates
missing data (an empty or partial history, a run.json without config or server facts).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from dsv4bench.checks.parser_view import (
    NOT_READ,
    RECIPE,
    SERVER,
    SGLANG_STREAM,
    SGLANG_WHOLE,
    disagreements,
    family_read_as,
    first_reader,
    sglang_like,
)
from dsv4bench.history.codes import EVIDENCE_CODES, TURN_CODES, code_class, meaning
from dsv4bench.servers.dialect import stage
from dsv4bench.servers.discovery import NOT_REPORTED, SETTINGS, Deployment, Endpoint, show_setting
from dsv4bench.families import BY_NAME
from dsv4bench.history.run_folder import History
from dsv4bench.checks.oracle import NOT_OFFERED_EVENT
from dsv4bench.history.records import OracleReadings, TurnRecord, Verdict
from dsv4bench.report.counting import counts_code, run_window
from dsv4bench.report.blocks import (
    fmt_int,
    plural,
    fmt_pct,
    fmt_rate,
    fmt_seconds,
    inline,
    cell,
    code_span,
    table,
    fence,
)
from dsv4bench.report.cache_section import cache_section, coverage_section
from dsv4bench.report.coverage import WEDGES_NOT_CHECKED, short_gaps
from dsv4bench.report.slo_section import slo_section
from dsv4bench.report.triage_section import triage_section
from dsv4bench.report.aftermath import next_steps_section, onset_section, persistence_section

EXAMPLES_PER_CODE = 3
ORACLE_EXAMPLES = 5  # turns shown whose parsers' readings disagree
EXCERPT_CHARS = 400
DEPLOYMENT_COLUMNS = 8  # servers shown side by side in the header; run.json has every one
# Facts from SGLang's /get_server_info worth a line in an incident report, in display order.
SERVER_FACTS: tuple[str, ...] = (
    "version",
    "model_path",
    "served_model_name",
    "disaggregation_mode",
    "tp_size",
    "dp_size",
    "ep_size",
    "pp_size",
    "enable_dp_attention",
    "attention_backend",
    "kv_cache_dtype",
    "enable_hierarchical_cache",
    "hicache_ratio",
    "max_running_requests",
    "chunked_prefill_size",
    "speculative_algorithm",
    "tool_call_parser",
    "reasoning_parser",
)
# Where in the raw stream a code's evidence usually is: DSML markup wherever it first shows,
# cut-offs and protocol faults at the end; anything else from the start.
_DSML_NEEDLE = re.compile(r"DSML|invoke name|function_calls|tool_calls>")
_TAIL_CODES = frozenset({"truncated", "stream_protocol", "degenerate_repetition"})


def headline(summary: dict[str, Any], killer: str = "the nemesis") -> str:
    """The verdict and its key figures in one line; `killer`: what cut the killed turns short."""
    t = summary["turns"]
    verdict = summary["verdict"]
    calls, bad = summary["tool_calls"], summary["bad_tool_calls"]
    corrupt = (
        f"{fmt_int(t['corrupt'])} of {fmt_int(t['ok'])} completed turns ({fmt_pct(t['corrupt'], t['ok'])}) corrupt"
    )
    if t["total"] == 0:
        figures = "no turns recorded; nothing was judged"
    elif verdict == "WEDGE":
        wedged = [ep for ep, found in summary["wedge"].items() if found["codes"]]
        figures = f"{len(wedged)} of {len(summary['wedge'])} endpoints wedged ({inline(', '.join(wedged))}); {corrupt}"
    elif verdict == "INCOMPLETE" and not (summary.get("history") or {}).get("gaps") and summary.get("unjudged"):
        figures = (
            f"{inline(summary['unjudged'][0], 200)}; no corruption found in the "
            f"{fmt_int(t['ok'])} completed turns, but what those checkers check is unknown there"
        )
    elif verdict == "INCOMPLETE":
        gaps = (summary.get("history") or {}).get("gaps") or ["turn records were lost"]
        figures = (
            f"the history lost turn records ({inline(gaps[0], 160)}); no corruption in the "
            f"{fmt_int(t['ok'])} completed turns recorded, but what was lost was never judged"
        )
    elif verdict == "CORRUPTION":
        figures = f"{corrupt}; {fmt_int(bad)} of {fmt_int(calls)} tool calls bad"
    elif verdict == "POISONED":
        why = (summary.get("persistence") or {}).get("why") or "fresh sessions corrupted after the load"
        figures = f"{inline(why, 200)}; during the load {corrupt}"
    elif verdict == "ERRORS":
        figures = (
            f"{fmt_int(t['error'])} of {fmt_int(t['total'])} turns failed (error or timeout); "
            f"no corruption in {fmt_int(t['ok'])} completed turns"
        )
    else:
        figures = f"{corrupt}; {fmt_int(calls)} tool calls, none bad"
    extra = f"; {plural(t['killed'], 'turn')} killed by {killer} (not judged)" if t["killed"] else ""
    qualified = f" ({'; '.join(q)})" if (q := qualifiers(summary)) else ""
    return f"**{verdict}**{qualified} — {figures}{extra}."


def qualifiers(summary: dict[str, Any]) -> list[str]:
    """What limits the verdict, said beside it: a run that did not finish; beside a verdict that
    claims no wedge (CLEAN, ERRORS), queues that were never judged; and beside CLEAN, what else
    the run could not have found (summary.json's `coverage`, wedges said once)."""
    out = []
    if summary.get("partial"):
        out.append("partial: run did not finish")
    if summary["verdict"] in ("CLEAN", "ERRORS") and summary.get("wedge_checked") is False:
        out.append(f"wedge not checked: {summary.get('wedge_unchecked_reason') or 'no metrics scraped'}")
    if summary["verdict"] == "CLEAN" and (gaps := short_gaps(summary.get("coverage") or [], (WEDGES_NOT_CHECKED,))):
        out.append(gaps)
    return out


def _notes(summary: dict[str, Any]) -> list[str]:
    notes = []
    gaps = (summary.get("history") or {}).get("gaps") or []
    if gaps:
        notes.append(
            "> **Incomplete history:** the harness lost turn records, so this report cannot say that "
            "nothing else happened: " + "; ".join(inline(g, 200) for g in gaps) + "."
        )
    if summary["partial"]:
        notes.append(
            "> **Partial history (run did not finish):** no `run_end` event, so the harness stopped "
            "mid-run (killed?). The figures cover what was recorded before it stopped."
        )
    if summary["skipped_lines"]:
        notes.append(
            f"> {fmt_int(summary['skipped_lines'])} unreadable history line(s) skipped "
            "(a torn last line is expected after SIGKILL)."
        )
    notes += _reference_notes(summary.get("reference"))
    notes += harness_clock_notes(summary.get("harness"))
    if summary["check_errors"]:
        notes.append(
            f"> A checker raised on {fmt_int(summary['check_errors'])} turn(s): "
            "their verdicts are incomplete (unknown, not clean)."
        )
    return notes


def harness_clock_notes(clock: dict[str, Any] | None) -> list[str]:
    """A note when the harness's own loop stalled: which timings it touched, and that no
    deadline counted it. Nothing for a run whose loop never stood still."""
    if not clock or not clock.get("stalls"):
        return []
    failed = clock.get("failed_stalled") or 0
    tail = (
        f" {plural(failed, 'turn')} of those failed: weigh them knowing that the harness stopped reading meanwhile."
        if failed
        else ""
    )
    return [
        f"> **The harness itself stalled:** its event loop stood still {plural(clock['stalls'], 'time')} "
        f"(longest {fmt_seconds(clock.get('longest_stall_s'))}, {fmt_seconds(clock.get('stalled_s'))} in all; "
        f"loop lag p50 / p99 {clock.get('lag_p50_ms')} / {clock.get('lag_p99_ms')} ms). No turn's deadline "
        f"counted those stalls, but the timings of the {plural(clock.get('turns_stalled') or 0, 'turn')} in "
        f"flight then may be late by up to {fmt_seconds((clock.get('turn_stall_max_ms') or 0) / 1e3)} "
        f"(`harness_stall_ms` in turns.jsonl).{tail}"
    ]


def _reference_notes(ref: dict[str, Any] | None) -> list[str]:
    """--reference: what was compared with which run, and when the comparison says little."""
    if not ref:
        return []
    notes = [
        f"> **Reference run** {code_span(ref['run_dir'], 300)}: {fmt_int(ref['compared'])} completed turns sent a request "
        f"the reference had answered; {fmt_int(ref['mismatched'])} got a different answer "
        "(`reference_mismatch`). Sessions part ways at their first mismatch, so later turns are not compared."
    ]
    if not ref["compared"]:
        notes.append(
            "> No request matched the reference run's: was it made with the same `--seed`, `--scenario`, "
            "`--max-tokens`, `--thinking` and `--temperature 0`?"
        )
    if ref.get("conflicts"):
        notes.append(
            f"> The reference run itself answered {fmt_int(ref['conflicts'])} request(s) two ways: its "
            "server was not deterministic, so a mismatch here may be noise, not wrong state."
        )
    return notes


# How a session ended (session_end events), in words.
_ENDED_BY = {
    "final": "final answer",
    "max_turns": "turn limit",
    "context_full": "context full (next turn would not fit)",
    "corrupt": "corrupt turn",
    "error": "error",
    "killed": "killed",
    "duration": "run's time up",
    "cancelled": "cancelled",
}


def _run_section(history: History, summary: dict[str, Any]) -> list[str]:
    start, _ = run_window(history)
    sessions = summary["sessions"]
    facts = [
        ["started", datetime.fromtimestamp(start / 1e9, timezone.utc).isoformat(timespec="seconds") if start else "–"],
        ["duration", fmt_seconds(summary["duration_s"])],
        ["sessions", f"{fmt_int(sessions['count'])} ({fmt_int(sessions['finished'])} finished)"],
        [
            "sessions ended by",
            cell(", ".join(f"{_ENDED_BY.get(k, k)} {fmt_int(v)}" for k, v in sessions["ended_by"].items()) or "–", 300),
        ],
        ["turns", turns_phrase(summary["turns"])],
        ["tool calls", fmt_int(summary["tool_calls"])],
    ]
    if summary["events"]:
        facts.append(["events", cell(", ".join(f"{k} {v}" for k, v in summary["events"].items()), 600)])
    config = history.run.get("config")
    if isinstance(config, dict):
        facts += [[code_span(k), cell(v)] for k, v in config.items()]
    return ["## Run", "", table(["setting", "value"], facts), "", TURN_COUNTS_LEGEND]


# What each count of summary.json's `turns` means; the report says it beside every table of them.
TURN_COUNTS_LEGEND = (
    "Turns: **ok** = a complete response arrived, whatever the checkers found in it (corrupt "
    "turns are ok turns too); **good** = ok, judged by every checker and not corrupt; "
    "**corrupt** = ok with a corruption code; **killed** = cancelled by the nemesis, not judged; "
    "**error** = HTTP error, connection failure or timeout. total = ok + killed + error."
)


def turns_phrase(t: dict[str, int]) -> str:
    """'64 total: 3 good, 24 ok (21 corrupt), 0 killed, 40 error'."""
    good = f"{fmt_int(t['good'])} good, " if "good" in t else ""
    return (
        f"{fmt_int(t['total'])} total: {good}{fmt_int(t['ok'])} ok ({fmt_int(t['corrupt'])} corrupt), "
        f"{fmt_int(t['killed'])} killed, {fmt_int(t['error'])} error"
    )


def _dialect_words(d: Any) -> str:
    """{"name": "sglang", "generation": "bootstrap"} -> 'sglang (bootstrap)'."""
    if not isinstance(d, dict) or not d.get("name"):
        return "names unknown"
    return f"{d['name']} ({d['generation']})" if d.get("generation") else str(d["name"])


def _endpoint_head(ep: Endpoint) -> str:
    return f"{ep.role} {code_span(urlsplit(ep.root).netloc or ep.root)}"


def _metrics_cell(ep: Endpoint) -> str:
    if ep.metrics_url:
        return cell(f"/metrics, {_dialect_words(ep.metrics_dialect)}")
    return "not found at its root" if ep.answered or ep.listed_as else "–"


def _setting_cell(ep: Endpoint, key: str) -> str:
    shown = dict(ep.shown_settings())
    return cell(show_setting(key, shown[key])) if key in shown else "–"


def deployment_section(history: History) -> list[str]:
    """The servers discovery found (discovery.py), side by side: role, metrics, and the settings
    each reported under SGLang's server_args names. Nothing for a run that recorded none."""
    server = history.run.get("server")
    dep = Deployment.from_dict(server.get("deployment")) if isinstance(server, dict) else None
    if dep is None or not dep.endpoints:
        return []
    eps = dep.endpoints[:DEPLOYMENT_COLUMNS]
    via = f", from {', '.join(code_span(v) for v in dep.found_via)} `/workers`" if dep.found_via else ""
    rows = [["metrics", *(_metrics_cell(e) for e in eps)]]
    if any(e.listed_as for e in eps):
        rows.append(
            [
                "router's list",
                *(
                    cell(
                        f"{e.listed_as}{', healthy' if e.listed_healthy else ''}"
                        f"{', not healthy' if e.listed_healthy is False else ''}"
                    )
                    if e.listed_as
                    else "–"
                    for e in eps
                ),
            ]
        )
    shown = [k for k in SETTINGS if any(k in dict(e.shown_settings()) for e in eps)]
    rows += [[code_span(k), *(_setting_cell(e, k) for e in eps)] for k in shown]
    if not all(e.answered for e in eps):
        rows.append(
            ["answered", *("yes" if e.answered else cell("no: " + "; ".join(e.problems[:2]), 160) for e in eps)]
        )
    out = [
        f"**Deployment** ({plural(len(dep.endpoints), 'server')}{via}):",
        "",
        table(["", *(_endpoint_head(e) for e in eps)], rows),
        "",
        f"Settings as each server reported them (`/get_server_info`), by SGLang's server_args names; "
        f"*{NOT_REPORTED}*: the server did not say; –: not its role's, or no answer.",
    ]
    if len(dep.endpoints) > len(eps):
        out[-1] += f" {len(dep.endpoints) - len(eps)} more servers are in run.json."
    config = history.run.get("config")
    scraped = config.get("metrics") if isinstance(config, dict) else None
    if isinstance(scraped, list) and scraped:
        out[-1] += (
            " Scraped during the run: " + ", ".join(code_span(m, 200) for m in scraped if isinstance(m, str)) + "."
        )
    return out


def _model_ids(models: Any) -> list[str]:
    """Model ids from a /v1/models body, a list of such entries, or a list of names."""
    entries = models.get("data", []) if isinstance(models, dict) else models
    if not isinstance(entries, list):
        return []
    return [str(m.get("id")) if isinstance(m, dict) else str(m) for m in entries]


def _server_section(history: History) -> list[str]:
    server = history.run.get("server")
    if not isinstance(server, dict) or not server:
        return ["## Server", "", "No server facts recorded."]
    rows = []
    ids = _model_ids(server.get("models"))
    if ids:
        rows.append(["models", cell(", ".join(ids))])
    info = server.get("server_info")
    if isinstance(info, dict):
        rows += [[code_span(k), cell(info[k])] for k in SERVER_FACTS if k in info]
    if isinstance(server.get("metrics_dialect"), dict):
        rows.append(["metrics dialect", cell(_dialect_words(server["metrics_dialect"]))])
    family = _family_words(history.run.get("model_family"))
    if family:
        rows.append(["model family checked", family])
    if not rows:
        return ["## Server", "", "No model ids or known server facts recorded."]
    return ["## Server", "", table(["fact", "value"], rows)]


def _family_words(chosen: Any) -> str | None:
    """Whose markup the run checked and why (run.json's model_family), or None for a run that did not say."""
    if not isinstance(chosen, dict):
        return None
    family, source = chosen.get("family"), chosen.get("from")
    if family == "all":
        return "every family (`--family all`)"
    if isinstance(family, str) and family:
        return f"{code_span(family)} (from {cell(source) if isinstance(source, str) else 'the run'})"
    return "each turn's own, from its answer's model name; every family where that names none"


def key_hosts_lines(history: History) -> list[str]:
    """Which hosts the API key went to, and the servers found behind a router that were asked
    without it (observe.KEY_HOSTS_EVENT); nothing for a run without a key. Host names come from a
    router's /workers, so each is shown as inert code."""
    event = next((e for e in reversed(history.events) if e.get("kind") == "api_key_hosts"), None)
    if event is None:
        return []

    def hosts(key: str) -> str:
        listed = event.get(key)
        names = [h for h in listed if isinstance(h, str)] if isinstance(listed, list) else []
        return ", ".join(code_span(h) for h in names) or "none"

    line = f"API key sent to: {hosts('key_sent_to')}"
    if event.get("key_withheld_from"):
        line += (
            f"; not sent to {hosts('key_withheld_from')} (found behind a router, not named; "
            "`--key-to-workers` sends it there too)"
        )
    return ["", line + "."]


def _codes_in_order(summary: dict[str, Any]) -> list[str]:
    """Known turn-level codes in their canonical order, then any others that fired."""
    known = list(TURN_CODES)
    extra = [c for c, n in summary["counts"].items() if c not in known and n]
    return [c for c in known if c not in EVIDENCE_CODES or summary["counts"].get(c)] + extra


def _codes_section(summary: dict[str, Any]) -> list[str]:
    rows = []
    for code in _codes_in_order(summary):
        rate = summary["rates"].get(code, {})
        rows.append(
            [
                code_span(code),
                code_class(code),
                fmt_int(summary["counts"].get(code, 0)),
                fmt_rate(rate.get("per_turn")),
                fmt_rate(rate.get("per_tool_call")),
                meaning(code),
            ]
        )
    note = (
        "Turns carrying each code. Corruption rates are per completed turn and per tool call; "
        "availability rates per attempted (not killed) turn."
    )
    return [
        "## Verdict codes",
        "",
        note,
        "",
        table(["code", "class", "turns", "per turn", "per tool call", "meaning"], rows),
    ]


def _breakdown_section(title: str, key: str, groups: dict[str, dict[str, int]]) -> list[str]:
    if not groups:
        return [f"## {title}", "", "No turns."]
    rows = [
        [
            cell(k),
            fmt_int(g["total"]),
            fmt_int(g["ok"]),
            fmt_int(g.get("good", 0)),
            fmt_int(g["corrupt"]),
            fmt_pct(g["corrupt"], g["ok"]),
            fmt_int(g["killed"]),
            fmt_int(g["error"]),
        ]
        for k, g in groups.items()
    ]
    header = [key, "turns", "ok", "good", "corrupt", "corrupt / ok", "killed", "error"]
    return [
        f"## {title}",
        "",
        "ok: completed, corrupt or not; good: ok and not corrupt (see Run).",
        "",
        table(header, rows),
    ]


def variant_section(by_variant: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Every code by the request's variant (--request-mix, or whatever a proxied agent sent):
    only where some dimension took more than one value, else it would repeat the totals."""
    if not any(len(values) > 1 for values in by_variant.values()):
        return []
    fired = [c for c in TURN_CODES if any(c in g["codes"] for values in by_variant.values() for g in values.values())]
    rows = [
        [
            cell(dim),
            code_span(value),
            fmt_int(g["total"]),
            fmt_int(g["ok"]),
            fmt_pct(g["corrupt"], g["ok"]),
            *(fmt_int(g["codes"].get(c, 0)) for c in fired),
        ]
        for dim, values in by_variant.items()
        if len(values) > 1
        for value, g in values.items()
    ]
    note = (
        "Turns by what their request asked (a dimension every turn asked alike is left out); each code "
        "column counts the turns carrying it."
    )
    return [
        "## Codes by request variant",
        "",
        note,
        "",
        table(["dimension", "value", "turns", "ok", "corrupt / ok", *(code_span(c) for c in fired)], rows),
    ]


def excerpt(turn: TurnRecord, verdict: Verdict, limit: int = EXCERPT_CHARS) -> str:
    """A few hundred characters of evidence: raw SSE lines where kept, else the assembled text."""
    if turn.raw_sse:
        lines = turn.raw_sse
        if verdict.code in _TAIL_CODES:
            text = "\n".join(lines)
            return text if len(text) <= limit else "…" + text[-limit:]
        first = 0
        if verdict.code.startswith("dsml_"):
            first = next((i for i, ln in enumerate(lines) if _DSML_NEEDLE.search(ln)), 0)
        text = "\n".join(lines[max(0, first - 1) :])
        prefix = f"… ({first - 1} earlier lines)\n" if first > 1 else ""
    else:
        resp = turn.response
        m = re.match(r"tool_calls\[(\d+)\]", verdict.where)
        calls = resp.tool_calls if resp else []
        if m and int(m.group(1)) < len(calls):
            text = calls[int(m.group(1))].arguments or "(empty arguments)"
        elif resp:
            text = resp.reasoning if verdict.code == "dsml_leak_reasoning" else resp.content
            text = text or resp.content or resp.reasoning or "(empty response)"
        else:
            text = turn.error or "(no response)"
        prefix = ""
    return prefix + (text if len(text) <= limit else text[:limit] + "…")


def _examples_section(history: History, summary: dict[str, Any]) -> list[str]:
    out = ["## Examples", ""]
    fired = [c for c in _codes_in_order(summary) if summary["counts"].get(c)]
    if not fired:
        return out + ["No verdict codes fired."]
    for code in fired:
        out += [f"### {code_span(code)}", ""]
        shown = 0
        for turn in history.turns:
            v = next((v for v in turn.verdicts if v.code == code), None)
            if v is None or not counts_code(turn, code):
                continue
            where = f", at {code_span(v.where)}" if v.where else ""
            out += [
                f"- session {code_span(turn.session)}, turn {turn.turn} ({inline(turn.scenario)}), "
                f"response id {code_span(turn.response_id or '–')}{where}: {inline(v.detail)}",
                "",
                fence(excerpt(turn, v)),
                "",
            ]
            shown += 1
            if shown == EXAMPLES_PER_CODE:
                break
    return out[:-1]  # drop the blank line after the last example; sections are joined by one


# The pairs of readings the report counts apart; `like` stands for SGLang's reading made the way
# the server answered (streamed or whole), the one that server would have sent.
_ORACLE_PAIRS = ((SERVER, RECIPE), (SERVER, "like"), (RECIPE, "like"), (SGLANG_STREAM, SGLANG_WHOLE))
ORACLES_NOTE = (
    "Evidence, not verdicts: only each turn's reader against the server is counted "
    "(`parser_disagreement`: deepseek-recipe for DeepSeek-V4, else SGLang's reading with the family's "
    "detectors made the way the server answered). SGLang against the server: that server's parser is "
    "not SGLang's detector for the family as installed here, or its streaming changed the answer. "
    "deepseek-recipe against SGLang, or SGLang streamed against SGLang whole: a finding about the "
    'parsers, whatever the server sent. A turn no reader could read is "not read": the oracle could '
    "not judge it, never a disagreement."
)


def _sglang_detectors(family: str | None) -> str:
    """SGLang's detectors for a family, as the registry names them: `qwen25` / `qwen3`."""
    f = BY_NAME.get(family) if isinstance(family, str) else None
    if f is None or not f.sglang_parsers:
        return "–"
    return " / ".join(code_span(p) for p in (f.sglang_parsers[0], f.reasoning_parser) if p)


def _not_offered_lines(history: History) -> list[str]:
    """One line per family and server the raw oracle was not offered for (NOT_OFFERED_EVENT)."""
    said = {
        (str(e.get("family")), str(e.get("reason") or "no /tokenize"))
        for e in history.events
        if e.get("kind") == NOT_OFFERED_EVENT
    }
    return [
        f"- raw oracle not offered for family {code_span(family)} on this server ({inline(reason)}): its turns "
        "were judged without it."
        for family, reason in sorted(said)
    ]


def _readers_table(kept: list[tuple[TurnRecord, OracleReadings]]) -> str:
    """Turns kept, by the family read as and its reader: how many read, how many not."""
    rows: dict[tuple[str, str], list[int]] = {}
    for _, oracles in kept:
        reader = oracles.reader if oracles.reader and oracles.not_read is None else NOT_READ
        n = rows.setdefault((family_read_as(oracles), reader), [0, 0])
        n[oracles.not_read is not None] += 1
    by_family = {family_read_as(o): o.family for _, o in kept}
    return table(
        ["family read as", "reader", "SGLang's detectors", "turns whose readings disagree", "turns not read"],
        [
            [cell(family), cell(reader), _sglang_detectors(by_family[family]), fmt_int(read), fmt_int(unread)]
            for (family, reader), (read, unread) in sorted(rows.items())
        ],
    )


def _read_as(oracles: OracleReadings) -> str:
    """'deepseek-v4 read by deepseek-recipe', 'qwen not read'."""
    if oracles.not_read is not None:
        return f"{inline(family_read_as(oracles))} not read"
    return f"{inline(family_read_as(oracles))} read by {inline(first_reader(oracles))}"


def _oracles_section(history: History) -> list[str]:
    """--raw: each kept turn's family and reader, the turns no reader could read, and where the
    server's answer and the parsers' readings of its raw completion disagree."""
    versions = history.run.get("oracles")
    not_offered = _not_offered_lines(history)
    kept = [(t, t.oracles) for t in history.turns if t.oracles and t.response]
    if not isinstance(versions, dict) and not kept and not not_offered:
        return []
    out = ["## Parser oracles", ""]
    if isinstance(versions, dict):
        out += [
            "Each turn's raw completion is read by its family's reader (deepseek-recipe for DeepSeek-V4, else "
            "SGLang's detectors for the family) and by SGLang's detectors streamed and whole, beside the "
            "server's answer; readers here: " + "; ".join(inline(v) for v in versions.values()) + ".",
            "",
        ]
    if not_offered:
        out += [*not_offered, ""]
    out.append(ORACLES_NOTE)
    if not kept:
        return out + ["", "No turn's readings disagreed."]
    read = [
        (t, o, disagreements(t.response, o), sglang_like(t.response))
        for t, o in kept
        if o.not_read is None and t.response is not None  # kept holds answered turns only: said for mypy
    ]
    unread = [(t, o) for t, o in kept if o.not_read is not None]
    out += ["", _readers_table(kept)]
    if read:
        rows = [
            [
                cell(f"{a}, {'SGLang as the server answered' if b == 'like' else b}"),
                fmt_int(sum(any(d.apart(a, like if b == "like" else b) for d in found) for _, _, found, like in read)),
            ]
            for a, b in _ORACLE_PAIRS
        ]
        out += ["", table(["readings apart", "turns"], rows)]
    if unread:
        out += [
            "",
            f"Not read: {plural(len(unread), 'turn')} no reader could read (the oracle could not judge "
            "them; never a disagreement):",
            *(
                f"- session {code_span(t.session)}, turn {t.turn} ({_read_as(o)}): {inline(o.not_read)}"
                for t, o in unread[:ORACLE_EXAMPLES]
            ),
        ]
        if len(unread) > ORACLE_EXAMPLES:
            out.append(f"- … and {fmt_int(len(unread) - ORACLE_EXAMPLES)} more")
    out.append("")
    for turn, oracles, found, _ in read[:ORACLE_EXAMPLES]:
        raw = oracles.raw_completion
        out += [
            f"- session {code_span(turn.session)}, turn {turn.turn} ({inline(turn.scenario)}; {_read_as(oracles)}):",
            *(f"  - {inline(d.describe())}" for d in found),
            *(f"  - SGLang: {inline(line)}" for line in oracles.sglang.log),
            "",
            fence(raw if len(raw) <= EXCERPT_CHARS else raw[:EXCERPT_CHARS] + "…"),
            "",
        ]
    return out[:-1]


def _latency_section(summary: dict[str, Any]) -> list[str]:
    names = {"ttft_s": "TTFT", "itl_s": "ITL", "e2e_s": "E2E"}
    rows = [
        [
            label,
            fmt_int(d["n"]),
            fmt_seconds(d["p50"]),
            fmt_seconds(d["p90"]),
            fmt_seconds(d["p99"]),
            fmt_seconds(d["max"]),
        ]
        for key, label in names.items()
        if (d := summary["latency"][key])
    ]
    note = f"Over completed turns; percentiles by {summary['percentile_method']} interpolation."
    return ["## Latency", "", note, "", table(["metric", "n", "p50", "p90", "p99", "max"], rows)]


WEDGE_VERDICT_WORDS = {
    "queue_stuck": "a queue stuck with no progress",
    "ghost_requests": "decoding for clients that are gone",
    "canary_timeout": "a fresh request after the drain got no answer in time",
    "health_lies": "/health said 200 while requests hung",
}


def _canary(found: dict[str, Any]) -> str:
    """The canary result: recorded as found["canary"] where the run made one, else from the codes."""
    c = found.get("canary")
    if isinstance(c, dict):
        if c.get("ok"):
            state = "ok"
        elif c.get("result") == "timeout":
            state = "hung"
        elif c.get("result") in ("error", "unreachable"):  # an answer, not a hang: not a wedge sign
            state = f"{c['result']}: {inline(str(c.get('error') or ''))}".rstrip(": ")
        else:
            state = "failed"
        latency = c.get("latency_s")
        return state + (f" in {fmt_seconds(latency)}" if isinstance(latency, (int, float)) else "")
    if "canary_timeout" in found["codes"]:
        return "hung"
    return "not run"


def _drain_window(history: History) -> str:
    """'load stopped at 40.0 s, drain window ended at 70.0 s' from the events, where recorded."""
    start, _ = run_window(history)
    at = {}
    for kind in ("load_stopped", "drain_end"):
        e = next((e for e in history.events if e.get("kind") == kind and isinstance(e.get("t_wall_ns"), int)), None)
        if e is not None and start is not None:
            at[kind] = (e["t_wall_ns"] - start) / 1e9
    parts = [f"load stopped at {at['load_stopped']:.1f} s"] if "load_stopped" in at else []
    parts += [f"drain window ended at {at['drain_end']:.1f} s"] if "drain_end" in at else []
    return "; ".join(parts) + " (seconds since run start)." if parts else ""


def _gauges_brief(gauges: dict[str, Any]) -> str:
    """The non-zero gauges by bare name (`num_decode_transfer_queue_reqs=12`), or `all 0`: the
    full names, labels included, are in the per-endpoint table below."""
    if not gauges:
        return "–"
    bare = [(k.split("{", 1)[0].split(":", 1)[-1], v) for k, v in gauges.items()]
    nonzero = [f"{name}={v:g}" if isinstance(v, (int, float)) else f"{name}={v}" for name, v in bare if v]
    return ", ".join(nonzero) or "all 0"


def wedge_unchecked_hint(summary: dict[str, Any]) -> str:
    """Why no queue was judged, and the flag that would have judged them."""
    reason = summary.get("wedge_unchecked_reason") or "no metrics scraped"
    if reason == "no --metrics endpoint":
        fix = "give `dsv4bench agents` a `--metrics URL` for each server (router, prefill, decode)"
    elif reason == "only a router was scraped":
        fix = (
            "a router's gauges count its own requests, not the queues of its workers; give `--metrics URL` "
            "for each prefill and decode (or unified) server too"
        )
    else:
        fix = "check that each `--metrics` URL answers with Prometheus text"
    return f"Wedge not checked ({reason}): no queue gauge could be judged; {fix}."


def _wedge_section(history: History, summary: dict[str, Any]) -> list[str]:
    """Verdict per endpoint, then its gauges at the end of the drain window and why it was judged."""
    out = ["## Wedge", ""]
    if not summary.get("wedge_checked", bool(history.metrics)):
        # Without samples no queue can be judged: say so, so a clean verdict is not over-read.
        out += [wedge_unchecked_hint(summary), ""]
    if not summary["wedge"]:
        return out + ["The wedge monitor recorded no endpoints."]
    rows = []
    for endpoint, found in summary["wedge"].items():
        # Codes-then-gauges first: the one-line form other tools grep for; "none" reads as healthy.
        codes = ", ".join(code_span(c) for c in found["codes"]) or "none"
        gauges = _gauges_brief(found["gauges"])
        drain = found.get("drain_s")
        drain_text = (
            fmt_seconds(drain) if isinstance(drain, (int, float)) else "did not drain" if found["gauges"] else "–"
        )
        rows.append([cell(endpoint), codes, cell(gauges, 300), drain_text, _canary(found)])
    out += [
        "Per endpoint, at the end of the drain window after load stopped. " + _drain_window(history),
        "",
        table(["endpoint", "codes", "gauges", "drain time", "canary"], rows),
    ]
    wedged = sorted({c for f in summary["wedge"].values() for c in f["codes"]})
    if wedged:
        out += [
            "",
            "Meaning: " + "; ".join(f"{code_span(c)} = {inline(WEDGE_VERDICT_WORDS.get(c, c))}" for c in wedged) + ".",
        ]
    for endpoint, found in summary["wedge"].items():
        details = [d for d in found.get("details") or [] if isinstance(d, str)]
        if not found["gauges"] and not details:
            continue
        out += ["", f"### {code_span(endpoint, 300)}", ""]
        if found["gauges"]:
            stuck = " ".join(details)
            grows = [
                [
                    code_span(k, 300),
                    stage(k) or "–",
                    f"{v:g}" if isinstance(v, (int, float)) else cell(v),
                    "**stuck**" if v and k in stuck else "",
                ]
                for k, v in found["gauges"].items()
            ]
            out += ["Gauges at the end of the drain window:", "", table(["gauge", "stage", "value", ""], grows)]
        if details:
            out += ["", *(f"- {inline(d)}" for d in details)]
    return out


def _plot_title(path: str) -> str:
    return path.rsplit("/", 1)[-1].removesuffix(".png").replace("_", " ")


def render_report(history: History, summary: dict[str, Any], plots: list[str]) -> str:
    """The markdown incident report for one run."""
    command = history.run.get("command")
    parts: list[list[str]] = [
        [
            f"# dsv4bench report: {inline(summary['run'])}",
            "",
            headline(summary, "stopping their Locust users" if "locust" in history.run else "the nemesis"),
        ],
        _notes(summary),
        deployment_section(history),
        _run_section(history, summary),
        _server_section(history) + key_hosts_lines(history),
        cache_section(summary),
        coverage_section(summary),
        _codes_section(summary),
        _breakdown_section("Corruption by turn depth", "turn", summary["by_depth"]),
        _breakdown_section("Corruption by scenario", "scenario", summary["by_scenario"]),
        variant_section(summary.get("by_variant") or {}),
        _examples_section(history, summary),
        _oracles_section(history),
        _latency_section(summary),
        slo_section(summary),
        _wedge_section(history, summary) if "wedge" in history.run or history.metrics else [],
        triage_section(summary),
        persistence_section(summary),
        onset_section(summary),
        [
            "## How to reproduce",
            "",
            fence(command, "sh") if isinstance(command, str) and command else "run.json records no command.",
        ],
        ["## Plots", "", "\n\n".join(f"![{_plot_title(p)}]({p})" for p in plots)] if plots else [],
        next_steps_section(history.run, summary),
    ]
    return "\n\n".join("\n".join(p) for p in parts if p) + "\n"
