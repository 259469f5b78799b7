"""Engine edge fuzz: every hostile request of tests/fixtures/hostile_requests.py (a few thousand:
huge integers, 401- and 5,000-digit numbers, NaN, nesting of 5,000, lone surrogates, wrong
types, non-JSON, bodies at the size limit, the seed that killed the loop, /abort_request on
every port, random mutants) against `dsv4bench engine serve`, unified and `--pd`, each started
here on loopback with the shipped weights (or against servers given with --url).

A correct engine answers none with a 5xx, every 4xx with an OpenAI-style JSON error naming the
field at fault, ends every served stream with [DONE], and is healthy afterwards (every /health
200, a normal chat answered). Prints the counts per class and status and every wrong answer;
exit status 1 if there was one.

    python scripts/fuzz_engine.py [--mode single|pd|both] [--mutants 2400] [--seed 0]
    python scripts/fuzz_engine.py --url http://127.0.0.1:30000 [--max-body-bytes N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

import httpx

from fixture_loader import load_fixture

from dsv4bench.engine.launcher import start_engine
from dsv4bench.engine.server import ServerConfig


_hostile = load_fixture("hostile_requests")
CHAT, all_cases, base, dumps, send = (_hostile.CHAT, _hostile.all_cases, _hostile.base, _hostile.dumps, _hostile.send)


def fuzz(roots: dict[str, str], pd: bool, max_body_bytes: int, seed: int, mutants: int, label: str) -> int:
    """Send every case; print the figures; return the number of wrong answers."""
    cases = all_cases(max_body_bytes, pd=pd, seed=seed, mutant_count=mutants)
    counts: Counter[tuple[str, int]] = Counter()
    wrong: list[str] = []
    start = time.monotonic()
    with httpx.Client(timeout=120) as client:
        for case in cases:
            outcome = send(client, roots[case.port], case)
            counts[(case.cls, outcome.status)] += 1
            if outcome.problem:
                wrong.append(f"  {case.label[:140]}: {outcome.problem[:300]}")
    elapsed = time.monotonic() - start
    health = {port: httpx.get(f"{root}/health", timeout=30).status_code for port, root in roots.items()}
    after = httpx.post(f"{roots['api']}{CHAT}", content=dumps(base(CHAT)), timeout=60).status_code
    statuses = sorted({s for _, s in counts})
    print(
        f"\n{label}: {len(cases)} requests in {elapsed:.0f} s; wrong answers: {len(wrong)}; "
        f"/health after: {health}; a normal chat after: {after}"
    )
    print("| class | " + " | ".join(str(s) for s in statuses) + " |")
    print("|---|" + "---:|" * len(statuses))
    for cls in sorted({c for c, _ in counts}):
        print(f"| {cls} | " + " | ".join(str(counts.get((cls, s), "")) for s in statuses) + " |")
    print("| all | " + " | ".join(str(sum(n for (_, st), n in counts.items() if st == s)) for s in statuses) + " |")
    for line in wrong[:40]:
        print(line)
    return len(wrong) + sum(code != 200 for code in health.values()) + (after != 200)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("single", "pd", "both"), default="both")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mutants", type=int, default=2400)
    ap.add_argument("--url", help="fuzz this server root instead of starting one (with --prefill/--decode: PD)")
    ap.add_argument("--prefill", help="the PD prefill server's root (with --url)")
    ap.add_argument("--decode", help="the PD decode server's root (with --url)")
    ap.add_argument(
        "--max-body-bytes",
        type=int,
        default=ServerConfig().max_body_bytes,
        help="the server's body limit (the size cases sit at it)",
    )
    ap.add_argument(
        "--engine-arg",
        action="append",
        default=["--num-pages", "4096"],
        help="extra flag for `engine serve`, repeatable",
    )
    args = ap.parse_args()
    if args.url:
        roots = {"api": args.url.rstrip("/")}
        pd = bool(args.prefill and args.decode)
        if pd:
            roots |= {"prefill": args.prefill.rstrip("/"), "decode": args.decode.rstrip("/")}
        return 1 if fuzz(roots, pd, args.max_body_bytes, args.seed, args.mutants, args.url) else 0
    failures = 0
    for mode in ("single", "pd") if args.mode == "both" else (args.mode,):
        flags = [*args.engine_arg, *(["--pd"] if mode == "pd" else [])]
        with start_engine(flags) as ep:
            roots = dict(zip(("api", "prefill", "decode"), ep.roots))
            failures += fuzz(
                roots,
                mode == "pd",
                args.max_body_bytes,
                args.seed,
                args.mutants,
                f"dsv4bench engine serve {' '.join(flags)}",
            )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
