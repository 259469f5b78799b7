"""Prove that dsv4bench finds every planted engine fault, under the verdict code it should, and
nothing on the clean engine.

For each fault, N runs of `dsv4bench agents` against the bundled engine with the recipe that
triggers it (concurrency 80, multi-turn agent sessions, kills where the fault needs them,
bounded time), then N clean runs: clean run k replays the k-th recipe's engine settings and load
with no fault, so every recipe's stress is also seen clean. A fault whose corruption keeps every
tool call well formed (`hicache-index-race`) is judged against a reference: fault run i and clean
run i get `--reference` to a clean run of the same seed and settings made just before them, and
that reference run counts as a clean run too. With `--recheck F` such a fault is judged in one run
instead: every run (fault and clean) gets `agents --recheck F` and no reference run, and the fault
is found as `answer_changed_under_load` (its first detection is then the run's end, where the
recheck gives its verdict). Prints a markdown table: runs where the expected
code was found, the codes seen, and the time to first detection (from the start of the run to
the end of the first turn carrying an expected corruption code, or to the end of the drain window
that concluded a wedge).

With `--router sglang` every engine runs behind SGLang's real router (`agents --engine-router
sglang`: in PD mode the two halves as processes behind it, else one engine behind it in regular
mode), and the table's router column names its version. That router answers `/health` from its
own liveness, so a wedged deployment behind it reads `health_lies` on the router whatever the
engine does: that finding is kept apart (`health_lies@router`) and never counts as finding the
`health-lies` fault, which must then show on a server behind the router.

    python scripts/prove_faults.py --runs 5 --table proof.md --reports reports/
    python scripts/prove_faults.py --runs 5 --only hicache-index-race --recheck 1
    python scripts/prove_faults.py --runs 5 --only hicache-index-race --recheck 0.1 --pool production --timeout 1500
    python scripts/prove_faults.py --runs 5 --router sglang --only abort-leak --only bootstrap-stall \
        --only ghost-decode --only health-lies
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from dsv4bench.history.run_folder import EVENTS_FILE, METRICS_FILE, TURNS_FILE, read_jsonl
from dsv4bench.history.codes import ANSWER_CHANGED_CODE
from dsv4bench.history.records import CORRUPTION_CODES, REFERENCE_CODE, WEDGE_CODES

BASE = ["--concurrency", "80", "--quiet", "--max-turns", "12"]
ROUTERS = ("bundled", "sglang")  # what fronts the bundled engine (agents --engine-router)
# Codes SGLang's router gives a wedged deployment on its own endpoint, fault or not: its /health
# is its own liveness, never a generation through the workers.
ROUTER_OWN = frozenset({"health_lies"})
ROUTER_MARK = "@router"


@dataclass(frozen=True)
class Recipe:
    fault: str  # the --engine-fault names it switches on, "+"-joined; the row's name
    expect: frozenset[str]  # the verdict codes that count as finding it
    engine: tuple[str, ...] = ()  # engine settings the fault needs (kept in the clean replay)
    load: tuple[str, ...] = ()  # agents flags: duration, kills, drain window
    extra_faults: tuple[str, ...] = ()  # faults that set the stage (health-lies needs a wedge to lie about)
    reference: bool = False  # judge runs against a clean run of the same seed and settings (--reference)
    why: str = ""
    recheck_load: tuple[str, ...] = ()  # with --recheck: the load of one run that judges it alone
    recheck_engine: tuple[str, ...] = ()  # with --recheck: engine settings in place of `engine`

    def rechecked(self, share: float | None) -> Recipe:
        """The recipe as --recheck judges it: in one run, its own load, found as an answer changed."""
        if share is None or not self.reference:
            return self
        load = (*(self.recheck_load or self.load), "--recheck", f"{share:g}")
        engine = self.recheck_engine or self.engine
        return replace(self, expect=frozenset({ANSWER_CHANGED_CODE}), load=load, engine=engine, reference=False)

    @property
    def faults(self) -> tuple[str, ...]:
        return (*self.extra_faults, self.fault)


KILL = ("--duration", "30", "--kill", "all@20s", "--drain-timeout", "10", "--canary-timeout", "5")


def hicache_race_engine(device_pages: int) -> tuple[str, ...]:
    """The engine `hicache-index-race` needs: HiCache over a device pool of `device_pages`, a large
    host tier behind a slow link, bf16 index keys (twice fp8's bytes: every layer lands later)."""
    return (
        "--hicache",
        f"--num-pages={device_pages}",
        "--hicache-host-pages=16384",
        "--hicache-load-gbps=0.02",
        "--index-k-dtype=bf16",
    )


# The race on a production-sized pool: the engine's default 32,768-page (1,048,576-token) device
# pool and a host tier twice it, with the sessions sized by --cache-pressure to hold more than the
# pool at once (docs/cache-pressure.md): a prefix comes back from host only after the working set
# outgrows the device. 112 sessions within the 16,384-token context of the bundled model. On 2
# CPU cores the engine prefills these 10-15k-token prompts at ~3.5k tokens/s
# (scripts/bench_long_prefill.py), so the pool alone takes ~300 s to fill: the load runs 480 s.
PRODUCTION_POOL_ENGINE = (
    "--hicache",
    "--hicache-load-gbps=0.02",
    "--index-k-dtype=bf16",
)
PRODUCTION_POOL_LOAD = (
    "--concurrency",
    "112",
    "--cache-pressure",
    "1.3",
    "--duration",
    "480",
    # every session's opening waits behind the others' at the start: at the default 60 s most
    # sessions time out before they come back (bench-plan.md, "Sessions as long as real agents'")
    "--ttft-timeout",
    "600",
    "--drain-timeout",
    "10",
    "--persist-sessions",
    "0",
)


def production_pool(recipe: Recipe) -> Recipe:
    """hicache-index-race on the production-sized pool (PRODUCTION_POOL_*); any other recipe as it is."""
    if recipe.fault != "hicache-index-race":
        return recipe
    return replace(
        recipe,
        recheck_engine=PRODUCTION_POOL_ENGINE,
        recheck_load=PRODUCTION_POOL_LOAD,
        why="the engine's default pool; 112 sessions sized by --cache-pressure 1.3 to hold 1.3 times it, so once "
        "the pool fills every round of turns loads prefixes back from the host tier while the indexer reads them",
    )


RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "hicache-index-race",
        frozenset({REFERENCE_CODE}),
        engine=hicache_race_engine(1024),
        load=("--duration", "90", "--drain-timeout", "10"),
        reference=True,
        recheck_load=("--duration", "25", "--drain-timeout", "10", "--persist-sessions", "0"),
        # half the device pool: prefixes come back from the host tier within the load. 25 s: its
        # turns in flight end near 50 s and all ~320 kept turns are rechecked by ~105 s (30 s
        # took 120-135 s; 20 s left as few as 2 changed answers to find; bench-plan.md)
        recheck_engine=hicache_race_engine(512),
        why="a device pool far too small for 80 sessions and a slow link: nearly every prefix comes back from "
        "the host tier while the indexer reads it; the stale picks change answers, not their form, and 90 s gives "
        "every session several turns for them to change",
    ),
    Recipe(
        "parser-split",
        frozenset({"dsml_leak_content"}),
        load=("--duration", "40", "--drain-timeout", "10"),
        why="every turn streams a DSML tool call; some tags arrive split across chunks",
    ),
    Recipe(
        "ghost-decode",
        frozenset({"ghost_requests"}),
        load=KILL,
        why="a kill-all storm disconnects 80 streams mid-decode",
    ),
    Recipe(
        "abort-leak",
        frozenset({"queue_stuck"}),
        engine=("--pd",),
        load=("--duration", "35", "--kill", "frac=0.5/every=5s/from=10s,abort", *KILL[4:]),
        why="kill storms every 5 s, with /abort_request, catch transfers in flight",
    ),
    Recipe(
        "bootstrap-stall",
        frozenset({"queue_stuck", "canary_timeout"}),
        engine=("--pd",),
        load=KILL,
        why="a kill-all storm sends the bootstrap worker ABORTs for requests it is handshaking",
    ),
    Recipe(
        "health-lies",
        frozenset({"health_lies"}),
        engine=("--pd",),
        load=KILL,
        extra_faults=("bootstrap-stall",),
        why="the bootstrap stall wedges the engine; /health must say so",
    ),
)


