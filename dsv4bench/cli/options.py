"""The flags the load commands (`agents`, `sweep`, `locust`) share, each declared once: its name,
its default (read from the config it fills: RunConfig, or SweepPlan for the sweep's own), its help
text and the `--help` panel it shows in. A command's signature takes the option object itself as
the parameter's default; typer copies it when it builds each command and never changes it, so one
object serves every command (tests/test_cli_options.py holds that).

Where a flag says something different per command (what --out's folder holds, what --fail-on
judges), a small function builds it from the one shared text and the command's word; where its
meaning differs (sweep's --seed and --concurrency, locust's --host and --kill), the command keeps
its own and says why.
"""

from __future__ import annotations

from typing import Any

import typer

from dsv4bench.harness.config import TRIAGE_AUTO_LIMIT, RunConfig
from dsv4bench.harness.session import SessionConfig
from dsv4bench.harness.triage import TRIAGE_REPEATS
from dsv4bench.history.redact import API_KEY_ENV
from dsv4bench.modes.sweep import SweepPlan
from dsv4bench.cli.common import REQUEST_MIX_HELP
from dsv4bench.cli.target import ENGINE_ROUTERS

# The panels of `--help`, in the order a reader needs them: which server, what load, what is
# checked, what is broken on purpose, how a wedge is watched for, the engine we start, what is written.
TARGET = "Target"
LOAD = "Load"
REPLAY = "Replay"
SWEEP = "Sweep levels"
CHECKS = "Checks"
NEMESIS = "Nemesis"
WEDGE_WATCH = "Wedge watch"
ENGINE = "Bundled engine"
OUTPUT = "Output"

FAIL_ON_VERDICTS = (
    "corruption,errors,wedge (and, with any of them, on INCOMPLETE: a history that lost records rules nothing out)"
)


def option(default: Any, *decls: str, panel: str, **kwargs: Any) -> Any:
    """typer.Option in its panel (typed Any as typer.Option is, so a signature may take it as its default)."""
    return typer.Option(default, *decls, rich_help_panel=panel, **kwargs)


# --- target -----------------------------------------------------------------------------------
# agents and sweep call the server's URL --url; locust's is Locust's own --host (-H), which goes on
# to Locust and means "the master's" under --worker, so locust declares its own.
URL = option(
    None,
    "--url",
    panel=TARGET,
    help=(
        "OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1. Default: the bundled DSV4-mini engine, "
        "started on a free loopback port for the command."
    ),
)
MODEL_HELP = "Model name; default: the first id of /v1/models"
MODEL = option(RunConfig.model, "--model", panel=TARGET, help=f"{MODEL_HELP}.")
API_KEY = option(RunConfig.api_key, "--api-key", panel=TARGET, envvar=API_KEY_ENV, help="Bearer token for the server.")

# --- load -------------------------------------------------------------------------------------
SCENARIO_HELP = "Scenario family: coding, data, ops, or mixed (round robin)."
SCENARIO = option(RunConfig.scenario, "--scenario", panel=LOAD, help=SCENARIO_HELP)
SEED = option(RunConfig.seed, "--seed", panel=LOAD, help="Run seed; the same seed replays the same tasks.")
MAX_TURNS = option(
    RunConfig.max_turns,
    "--max-turns",
    panel=LOAD,
    help=f"Turns per session before it is cut off. Default: the --context profile's turns, else {SessionConfig.max_turns}.",
)
CONTEXT = option(
    RunConfig.context,
    "--context",
    panel=LOAD,
    metavar="PROFILE",
    help=(
        "How deep sessions grow: short (ours, a few thousand tokens), swe (SWE-agent and OpenHands trajectories: "
        "deepest prompt 23,840 tokens at the median, 69,274 at p95, 36 turns), coding-agent (Claude Code and "
        "Codex: ~154k), or P50[,P95] in tokens (24k,70k). A long session opens with real reads of its world and "
        "ends at its drawn depth or the server's context. docs/cache-pressure.md."
    ),
)
THINKING = option(
    RunConfig.thinking, "--thinking/--no-thinking", panel=LOAD, help="Ask for thinking mode (chat_template_kwargs)."
)
REQUEST_MIX = option(RunConfig.request_mix, "--request-mix", panel=LOAD, metavar="MIX", help=REQUEST_MIX_HELP)
STREAM = option(RunConfig.stream, "--stream/--no-stream", panel=LOAD, help="Stream responses over SSE.")
MAX_TOKENS = option(RunConfig.max_tokens, "--max-tokens", panel=LOAD, help="max_tokens of each turn.")
CONTEXT_LENGTH = option(
    RunConfig.context_length,
    "--context-length",
    panel=LOAD,
    help=(
        "The server's context in tokens; a session whose next turn would not fit ends there (context_full). "
        "Default: what /v1/models or /get_model_info reports."
    ),
)
CACHE_PRESSURE = option(
    RunConfig.cache_pressure,
    "--cache-pressure",
    panel=LOAD,
    metavar="X",
    help=(
        "Size the sessions' depth so that their working set (concurrency x mean deepest prompt) is X times the "
        "server's KV pool, read from /get_server_info (SGLang, the bundled engine) or /metrics (vLLM); the plan "
        "is printed before the load, and a pressure the server's context cannot reach at this --concurrency is "
        "refused. docs/cache-pressure.md."
    ),
)
KV_POOL_TOKENS = option(
    RunConfig.kv_pool_tokens,
    "--kv-pool-tokens",
    panel=LOAD,
    metavar="N",
    help="The server's device KV pool in tokens, for --cache-pressure where the server does not say it.",
)
TEMPERATURE = option(RunConfig.temperature, "--temperature", panel=LOAD, help="Sampling temperature.")

