"""summary.json's `coverage`: what the run could not have found, and the flag that would change it.

A CLEAN verdict is only worth what the run exercised (DESIGN.md section 10): a load whose working
set fits the device pool never evicts, so a race on prefixes loaded back from the host tier
cannot fire however long it runs; a run without --metrics judged no queue; one without --recheck
or --reference cannot see an answer that a race changed but left well formed; one without kills
never took the abort paths. Each gap is {"gap": a few words, "why": one sentence, "flag": what
to add: our flags, or in words where none of ours would change it}, listed in a fixed order and
only where it holds.

Pure: the summary's blocks (a Summary's dict view, or summary_of's blocks before it is built) and
run.json in. A gap about a flag is said only where the run's config has that flag's key: proxy
and replay runs have no --kill or --recheck, and telling their users to add one would mislead.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from dsv4bench.history.records import is_finite_number

NO_EVICTION = "no eviction reached"
HOST_NEVER_READ = "host tier never read"
EVICTION_NOT_MEASURED = "eviction not measured"
WEDGES_NOT_CHECKED = "wedges not checked"
ANSWERS_NOT_COMPARED = "answers changed by load not compared"
NOT_DETERMINISTIC = "server not deterministic"
NO_KILLS = "no kills"
# Each gap in the few words said beside a CLEAN verdict ("not exercised: eviction, kills").
SHORT: dict[str, str] = {
    NO_EVICTION: "eviction",
    HOST_NEVER_READ: "host-tier reads",
    EVICTION_NOT_MEASURED: "eviction (not measured)",
    WEDGES_NOT_CHECKED: "wedges",
    ANSWERS_NOT_COMPARED: "recheck",
    NOT_DETERMINISTIC: "recheck (server not deterministic)",
    NO_KILLS: "kills",
}
# Where --cache-pressure was given and still reached too little, the flag suggests this much more.
PRESSURE_STEP = 2.0


def _positive(value: Any) -> float | None:
    """A flag's figure as the config holds it, where it is a number above 0; else None (off)."""
    return float(value) if is_finite_number(value) and value > 0 else None


def _gap(gap: str, why: str, flag: str) -> dict[str, str]:
    return {"gap": gap, "why": why, "flag": flag}


def _config(run: dict[str, Any]) -> dict[str, Any]:
    config = run.get("config")
    return config if isinstance(config, dict) else {}


def _pressure_flag(config: dict[str, Any]) -> str:
    """The flag that raises the pressure: --cache-pressure 2, or more than the run was given."""
    if "cache_pressure" not in config:
        return "dsv4bench agents --cache-pressure 2"  # this mode plays no sessions of its own
    given = _positive(config.get("cache_pressure"))
    if given is not None:
        return f"--cache-pressure {max(PRESSURE_STEP, given * PRESSURE_STEP):g}"
    return "--cache-pressure 2 or --context swe"


def _held(cache: dict[str, Any]) -> str:
    """' (sessions held at most 120,000 tokens of a 412,000-token pool)', or '' where unknown."""
    peak, pool = cache.get("working_set_peak"), (cache.get("pool") or {}).get("tokens")
    if peak is None:
        return ""
    of_pool = f" of a {pool:,}-token pool" if isinstance(pool, int) else ""
    return f" (sessions held at most {peak:,} tokens{of_pool})"