@dataclass
class RunResult:
    recipe: str
    clean: bool
    verdict: str
    codes: dict[str, int] = field(default_factory=dict)
    first_detection_s: float | None = None
    wall_s: float = 0.0
    run_dir: Path | None = None
    error: str | None = None
    corrupt_turns: dict[tuple[str, int, str], float | None] = field(default_factory=dict)  # -> s after start
    unguarded_reads: int | None = None  # HiCache runs: index-K reads that went ahead of a load (the race firing)
    reference: dict | None = None  # summary.json's `reference` (--reference runs): turns compared, mismatched
    triage: dict | None = None  # summary.json's `triage` (--recheck runs): turns rechecked, changed


def router_label(router: str) -> str:
    """The router column: "bundled", or SGLang's router with its installed version."""
    from dsv4bench.engine import sglang_router

    return "bundled" if router == "bundled" else sglang_router.label()


def agents_command(
    recipe: Recipe,
    clean: bool,
    seed: int,
    out: Path,
    weights: Path | None = None,
    reference: Path | None = None,
    router: str = "bundled",
) -> list[str]:
    """The `dsv4bench agents` run of one recipe, fault on or (`clean`) off."""
    engine_args = [f"--engine-arg={a}" for a in (*recipe.engine, *([f"--weights={weights}"] if weights else []))]
    faults = [] if clean else [f"--engine-fault={f}" for f in recipe.faults]
    return [
        sys.executable,
        "-m",
        "dsv4bench",
        "agents",
        *BASE,
        *recipe.load,
        "--seed",
        str(seed),
        "--out",
        str(out),
        *engine_args,
        *faults,
        *(["--reference", str(reference)] if reference else []),
        *(["--engine-router", router] if router != "bundled" else []),
    ]