# --- checks -----------------------------------------------------------------------------------
TTFT_TIMEOUT = option(
    RunConfig.ttft_timeout,
    "--ttft-timeout",
    panel=CHECKS,
    help="Seconds to the first token before a turn is timeout_ttft.",
)
TOTAL_TIMEOUT = option(
    RunConfig.total_timeout,
    "--total-timeout",
    panel=CHECKS,
    help="Seconds to the end of a turn before it is timeout_total.",
)
ON_CORRUPT = option(
    RunConfig.on_corrupt,
    "--on-corrupt",
    panel=CHECKS,
    help="After a corrupt turn: continue (feed back an error) or stop.",
)

SLO = option(
    RunConfig.slo,
    "--slo",
    panel=CHECKS,
    metavar="TARGETS",
    help=(
        "Latency targets each turn is judged against, any of ttft, itl (the turn's mean gap between tokens) and "
        "e2e, in s or ms (a plain number is seconds), e.g. ttft=2s,itl=100ms,e2e=60s. The report, summary.json, "
        "the exported metrics and the Locust tab then give the share of turns meeting them all and the goodput "
        "(those turns, and their output tokens, per second), as vLLM's bench serve and AIPerf report it; killed "
        "turns are not counted, corrupt or failed ones never good. docs/slo.md."
    ),
)

# --- wedge watch ------------------------------------------------------------------------------
METRICS_INTERVAL = option(
    RunConfig.metrics_interval,
    "--metrics-interval",
    panel=WEDGE_WATCH,
    help="Seconds between scrapes of each --metrics URL.",
)
CANARY_TIMEOUT = option(
    RunConfig.canary_timeout,
    "--canary-timeout",
    panel=WEDGE_WATCH,
    help="Deadline of the one short completion sent after the drain window.",
)
PERSIST_SESSIONS = option(
    RunConfig.persist_sessions,
    "--persist-sessions",
    panel=CHECKS,
    metavar="N",
    help=(
        "When the load found corruption: after the drain, replay N sessions that were clean early in the run, one "
        "at a time; if most of them now corrupt, the server's state is poisoned (poisoned_state). 0: off."
    ),
)

TRIAGE = option(
    RunConfig.triage,
    "--triage",
    panel=CHECKS,
    metavar="off|auto|N",
    help=(
        "When the load found corruption: after the drain, send each finding's exact request again alone "
        f"{TRIAGE_REPEATS} times and once with a nonce that defeats the prefix cache, and class it: deterministic, "
        "cache_state, cold_path, intermittent or load_dependent (first checking that the server answers one "
        f"request alone the same way twice). auto: up to {TRIAGE_AUTO_LIMIT} findings, every code and scenario "
        "first; N: up to N; off. docs/triage.md."
    ),
)
RECHECK = option(
    RunConfig.recheck,
    "--recheck",
    panel=CHECKS,
    metavar="F",
    help=(
        "Send a share F (0-1) of the greedy turns the checkers passed (every scenario and depth at least once) "
        "again alone after the load; an answer alone that differs from the one under the load is "
        "answer_changed_under_load (a cache or KV race that keeps calls well formed), in one run. Needs "
        "--temperature 0 and a deterministic server, checked first. docs/triage.md."
    ),
)
RECHECK_GROUP = option(
    RunConfig.recheck_group,
    "--recheck-group",
    panel=CHECKS,
    metavar="N",
    help=(
        "With --recheck: kept turns screened at once (a session's turns in a row, N sessions together); "
        "only an answer that differs from the load's is then sent alone, and only alone answers judge. "
        "1 screens each alone, for a race that fires with as few as N requests in flight. docs/triage.md."
    ),
)
RECHECK_KEEP_CACHE = option(
    RunConfig.recheck_keep_cache,
    "--recheck-keep-cache",
    panel=CHECKS,
    help=(
        "With --recheck: send the turns again over the prefix cache the load left. By default the cache "
        "is dropped first where the server offers a flush (SGLang /flush_cache, vLLM /reset_prefix_cache), "
        "so a race that cached wrong KV cannot give its wrong answer again. docs/triage.md."
    ),
)