def _pressure_gaps(summary: dict[str, Any], config: dict[str, Any]) -> list[dict[str, str]]:
    cache = summary.get("cache")
    if not isinstance(cache, dict):
        return []
    eviction, host = cache.get("eviction_reached"), cache.get("host_reads_reached")
    if eviction is False:
        return [
            _gap(
                NO_EVICTION,
                f"No server's eviction counter rose: the working set{_held(cache)} fit the device KV pool, so "
                "no prefix was pushed out and loaded back, and the host-tier and eviction races were not exercised.",
                _pressure_flag(config),
            )
        ]
    if eviction is True and host is False:
        return [
            _gap(
                HOST_NEVER_READ,
                "The device pool evicted, but no server loaded a prefix back from its host tier (HiCache): the "
                "incident's path, an evicted prefix read back from host memory, was not exercised.",
                _pressure_flag(config),
            )
        ]
    scraped = any((s.get("scrapes") or 0) > 0 for s in (cache.get("servers") or {}).values() if isinstance(s, dict))
    if eviction is None and scraped:
        sized = _positive(config.get("cache_pressure")) is not None
        if sized:
            flag = "--metrics URL"  # a router in front exports none: its workers' /metrics do
        elif "cache_pressure" not in config:
            flag = _pressure_flag(config)
        elif cache.get("pool"):
            flag = "--cache-pressure 2"
        else:
            flag = "--kv-pool-tokens N --cache-pressure 2"
        return [
            _gap(
                EVICTION_NOT_MEASURED,
                "No scraped server exports an eviction counter (SGLang's sglang:evicted_tokens_total), so "
                "whether the run pushed prefixes out of the device pool is not known"
                + (
                    ", though the load was sized to reach it."
                    if sized
                    else "; the load can still be sized to the pool."
                ),
                flag,
            )
        ]
    return []


def _wedge_gaps(summary: dict[str, Any]) -> list[dict[str, str]]:
    if summary.get("wedge_checked") is not False:
        return []
    reason = summary.get("wedge_unchecked_reason") or "no metrics scraped"
    return [
        _gap(
            WEDGES_NOT_CHECKED,
            f"No server's queues could be read ({reason}), so no wedge was judged and no cache pressure was "
            "read from the server.",
            "--metrics URL",
        )
    ]


def _determinism(summary: dict[str, Any]) -> bool | None:
    """What the triage's probe found of the server at temperature 0 (harness/alone.py)."""
    triage = summary.get("triage")
    det = triage.get("determinism") if isinstance(triage, dict) else None
    return det.get("deterministic") if isinstance(det, dict) else None


def _answer_gaps(summary: dict[str, Any], config: dict[str, Any]) -> list[dict[str, str]]:
    if "recheck" not in config:
        return []
    rechecked = _positive(config.get("recheck")) is not None
    if not rechecked and not config.get("reference"):
        return [
            _gap(
                ANSWERS_NOT_COMPARED,
                "Every answer was judged by its form only: one that a cache or KV race changed but left well "
                "formed reads as clean.",
                "--recheck 0.3",
            )
        ]
    if rechecked and _determinism(summary) is False:
        return [
            _gap(
                NOT_DETERMINISTIC,
                "The server answered one request alone two ways at temperature 0, so the recheck could not "
                "compare answers and only well-formedness was judged.",
                # No flag of ours: the server's own setting, where its model allows it.
                "a server deterministic at temperature 0 (SGLang's enable_deterministic_inference server arg)",
            )
        ]
    return []


def _kill_gaps(config: dict[str, Any]) -> list[dict[str, str]]:
    kills = config.get("kill")
    if not isinstance(kills, list) or kills:
        return []
    return [
        _gap(
            NO_KILLS,
            "No request was cut off mid-turn, so the abort paths (a request dropped in prefill, in decode or "
            "in a KV transfer) were not exercised.",
            # restart: the killed sessions start again, so the kill does not end the load.
            "--kill all@20s,restart",
        )
    ]


def coverage_gaps(summary: dict[str, Any], run: dict[str, Any]) -> list[dict[str, str]]:
    """What the run could not have found, in the report's order: cache pressure, wedges, changed
    answers, kills; [] when nothing known was left out."""
    config = _config(run)
    return [
        *_pressure_gaps(summary, config),
        *_wedge_gaps(summary),
        *_answer_gaps(summary, config),
        *_kill_gaps(config),
    ]


def short_gaps(gaps: list[dict[str, str]], leave_out: Collection[str] = ()) -> str:
    """'not exercised: eviction, recheck, kills' for the gaps not named in `leave_out` (a gap
    said beside the verdict already); '' where none is left."""
    words = [SHORT.get(g.get("gap", ""), g.get("gap", "")) for g in gaps if g.get("gap") not in leave_out]
    return f"not exercised: {', '.join(words)}" if words else ""
