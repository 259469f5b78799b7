"""Evaluate the bundled DSV4-mini as an agent, through the real server: held-out seeds,
greedy decoding, one session at a time.

For each family it reports:
  - tool-call turns whose every call is well-formed and schema-valid (no args_not_json,
    schema_violation, unknown_tool, dsml_* verdict), as a share of turns that called tools;
  - DSML well-formedness: turns with no dsml_* verdict, as a share of all turns;
  - sessions that reach the expert's final state (the family's own `solved` check);
  - turns, and sessions that ended with a final answer.

    python scripts/eval_engine.py [--seeds 20] [--first-seed 0] [--url URL | --weights W]   (no --url: starts the engine)
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import anyio

from dsv4bench.agents import FAMILIES
from dsv4bench.engine.training.config import TRAIN_SEED_BASE
from dsv4bench.engine.training.evaluation import eval_family
from dsv4bench.servers.preflight import server_facts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--seeds", type=int, default=20, help="held-out seeds per family (seeds 0..N-1; training uses 100000+)"
    )
    p.add_argument("--first-seed", type=int, default=0, help="Start at this held-out seed instead of 0.")
    p.add_argument("--max-turns", type=int, default=16)
    p.add_argument("--url", default=None)
    p.add_argument("--json", type=Path, default=None, help="Also write per-family figures and every flagged turn here.")
    p.add_argument(
        "--weights", type=Path, default=None, help="Weights for the started engine; default: the shipped ones."
    )
    p.add_argument("--family", action="append", choices=sorted(FAMILIES), help="Only this family (repeatable).")
    a = p.parse_args()
    if a.seeds < 1 or a.first_seed < 0 or a.first_seed + a.seeds > TRAIN_SEED_BASE:
        p.error(f"--first-seed and --seeds must pick held-out seeds, within 0..{TRAIN_SEED_BASE - 1}")
    engine = None
    if a.url is None:
        from dsv4bench.engine.launcher import start_engine

        engine = start_engine(["--num-pages", "8192", *(["--weights", str(a.weights)] if a.weights else [])])
    url = (a.url or engine.url).rstrip("/")
    t0 = time.monotonic()
    try:
        context = server_facts(url).get("context_length")  # sessions end before it, as in `dsv4bench agents`
        rows = [
            anyio.run(eval_family, url, f, range(a.first_seed, a.first_seed + a.seeds), a.max_turns, context)
            for f in (a.family or FAMILIES)
        ]
    finally:
        if engine:
            engine.stop()
    tot: Counter[str] = Counter()
    print(f"{'family':<8} {'sessions':>8} {'turns':>6} {'valid calls':>12} {'DSML ok':>8} {'solved':>7} {'final':>6}")
    for r in rows:
        tot.update({k: v for k, v in r.items() if isinstance(v, int)})
        print(
            f"{r['family']:<8} {r['sessions']:>8} {r['turns']:>6} "
            f"{r['call_turns_valid']}/{r['call_turns']} {r['dsml_clean'] / r['turns']:>8.1%} "
            f"{r['solved'] / r['sessions']:>7.0%} {r['final'] / r['sessions']:>6.0%}"
        )
    print(
        f"all: {tot['call_turns_valid'] / tot['call_turns']:.2%} of tool-call turns well-formed and schema-valid; "
        f"DSML well-formed in {tot['dsml_clean'] / tot['turns']:.2%} of turns; {tot['solved']}/{tot['sessions']} "
        f"sessions reached the expert's final state; {time.monotonic() - t0:.0f} s"
    )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
