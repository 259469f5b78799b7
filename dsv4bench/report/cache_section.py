"""The report's "Cache pressure" and "What this run could not have found" sections: summary.json's
`cache` block (report/cache_summary.py) and `coverage` list (report/coverage.py) in words."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4bench.report import blocks as md
from dsv4bench.report.cache_summary import PREFIX_SOURCES

SERVER_COLUMNS = 8  # servers shown side by side; summary.json has every one
NOT_EXPORTED = "not exported"
# What each prefix source means, in the order of the table.
SOURCE_WORDS = {
    "host": "part of the prompt was loaded back from the host tier (SGLang's `cached_tokens_details`)",
    "device": "part of the prompt was cached, none of it from the host (or the server does not split by tier)",
    "computed": "nothing was cached: the whole prompt was computed",
    "unknown": "the answer reported no usage",
}
_REACHED_WORDS: dict[Any, str] = {True: "yes", False: "**no**", None: NOT_EXPORTED}


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _tokens(x: Any) -> str:
    if not _is_number(x):
        return NOT_EXPORTED if x is None else md.inline(x, 40)
    return md.fmt_int(round(x))


def _share(x: Any) -> str:
    if not _is_number(x):
        return NOT_EXPORTED if x is None else md.inline(x, 40)
    return md.fmt_rate(x)


def _figure(x: Any) -> str:
    """A figure of the run's own plan: a number as a number ('2', '16', '2.05'), else escaped text."""
    if not _is_number(x):
        return md.inline(x, 40)
    return f"{x:,}" if isinstance(x, int) else f"{x:.3g}"


def _host(s: dict[str, Any]) -> str:
    used, total = s.get("host_used_tokens_max"), s.get("host_total_tokens")
    if used is None and total is None:
        return "no host tier"
    return f"{_tokens(used)} / {_tokens(total)}"


def _load_back(s: dict[str, Any]) -> str:
    if s.get("load_back_tokens") is None and _host(s) == "no host tier":
        return "no host tier"
    return _tokens(s.get("load_back_tokens"))


def _spec(s: dict[str, Any]) -> str:
    figures = [s.get(k) for k in ("spec_accept_first", "spec_accept_min", "spec_accept_last")]
    if all(x is None for x in figures):
        return NOT_EXPORTED
    return " / ".join(_share(x) for x in figures)


# Each row of the per-server table: its label and how it reads one server's figures.
_ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("eviction reached", lambda s: _REACHED_WORDS.get(s.get("eviction_reached"), NOT_EXPORTED)),
    ("tokens evicted from the device pool", lambda s: _tokens(s.get("evicted_tokens"))),
    ("tokens loaded back from host", _load_back),
    ("host used peak / host total", _host),
    ("KV used peak / pool", lambda s: f"{_tokens(s.get('kv_used_tokens_max'))} / {_tokens(s.get('kv_total_tokens'))}"),
    ("evictable peak", lambda s: _tokens(s.get("evictable_tokens_max"))),
    ("cache hit rate", lambda s: _share(s.get("cache_hit_rate"))),
    ("spec acceptance first / min / last", _spec),
    ("preemptions", lambda s: _tokens(s.get("preemptions"))),
    ("scrapes read", lambda s: md.fmt_int(int(s.get("scrapes") or 0))),
)


def _server_table(servers: dict[str, Any]) -> list[str]:
    shown = [(ep, s) for ep, s in servers.items() if isinstance(s, dict)][:SERVER_COLUMNS]
    rows = [[label, *(read(s) if s.get("scrapes") else "never scraped" for _, s in shown)] for label, read in _ROWS]
    out = [md.table(["", *(md.code_span(ep, 200) for ep, _ in shown)], rows)]
    if len(servers) > len(shown):
        out += ["", f"{md.plural(len(servers) - len(shown), 'more server')} in summary.json's `cache.servers`."]
    resets = sum(int(s.get("counter_resets") or 0) for _, s in shown)
    if resets:
        out += [
            "",
            f"A counter fell {md.plural(resets, 'time')} (a server restarted): each was counted again from zero, "
            "never negative.",
        ]
    return out