def run_once(
    recipe: Recipe,
    clean: bool,
    seed: int,
    out: Path,
    timeout_s: float,
    weights: Path | None = None,
    reference: Path | None = None,
    router: str = "bundled",
) -> RunResult:
    cmd = agents_command(recipe, clean, seed, out, weights, reference, router)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return RunResult(recipe.fault, clean, "TIMEOUT", wall_s=time.monotonic() - t0, error=f"over {timeout_s:.0f} s")
    wall = time.monotonic() - t0
    dirs = sorted(p for p in out.iterdir() if (p / "summary.json").exists())
    if not dirs:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return RunResult(recipe.fault, clean, "FAILED", wall_s=wall, error=tail)
    run_dir = dirs[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    events = read_jsonl(run_dir / EVENTS_FILE)[0]
    corrupt_turns = read_turns(run_dir, events)
    routers = router_roots(events) if router == "sglang" else set()
    codes, first = read_findings(summary, set() if clean else recipe.expect, corrupt_turns, events, routers)
    if first is None and not clean and codes.get(ANSWER_CHANGED_CODE) and ANSWER_CHANGED_CODE in recipe.expect:
        first = recheck_verdict_s(summary, events) or summary.get("duration_s")
    return RunResult(
        recipe.fault,
        clean,
        summary["verdict"],
        codes,
        first,
        wall,
        run_dir,
        corrupt_turns=corrupt_turns,
        unguarded_reads=read_unguarded_reads(run_dir),
        reference=summary.get("reference"),
        triage=summary.get("triage"),
    )


def recheck_verdict_s(summary: dict, events: list[dict]) -> float | None:
    """Seconds from the run's start to its first answer_changed_under_load verdict: the last alone
    send of the first turn that --recheck found changed (each alone send is an event written as
    its answer ends)."""
    found = {
        (f.get("session"), f.get("turn"))
        for f in (summary.get("triage") or {}).get("findings") or []
        if ANSWER_CHANGED_CODE in (f.get("codes") or [])
    }
    start = next((e["t_ns"] for e in events if e.get("kind") == "run_start"), None)
    last: dict[tuple, int] = {}
    for e in events:
        if (
            e.get("kind") == "alone_request"
            and e.get("purpose") == "recheck"
            and (e.get("session"), e.get("turn")) in found
        ):
            last[(e.get("session"), e.get("turn"))] = e["t_ns"]
    return None if start is None or not last else round((min(last.values()) - start) / 1e9, 1)


def read_unguarded_reads(run_dir: Path) -> int | None:
    """The engine's last `dsv4mini:hicache_unguarded_index_k_reads_total` scraped in the run
    (None without HiCache): how often the index-K read went ahead of a load in flight."""
    for scrape in reversed(read_jsonl(run_dir / METRICS_FILE)[0]):
        found = [
            v
            for k, v in (scrape.get("values") or {}).items()
            if k.startswith("dsv4mini:hicache_unguarded_index_k_reads_total")
        ]
        if found:
            return int(sum(found))
    return None


def read_turns(run_dir: Path, events: list[dict]) -> dict[tuple[str, int, str], float | None]:
    """(session, turn, code) of every corruption verdict -> seconds from run start to the turn's
    end (None when the turn has no end time)."""
    start = _run_start(events)
    corrupt = {}
    for turn in read_jsonl(run_dir / TURNS_FILE)[0]:
        end = turn["timings"].get("end_ns")
        corrupt |= {
            (turn["session"], turn["turn"], v["code"]): (end - start) / 1e9 if end else None
            for v in turn.get("verdicts") or []
            if v["code"] in CORRUPTION_CODES
        }
    return corrupt


def origin(url: str) -> str:
    """scheme://host:port of a URL (a wedge finding's endpoint, a /health URL, a root)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def router_roots(events: list[dict]) -> set[str]:
    """Origins of the servers that said they are a router (the role on the run's /health events)."""
    return {
        origin(e["endpoint"])
        for e in events
        if e.get("kind") == "health" and e.get("role") == "router" and isinstance(e.get("endpoint"), str)
    }


def read_findings(
    summary: dict,
    expect: set[str],
    corrupt_turns: dict[tuple[str, int, str], float | None],
    events: list[dict],
    router_origins: set[str] | None = None,
) -> tuple[dict[str, int], float | None]:
    """(count per corruption or wedge code found, seconds from run start to the first expected one).
    A ROUTER_OWN code on an endpoint in `router_origins` (SGLang's router's) is the router's
    own and is counted as `<code>@router`, never as the code."""
    codes = {c: n for c, n in summary["counts"].items() if n and c in CORRUPTION_CODES}
    own = router_origins or set()
    wedge_codes = {
        f"{c}{ROUTER_MARK}" if c in ROUTER_OWN and origin(ep) in own else c
        for ep, found in (summary.get("wedge") or {}).items()
        for c in found.get("codes", [])
    }
    for c in wedge_codes:
        codes[c] = codes.get(c, 0) + 1
    times = [t for (_, _, code), t in corrupt_turns.items() if code in expect and t is not None]
    if expect & wedge_codes & set(WEDGE_CODES):
        start = _run_start(events)
        times += [(e["t_ns"] - start) / 1e9 for e in events if e["kind"] == "drain_end"]
    return codes, (min(times) if times else None)


def _run_start(events: list[dict]) -> int:
    return next(e["t_ns"] for e in events if e["kind"] == "run_start")


def keep_report(result: RunResult, dest: Path) -> None:
    """The run's report, summary and plots (not its full history) as an example under `dest`."""
    assert result.run_dir is not None
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("report.md", "summary.json"):
        shutil.copy2(result.run_dir / name, dest / name)
    if (result.run_dir / "plots").is_dir():
        shutil.copytree(result.run_dir / "plots", dest / "plots", dirs_exist_ok=True)


def table(results: list[RunResult], recipes: tuple[Recipe, ...], runs: int, router: str = "bundled") -> str:
    """The markdown table of a proof whose every run had `router` in front (ROUTERS)."""
    label = router_label(router)
    via = ["--engine-router", router] if router != "bundled" else []
    rows = [
        "| fault | router | expected code | found | codes seen (runs) | first detection, median (min-max) | recipe |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in recipes:
        mine = [x for x in results if x.recipe == r.fault and not x.clean]
        found = [x for x in mine if set(x.codes) & r.expect]
        seen: dict[str, int] = {}
        for x in mine:
            for c in x.codes:
                seen[c] = seen.get(c, 0) + 1
        times = [x.first_detection_s for x in found if x.first_detection_s is not None]
        when = f"{statistics.median(times):.1f} s ({min(times):.1f}-{max(times):.1f})" if times else "-"
        expect = ", ".join(sorted(r.expect))
        recipe = " ".join(
            [*(f"--engine-fault {f}" for f in r.faults), *(f"--engine-arg={a}" for a in r.engine), *r.load, *via]
        )
        if r.reference:
            compared = sum((x.reference or {}).get("compared", 0) for x in mine)
            mismatched = sum((x.reference or {}).get("mismatched", 0) for x in mine)
            reads = [x.unguarded_reads for x in mine if x.unguarded_reads is not None]
            expect += (
                f" against a clean reference run (same seed and settings, fault off): {mismatched} of "
                f"{compared} compared turns answered differently"
                + (f"; {min(reads)}-{max(reads)} unguarded index-K reads per run" if reads else "")
            )
            recipe += " --reference CLEAN_RUN"
        if ANSWER_CHANGED_CODE in r.expect:
            rechecked = [(x.triage or {}).get("recheck") or {} for x in mine]
            walls = [x.wall_s for x in mine]
            expect += (
                f" by --recheck in one run: {sum(c.get('changed', 0) for c in rechecked)} of "
                f"{sum(c.get('rechecked', 0) for c in rechecked)} rechecked turns answered differently alone"
                + (
                    f"; a run's wall {statistics.median(walls):.0f} s ({min(walls):.0f}-{max(walls):.0f})"
                    if walls
                    else ""
                )
            )
        rows.append(
            f"| `{r.fault}` | {label} | {expect} | {len(found)}/{len(mine)} | "
            f"{', '.join(f'{c} ({n})' for c, n in sorted(seen.items())) or 'none'} | {when} | `{recipe}` |"
        )
    clean = [x for x in results if x.clean]
    bad = [x for x in clean if x.codes or x.verdict not in ("CLEAN", "ERRORS")]
    seen_clean = sorted({c for x in clean for c in x.codes})
    rechecked = [r for x in clean if (r := (x.triage or {}).get("recheck"))]
    also = (
        f" ({sum(c.get('changed', 0) for c in rechecked)} of {sum(c.get('rechecked', 0) for c in rechecked)} "
        "rechecked turns answered differently alone)"
        if rechecked
        else ""
    )
    rows.append(
        f"| clean (recipes' settings, no fault) | {label} | none | {len(clean) - len(bad)}/{len(clean)} "
        f"clean{also} | {', '.join(seen_clean) or 'none'} | - | each recipe's engine and load, fault off |"
    )
    if any(c.endswith(ROUTER_MARK) for x in results for c in x.codes):
        marked = ", ".join(f"`{c}{ROUTER_MARK}`" for c in sorted(ROUTER_OWN))
        rows += [
            "",
            f"{marked}: SGLang's router answered its own /health 200 while the deployment behind it hung; "
            "it does so with or without a fault, so it finds none.",
        ]
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="Runs per fault; also the number of clean runs.")
    p.add_argument("--clean-runs", type=int, default=None, metavar="N", help="Clean runs, where not --runs.")
    p.add_argument("--only", action="append", default=[], help="Only this fault (repeatable).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the first run; run i uses seed + i.")
    p.add_argument("--timeout", type=float, default=300.0, help="Seconds one run may take before it is stopped.")
    p.add_argument("--table", type=Path, default=None, help="Also write the markdown table here.")
    p.add_argument(
        "--reports", type=Path, default=None, help="Keep the first run of each fault as <dir>/fault-<name>/."
    )
    p.add_argument("--no-clean", action="store_true", help="Skip the clean runs.")
    p.add_argument("--clean-all", action="store_true", help="Clean runs cycle through every recipe, not only --only's.")
    p.add_argument("--weights", type=Path, default=None, help="Weights for every engine; default: the shipped ones.")
    p.add_argument(
        "--router",
        choices=ROUTERS,
        default="bundled",
        help="What fronts every engine: its own server or router, or SGLang's real router "
        "(agents --engine-router sglang; pip install 'dsv4bench[sglang]').",
    )
    p.add_argument(
        "--recheck",
        type=float,
        default=None,
        metavar="F",
        help="Judge the faults that need a reference in one run instead: agents --recheck F on every run.",
    )
    p.add_argument(
        "--pool",
        choices=("small", "production"),
        default="small",
        help="hicache-index-race's device pool: small (a few hundred pages: every prefix comes back from host), "
        "or production (the engine's default 32,768 pages, the load sized by --cache-pressure to outgrow it; "
        "needs --recheck).",
    )
    a = p.parse_args()
    if a.recheck is not None and not 0 < a.recheck <= 1:
        p.error(f"--recheck takes a share from 0 (exclusive) to 1; got {a.recheck:g}")
    if a.pool == "production" and a.recheck is None:
        p.error("--pool production is judged by --recheck F")
    catalogue = tuple(production_pool(r) if a.pool == "production" else r for r in RECIPES)
    recipes = tuple(r.rechecked(a.recheck) for r in catalogue if not a.only or r.fault in a.only)
    clean_runs = a.runs if a.clean_runs is None else a.clean_runs
    if not recipes or a.runs < 1 or clean_runs < 0:
        p.error(f"nothing to run; faults: {', '.join(r.fault for r in RECIPES)}")
    results: list[RunResult] = []
    plan = [(r, False, i) for r in recipes for i in range(a.runs)]
    if not a.no_clean:
        pool = tuple(r.rechecked(a.recheck) for r in catalogue) if a.clean_all else recipes
        plan += [(pool[i % len(pool)], True, i) for i in range(clean_runs)]
    references: dict[tuple[str, int], RunResult] = {}  # (recipe, seed) -> its clean reference run
    with tempfile.TemporaryDirectory(prefix="dsv4bench-proof-") as tmp:

        def one(recipe: Recipe, clean: bool, i: int, label: str, reference: Path | None = None) -> RunResult:
            out = Path(tmp) / f"{recipe.fault}-{label}-{i}"
            out.mkdir()
            res = run_once(recipe, clean, a.seed + i, out, a.timeout, a.weights, reference, a.router)
            results.append(res)
            found = sorted(set(res.codes) & recipe.expect) if not clean else []
            ref = (
                ""
                if res.reference is None
                else (f" reference: {res.reference['mismatched']} of {res.reference['compared']} compared turns differ")
            )
            print(
                f"{recipe.fault} {label} run {i + 1}: {res.verdict} codes={res.codes or {}} found={found or '-'} "
                f"first={res.first_detection_s} wall={res.wall_s:.0f}s{' error: ' + res.error if res.error else ''}"
                f"{'' if res.unguarded_reads is None else f' unguarded index-K reads={res.unguarded_reads}'}{ref}",
                file=sys.stderr,
                flush=True,
            )
            return res

        for n, (recipe, clean, i) in enumerate(plan, 1):
            print(f"[{n}/{len(plan)}]", file=sys.stderr, flush=True)
            reference = None
            if recipe.reference:
                if (recipe.fault, i) not in references:
                    references[(recipe.fault, i)] = one(recipe, True, i, "reference")
                reference = references[(recipe.fault, i)].run_dir
                if reference is None:
                    continue  # the reference run failed; it shows in the table as a failed clean run
            res = one(recipe, clean, i, "clean" if clean else "fault", reference)
            if a.reports and not clean and i == 0 and res.run_dir is not None:
                keep_report(res, a.reports / f"fault-{recipe.fault}")
    text = table(results, recipes, a.runs, a.router)
    print(text)
    if a.table:
        a.table.write_text(text + "\n", encoding="utf-8")
    found = {
        r.fault: sum(1 for x in results if x.recipe == r.fault and not x.clean and set(x.codes) & r.expect)
        for r in recipes
    }
    missed = [r for r in recipes if found[r.fault] < a.runs]
    dirty = [x for x in results if x.clean and (x.codes or x.verdict not in ("CLEAN", "ERRORS"))]
    return 1 if missed or dirty else 0


if __name__ == "__main__":
    sys.exit(main())