def metrics(during: str) -> Any:
    """--metrics; `during`: the stretch each command scrapes ("the run", "each batch", "each test")."""
    return option(
        list(RunConfig.metrics),
        "--metrics",
        panel=WEDGE_WATCH,
        help=(
            f"Prometheus /metrics URL to scrape during {during} (repeatable: router, prefill, decode). "
            "Default: the server's own /metrics when it serves SGLang's or vLLM's."
        ),
    )


def drain_timeout(after: str) -> Any:
    """--drain-timeout; `after`: when each command's load stops ("the load stops", "each batch")."""
    return option(
        RunConfig.drain_timeout,
        "--drain-timeout",
        panel=WEDGE_WATCH,
        help=f"Seconds to keep scraping --metrics after {after}, waiting for the queues to drain.",
    )


# --- output -----------------------------------------------------------------------------------
def out_dir(folder: str) -> Any:
    """--out; `folder`: what the command creates under it ("the run folder", "the sweep folder")."""
    return option(RunConfig.out, "--out", panel=OUTPUT, help=f"Folder under which {folder} is created.")


def fail_on(when: str) -> Any:
    """--fail-on; `when`: what each command judges. Its default is None, not RunConfig.fail_on's
    (): the flag is text that parse_fail_on turns into that tuple."""
    return option(None, "--fail-on", panel=OUTPUT, help=f"Exit 1 {when}: {FAIL_ON_VERDICTS}.")


def quiet(what: str) -> Any:
    """--quiet / -q; `what`: what the command then leaves out."""
    return option(RunConfig.quiet, "--quiet", "-q", panel=OUTPUT, help=what)


# --- bundled engine ---------------------------------------------------------------------------
def engine_options(url_flag: str) -> tuple[Any, Any, Any, Any]:
    """--engine-arg, --engine-fault, --engine-pd, --engine-router; `url_flag`: the command's server
    flag, with which none of them applies. No config holds their defaults: target.engine_args turns
    them into the engine's own flags, which EngineConfig then reads."""
    no_url = f"(no {url_flag})"
    return (
        option(
            [],
            "--engine-arg",
            panel=ENGINE,
            help=f"Extra flag for the bundled engine {no_url}, repeatable, e.g. --engine-arg=--num-pages=8192.",
        ),
        option(
            [],
            "--engine-fault",
            panel=ENGINE,
            metavar="NAME",
            help=(
                f"Switch on a planted fault in the bundled engine {no_url}, repeatable; `dsv4bench engine faults` "
                "lists them."
            ),
        ),
        option(
            False,
            "--engine-pd",
            panel=ENGINE,
            help=(
                f"Run the bundled engine {no_url} prefill/decode disaggregated: router, prefill and decode servers, "
                "all three scraped (same as --engine-arg=--pd)."
            ),
        ),
        option(
            ENGINE_ROUTERS[0],
            "--engine-router",
            panel=ENGINE,
            metavar="|".join(ENGINE_ROUTERS),
            help=(
                f"What fronts the bundled engine {no_url}: its own server, or SGLang's router (`sglang-router`, "
                "pip install 'dsv4bench\\[sglang]') started in front of it on loopback; with --engine-pd the prefill "
                "and decode halves then run as two processes behind it in PD mode. The run also scrapes the "
                "router's smg_* metrics."
            ),
        ),
    )


ENGINE_ARG, ENGINE_FAULT, ENGINE_PD, ENGINE_ROUTER = engine_options("--url")

# --- sweep's own: its stopping rule, defaults from SweepPlan ------------------------------------
CONFIDENCE = option(
    SweepPlan.confidence, "--confidence", panel=SWEEP, help="Confidence of each level's Wilson score interval."
)
PRECISION = option(
    SweepPlan.precision,
    "--precision",
    panel=SWEEP,
    help=(
        "A level stops once its interval is at most this wide (upper minus lower bound, as a rate: 0.05 = 5 points)."
    ),
)
LEVEL_TURNS = option(
    SweepPlan.level_turns, "--level-turns", panel=SWEEP, help="Turns after which a level stops whatever its interval."
)
BASELINE = option(
    SweepPlan.baseline,
    "--baseline",
    panel=SWEEP,
    help=(
        "Corrupt-turn rate the server is known to have anyway; the threshold is the smallest level whose "
        "interval's lower bound is above it."
    ),
)