def _pool_lines(cache: dict[str, Any]) -> list[str]:
    pool = cache.get("pool")
    if isinstance(pool, dict) and pool.get("tokens"):
        line = f"Device KV pool: {md.fmt_int(int(pool['tokens']))} tokens ({md.inline(pool.get('source'), 200)})."
    else:
        line = "Device KV pool: not known (no server said it; `--kv-pool-tokens N` gives it)."
    plan = cache.get("plan")
    if isinstance(plan, dict):
        asked = md.code_span(f"--cache-pressure {_figure(plan.get('pressure'))}", 40)
        working_set = plan.get("working_set")
        line += (
            f" Plan ({asked}): {_figure(plan.get('concurrency'))} sessions at once, context profile "
            f"{md.inline(plan.get('context'), 60)}, working set "
            f"{_tokens(working_set) if _is_number(working_set) else '–'} tokens = "
            f"{_figure(plan.get('reached'))}x the pool."
        )
    peak, over = cache.get("working_set_peak"), cache.get("working_set_over_pool")
    if peak is not None:
        share = f" = {over:.3g}x the pool" if isinstance(over, (int, float)) else ""
        line += (
            f" The sessions held at most {md.fmt_int(int(peak))} tokens at once{share} (each open session's latest "
            "prompt + completion, summed)."
        )
    return [line]


def _reached_line(cache: dict[str, Any]) -> str:
    eviction = {True: "reached", False: "**not reached**", None: "not measured"}.get(cache.get("eviction_reached"))
    host = {True: "reached", False: "**not reached**", None: "no host tier exported (HiCache off)"}.get(
        cache.get("host_reads_reached")
    )
    return f"Eviction from the device pool: {eviction}. Reads back from the host tier: {host}."


def _spread_cells(d: Any) -> list[str]:
    d = d if isinstance(d, dict) else {}
    return [
        md.fmt_int(int(d.get("n") or 0)),
        *(_tokens(d.get(k)) if d.get("n") else "–" for k in ("p50", "p95", "max")),
    ]


def _prefix_lines(cache: dict[str, Any]) -> list[str]:
    sources = cache.get("prefix_sources")
    if not isinstance(sources, dict) or not any((g or {}).get("total") for g in sources.values()):
        return ["No completed turn to split by where its prompt came from."]
    rows = [
        [
            md.code_span(s),
            md.fmt_int(g.get("total", 0)),
            md.fmt_int(g.get("good", 0)),
            md.fmt_int(g.get("corrupt", 0)),
            md.fmt_pct(g.get("corrupt", 0), g.get("ok", 0)),
            SOURCE_WORDS[s],
        ]
        for s in PREFIX_SOURCES
        if isinstance(g := sources.get(s), dict)
    ]
    return [
        "Completed turns by where their prompt prefix came from, as each answer's usage said:",
        "",
        md.table(["prefix from", "turns", "good", "corrupt", "corrupt / turns", "meaning"], rows),
        "",
        md.table(
            ["tokens", "n", "p50", "p95", "max"],
            [
                ["cached per turn", *_spread_cells(cache.get("cached_tokens_per_turn"))],
                ["deepest prompt per session", *_spread_cells(cache.get("deepest_prompt_per_session"))],
            ],
        ),
    ]


def cache_section(summary: dict[str, Any]) -> list[str]:
    """The "Cache pressure" section's lines: the pool, the plan, what each server's metrics say it
    reached, and the turns split by where their prompt prefix came from."""
    cache = summary.get("cache")
    head = ["## Cache pressure", ""]
    if not isinstance(cache, dict):
        return [*head, "No turns and no metrics recorded: no cache pressure to tell."]
    out = [*head, *_pool_lines(cache), "", _reached_line(cache), ""]
    servers = cache.get("servers")
    if isinstance(servers, dict) and servers:
        out += [
            "What each server's own /metrics say the run reached (counters: their rise over the run; "
            f"gauges: their peak); *{NOT_EXPORTED}*: the server has no such metric.",
            "",
            *_server_table(servers),
            "",
        ]
    else:
        out += ["No server's /metrics was scraped: what its cache went through is not known (`--metrics URL`).", ""]
    return out + _prefix_lines(cache)


def _flags(flag: str) -> str:
    """'--cache-pressure 2 or --context swe' as two code spans; a remedy in words as text."""
    if not flag.startswith(("-", "dsv4bench ")):
        return md.inline(flag, 200)
    return " or ".join(md.code_span(f, 120) for f in flag.split(" or "))


def coverage_section(summary: dict[str, Any]) -> list[str]:
    """The "What this run could not have found" section: one line per gap, with why and the flag
    that would change it; a line saying nothing known was left out where no gap holds."""
    gaps = summary.get("coverage")
    head = ["## What this run could not have found", ""]
    if not isinstance(gaps, list):
        return []
    if not gaps:
        return [
            *head,
            "Nothing known: the run reached eviction (and host-tier reads where a server has a host tier), judged "
            "the queues for wedges, compared answers after the load and cut requests off mid-turn.",
        ]
    return [
        *head,
        *(
            f"- **{md.inline(g.get('gap'), 80)}**: {md.inline(g.get('why'), 400)} To change it: {_flags(str(g.get('flag')))}."
            for g in gaps
            if isinstance(g, dict)
        ),
    ]
