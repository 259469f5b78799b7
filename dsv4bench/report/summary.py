"""The summary of one run: a pure function from a History to the content of summary.json.

`verdict`, `turns`, `tool_calls`, `counts` and `wedge` are a stable contract (docs/verdicts.md says
so): CI jobs and other tools read them. Everything else is an extra for the report and may grow.

`verdict` is the worst that holds of WEDGE, POISONED, CORRUPTION, INCOMPLETE, ERRORS, CLEAN.
POISONED: fresh sessions played alone after the load corrupted (run.json's `persistence`,
harness/persistence.py): corruption that outlives the load, so worse than CORRUPTION; a wedge
still wins, since a server that hangs cannot be judged by sessions. INCOMPLETE
is the harness's own failure, never the server's: the history lost turn records
(history.history_gaps), its wedge findings cannot be read (`wedge_unreadable`), or a checker
raised on a turn (`unjudged`), so no absence of a finding can be claimed; what was found (a
wedge, corruption) still wins over it.
`wedge_checked` is False when no metrics sample was scraped: then no queue was judged, and a
CLEAN says nothing about wedges.

The conventions every count follows (what counts on a turn, percentiles, the run's time axis)
are report/counting.py's, shared with the report, the plots and the Locust tab.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from dsv4bench.history.codes import ANSWER_CHANGED_CODE, CORRUPTION_CODES, EVIDENCE_CODES, REFERENCE_CODE, TURN_CODES
from dsv4bench.servers.discovery import Deployment
from dsv4bench.history.run_folder import RUN_FILE, History, history_gaps
from dsv4bench.history.records import TurnRecord, TurnStatus, is_finite_number
from dsv4bench.history.request_terms import DIMENSIONS, RequestTerms
from dsv4bench.history.verdict import RunVerdict
from dsv4bench.report.counting import (
    FAILED,
    PERCENTILE_METHOD,
    distribution,
    turn_codes,
    bad_tool_calls,
    tool_call_count,
    run_window,
    outcome_counts,
)
from dsv4bench.report.cache_summary import cache_block
from dsv4bench.report.coverage import coverage_gaps
from dsv4bench.report.onset import first_findings_block
from dsv4bench.report.slo import run_slo
from dsv4bench.report.summary_types import Summary

SUMMARY_VERSION = 1
# Worst first: the first verdict whose condition holds wins.
VERDICTS: tuple[str, ...] = tuple(v.value for v in RunVerdict)


def run_id(history: History) -> str:
    """The run's id: run.json first, then the turn records, then the folder name."""
    for key in ("run", "run_id", "id"):
        if isinstance(history.run.get(key), str) and history.run[key]:
            return history.run[key]
    if history.turns:
        return history.turns[0].run
    return history.run_dir.name


