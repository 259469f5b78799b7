"""Recall and false alarms of the markup and finish-reason checkers over every family's fixtures.

    python scripts/bench_verdicts.py [--family-unknown] [--json]

Runs every case of tests/fixtures/family_markup.py through all the checkers and prints, per
family: failure cases caught (with one of their expected codes) over all failure cases, and clean
cases flagged (with any corruption code) over all clean cases. `--family-unknown` judges every
case without telling the checkers the server's family (every family is then checked). The corpus
builds contexts the way an older TurnContext takes them too, so the same command measures an
older tree (`PYTHONPATH=<its checkout>`).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from fixture_loader import load_fixture

from dsv4bench.checks import run_checks
from dsv4bench.history.codes import CORRUPTION_CODES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family-unknown", action="store_true", help="do not tell the checkers the family")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--misses", action="store_true", help="list every missed and every falsely flagged case")
    args = ap.parse_args()
    corpus = load_fixture("family_markup")
    rows: dict[str, dict[str, int]] = defaultdict(lambda: {"leaks": 0, "caught": 0, "clean": 0, "flagged": 0})
    wrong: list[str] = []
    for case in corpus.corpus():
        verdicts, errors = run_checks(case.context(family_known=not args.family_unknown))
        got = {v.code for v in verdicts} & set(CORRUPTION_CODES)
        row = rows[case.family]
        if case.leak:
            row["leaks"] += 1
            hit = bool(got & case.codes)
            row["caught"] += hit
            if not hit:
                wrong.append(
                    f"missed   {case.family}: {case.name} (got {sorted(got) or 'nothing'}{', errors' if errors else ''})"
                )
        else:
            row["clean"] += 1
            row["flagged"] += bool(got)
            if got:
                wrong.append(f"flagged  {case.family}: {case.name} ({sorted(got)})")
    total = {k: sum(r[k] for r in rows.values()) for k in ("leaks", "caught", "clean", "flagged")}
    if args.json:
        print(json.dumps({"families": rows, "total": total}, indent=2))
    else:
        print(f"{'family':14} {'recall':>12} {'false alarms':>14}")
        for fam, r in [*rows.items(), ("all", total)]:
            print(
                f"{fam:14} {r['caught']:>5}/{r['leaks']:<3} {r['caught'] / r['leaks']:>4.0%}"
                f" {r['flagged']:>6}/{r['clean']:<3} {r['flagged'] / r['clean']:>4.0%}"
            )
    if args.misses:
        print("\n".join(wrong))


if __name__ == "__main__":
    main()