def wedge_findings(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-endpoint wedge findings from run.json, normalised to {"codes": [...], "gauges": {...}};
    findings in a shape no run writes are left out (`wedge_unreadable` names them)."""
    raw = run.get("wedge")
    if not isinstance(raw, dict):
        return {}
    return {str(ep): found for ep, v in raw.items() if (found := _finding(v)) is not None}


def _finding(found: Any) -> dict[str, Any] | None:
    """One endpoint's findings, or None where codes are not a list of strings, gauges not an
    object or details not a list. Any extra keys are kept: a later monitor may add more."""
    if not isinstance(found, dict):
        return None
    codes, gauges, details = found.get("codes") or [], found.get("gauges") or {}, found.get("details") or []
    if not (
        isinstance(codes, list)
        and all(isinstance(c, str) for c in codes)
        and isinstance(gauges, dict)
        and isinstance(details, list)
    ):
        return None
    return {**found, "codes": list(codes), "gauges": dict(gauges)}


def wedge_unreadable(run: dict[str, Any]) -> list[str]:
    """Why run.json's wedge findings cannot all be read, one line per endpoint; [] when they can
    (or when there are none). A finding that cannot be read may have been a wedge."""
    raw = run.get("wedge")
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [f"{RUN_FILE}'s wedge findings cannot be read"]
    return [f"{RUN_FILE}'s wedge findings for {ep} cannot be read" for ep, v in raw.items() if _finding(v) is None]


def _end_reason(history: History) -> str | None:
    """Why the run ended, as its last `run_end` says ("complete", "duration", "interrupted",
    ...); None without one (a killed harness) or with one of an odd shape."""
    reason = history.run_end.get("reason")
    return reason if isinstance(reason, str) else None


def unjudged(turns: list[TurnRecord]) -> list[str]:
    """Why some turns were not judged by every checker (one of them raised on the turn: our
    failure, and the code it checks is unknown there, not clean); [] when every turn was."""
    failed = [t for t in turns if t.check_errors]
    if not failed:
        return []
    first = failed[0]
    return [
        f"a checker raised on {len(failed):,} turn(s), which were not judged by every checker "
        f"(first: {first.session} turn {first.turn}, {first.check_errors[0]})"
    ]


def _grouped(turns: list[TurnRecord], key: Callable[[TurnRecord], Any]) -> dict[str, dict[str, int]]:
    groups: dict[Any, list[TurnRecord]] = {}
    for t in turns:
        groups.setdefault(key(t), []).append(t)
    # Keys are strings so that summarize(h) equals json.loads(summary.json).
    return {str(k): outcome_counts(groups[k]) for k in sorted(groups)}


def request_variant(turn: TurnRecord) -> dict[str, str] | None:
    """The variant of what the turn's request asked (request_terms.py), or None where its summary
    kept no terms (a history from before they were kept)."""
    terms = turn.request.get("terms")
    return RequestTerms.from_json(terms).variant() if isinstance(terms, dict) else None


def _by_variant(turns: list[TurnRecord]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per dimension of the request (tool_choice, ...), per value: the turns' outcome counts and
    the turns carrying each code, so "leaks only with tool_choice none" reads off one table."""
    variants = [(t, v) for t in turns if (v := request_variant(t)) is not None]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for dim in DIMENSIONS:
        groups: dict[str, list[TurnRecord]] = {}
        for t, v in variants:
            groups.setdefault(v[dim], []).append(t)
        out[dim] = {
            value: {
                **outcome_counts(g),
                "codes": {c: n for c in TURN_CODES if (n := sum(c in turn_codes(t) for t in g))},
            }
            for value, g in sorted(groups.items())
        }
    return out


def _sessions(history: History) -> dict[str, Any]:
    ids = {t.session for t in history.turns}
    ends: dict[str, str] = {}
    for e in history.events:
        if e.get("session") is None:
            continue
        ids.add(str(e["session"]))
        if e.get("kind") == "session_end":
            ends[str(e["session"])] = str(e.get("reason", ""))
    reasons = Counter(ends.values())
    return {"count": len(ids), "finished": reasons.get("final", 0), "ended_by": dict(sorted(reasons.items()))}


def _router_roots(history: History) -> set[str]:
    """Server roots that said they are a router (the role on the run's /health events)."""
    roots = set()
    for e in history.events:
        if e.get("kind") == "health" and e.get("role") == "router" and isinstance(e.get("endpoint"), str):
            roots.add(e["endpoint"].removesuffix("/health_generate").removesuffix("/health"))
    return roots


def wedge_check(history: History, wedge: dict[str, dict[str, Any]]) -> tuple[bool, str | None]:
    """(whether any queue could be judged, why not): judged when a metrics endpoint other than
    a router's was scraped at least once, or the wedge findings carry gauges."""
    scraped = {str(m.get("endpoint", "")).removesuffix("/metrics") for m in history.metrics if m.get("ok")}
    if scraped and scraped <= _router_roots(history):
        # A router's gauges count its own requests; the queues a wedge sticks in are its workers'.
        return False, "only a router was scraped"
    if scraped or any(found["gauges"] for found in wedge.values()):
        return True, None
    config = history.run.get("config")
    given = config.get("metrics") if isinstance(config, dict) else None
    if given:
        return False, "no --metrics endpoint could be scraped"
    return False, "no --metrics endpoint"


def persistence(run: dict[str, Any]) -> dict[str, Any] | None:
    """run.json's `persistence` block (harness/persistence.py) where it has the shape a run
    writes; None for a run whose check did not run."""
    block = run.get("persistence")
    return block if isinstance(block, dict) and block.get("poisoned") in (True, False, None) else None


def triage(run: dict[str, Any]) -> dict[str, Any] | None:
    """run.json's `triage` block (harness/alone.py: findings sent again alone, --recheck) where it
    has the shape a run writes; None for a run that sent nothing alone."""
    block = run.get("triage")
    if not (isinstance(block, dict) and isinstance(block.get("findings", []), list)):
        return None
    return {**block, "findings": [f for f in block.get("findings", []) if isinstance(f, dict)]}


def changed_under_load(block: dict[str, Any] | None) -> int:
    """Turns of the run whose answer sent again alone was another (answer_changed_under_load)."""
    return sum(ANSWER_CHANGED_CODE in (f.get("codes") or []) for f in (block or {}).get("findings", []))


def _verdict(
    turns: dict[str, int],
    wedge: dict[str, dict[str, Any]],
    gaps: list[str],
    not_judged: list[str],
    poisoned: bool = False,
    changed: int = 0,
) -> RunVerdict:
    if any(found["codes"] for found in wedge.values()):
        return RunVerdict.WEDGE
    if poisoned:
        return RunVerdict.POISONED
    if turns["corrupt"] or changed:  # changed: turns whose answer alone was another (--recheck)
        return RunVerdict.CORRUPTION
    if gaps or not_judged:
        return RunVerdict.INCOMPLETE
    if turns["error"]:
        return RunVerdict.ERRORS
    return RunVerdict.CLEAN


def summarize(history: History) -> dict[str, Any]:
    """The content of summary.json for one (possibly partial) history, as the JSON objects other
    tools read (Summary.to_dict(); summary_types.py says why consumers read these)."""
    return summary_of(history).to_dict()


def summary_of(history: History) -> Summary:
    """summary.json for one (possibly partial) history, typed; each block is one line below and
    one field of Summary."""
    turns = history.turns
    outcomes = outcome_counts(turns)
    wedge = wedge_findings(history.run)
    tool_calls = sum(tool_call_count(t) for t in turns)

    # Every known turn-level code appears, zero or not, so readers never miss a key.
    counts: dict[str, int] = dict.fromkeys(TURN_CODES, 0)
    for t in turns:
        for code in turn_codes(t):
            counts[code] = counts.get(code, 0) + 1
    triaged = triage(history.run)
    counts[ANSWER_CHANGED_CODE] += changed_under_load(triaged)  # findings on run turns, judged after the load

    attempted = outcomes["total"] - outcomes["killed"]
    rates: dict[str, dict[str, float | None]] = {}
    for code, n in counts.items():
        per_call = code in CORRUPTION_CODES or code in EVIDENCE_CODES
        turn_base = outcomes["ok"] if per_call else attempted
        rates[code] = {
            "per_turn": n / turn_base if turn_base else None,
            "per_tool_call": n / tool_calls if per_call and tool_calls else None,
        }

    ok = [t for t in turns if t.status is TurnStatus.OK]
    start, end = run_window(history)
    gaps = history_gaps(history) + wedge_unreadable(history.run)
    checked, unchecked_reason = wedge_check(history, wedge)
    not_judged = unjudged(turns)
    persisted = persistence(history.run)
    duration_s = (end - start) / 1e9 if start is not None and end is not None else None
    blocks: dict[str, Any] = {
        "summary_version": SUMMARY_VERSION,
        "run": run_id(history),
        "verdict": _verdict(
            outcomes, wedge, gaps, not_judged, (persisted or {}).get("poisoned") is True, counts[ANSWER_CHANGED_CODE]
        ),
        "wedge_checked": checked,
        "wedge_unchecked_reason": unchecked_reason,
        "history": {"complete": not gaps, "gaps": gaps, "finished": history.complete},
        "partial": not history.complete,
        "end_reason": _end_reason(history),
        "skipped_lines": history.skipped_lines,
        "duration_s": duration_s,
        "turns": outcomes,
        "corrupt_rate": outcomes["corrupt"] / outcomes["ok"] if outcomes["ok"] else None,
        "tool_calls": tool_calls,
        "bad_tool_calls": sum(bad_tool_calls(t) for t in turns),
        "counts": counts,
        "rates": rates,
        "check_errors": sum(bool(t.check_errors) for t in turns),
        "unjudged": not_judged,
        "sessions": _sessions(history),
        "by_depth": _grouped(turns, lambda t: t.turn),
        "by_scenario": _grouped(turns, lambda t: t.scenario),
        "by_variant": _by_variant(turns),
        "percentile_method": PERCENTILE_METHOD,
        "latency": {
            "ttft_s": distribution([x for t in ok if (x := t.timings.ttft_s) is not None]),
            "itl_s": distribution([g / 1e3 for t in ok for g in t.timings.token_gaps_ms]),
            "e2e_s": distribution([x for t in ok if (x := t.timings.e2e_s) is not None]),
        },
        "events": dict(sorted(Counter(str(e.get("kind")) for e in history.events).items())),
        "harness": harness_clock(history),
        "wedge": wedge,
        "reference": _reference(history, counts),
        "deployment": _deployment(history),
        "slo": run_slo(history.run, turns, duration_s),  # --slo: goodput over the run's duration
        "triage": triaged,  # findings sent again alone after the load, and --recheck (docs/triage.md)
        "persistence": persisted,
        "first_findings": first_findings_block(history),
        "cache": cache_block(history),  # the KV cache pressure the run reached
    }
    # What the run could not have found: read off the blocks above and the run's flags.
    blocks["coverage"] = coverage_gaps(blocks, history.run)
    return Summary.from_blocks(blocks)


def harness_clock(history: History) -> dict[str, Any] | None:
    """How late the harness's own event loop ran (the `harness_clock` event, loop/lag_clock.py), and
    the turns that stall touched: `turns_stalled` had any, `failed_stalled` of them did not
    complete. None for a run that recorded no clock (older runs, Locust)."""
    clock = next((e for e in reversed(history.events) if e.get("kind") == "harness_clock"), None)
    if clock is None:
        return None
    # Its figures only: a hand-edited event's other values would be printed as numbers.
    out = {k: v for k, v in clock.items() if k not in ("kind", "t_wall_ns", "t_ns") and is_finite_number(v)}
    stalled = [t for t in history.turns if (t.timings.harness_stall_ms or 0) > 0]
    out["turns_stalled"] = len(stalled)
    out["failed_stalled"] = sum(t.status in FAILED for t in stalled)
    out["turn_stall_max_ms"] = max((t.timings.harness_stall_ms for t in stalled), default=0.0)
    return out


def _deployment(history: History) -> dict[str, Any] | None:
    """The servers found at the start (run.json's server.deployment, discovery.py), each with
    its role, /metrics and reported settings; None for a run that recorded none."""
    server = history.run.get("server")
    dep = Deployment.from_dict(server.get("deployment")) if isinstance(server, dict) else None
    return dep.as_dict() if dep is not None and dep.endpoints else None


def _reference(history: History, counts: dict[str, int]) -> dict[str, Any] | None:
    """--reference runs: how many completed turns repeated a request of the reference run, and how
    many of those got a different answer; None for a run without --reference."""
    ref = history.run.get("reference")
    if not isinstance(ref, dict):
        return None
    compared = sum(1 for t in history.turns if t.status is TurnStatus.OK and t.request.get("compared"))
    return {
        "run_dir": ref.get("run_dir"),
        "answers": ref.get("answers"),
        "conflicts": ref.get("conflicts", 0),
        "compared": compared,
        "mismatched": counts.get(REFERENCE_CODE, 0),
    }
