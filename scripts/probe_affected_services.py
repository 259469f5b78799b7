"""Does the model write an ops incident's root cause as the second affected service when the
context is the expert's own session?

In the closed loop the model opens dependency incidents as `[symptom, symptom]` and repeats the
refused call (bench-plan.md). This probe separates two causes: a model that cannot write
`[symptom, root]` at all, and one that can but drifts there on its own trajectory. For each
held-out ops task whose root cause is not the alerting service it encodes the expert's session
as the server would, finds the token that starts the second list item of `open_incident`'s
`affected_services`, and reports the model's greedy token and the expert's token's probability
there (teacher-forced, the prefix served as the engine serves it: chunked prefill, paged sparse
attention; CPU).

    python scripts/probe_affected_services.py [--weights W] [--sessions 12]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


from dsv4bench.agents import FAMILIES
from dsv4bench.engine.config import ModelConfig
from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.offline import greedy_answers
from dsv4bench.engine.tokenizer import DSV4Tokenizer, load_tokenizer
from dsv4bench.engine.training.corpus import encode_session
from dsv4bench.engine.weights import DEFAULT_WEIGHTS, WeightsError, load_weights


def dependency_seeds(n: int) -> list[int]:
    """The first `n` held-out ops seeds whose root cause is not the alerting service."""
    ops, seeds, seed = FAMILIES["ops"], [], 0
    while len(seeds) < n:
        goal = ops.make_task(ops.build_world(seed), seed).goal
        if goal["root"] != goal["symptom"]:
            seeds.append(seed)
        seed += 1
    return seeds


def second_item_position(tok: DSV4Tokenizer, ids: list[int], symptom: str) -> int | None:
    """Index of the token that starts the list's second item, after `["symptom", "`."""
    text = tok.decode(ids)
    at = text.rfind(f'["{symptom}", "')
    if at < 0:
        return None
    chars = at + len(symptom) + 6
    lo, hi = 0, len(ids)
    while lo < hi:  # the shortest prefix whose text runs past `chars`
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(tok.decode(ids[:mid])) > chars else (mid + 1, hi)
    return lo - 1


def probe(model, frontend: Frontend, seed: int) -> dict | None:
    tok = frontend.tokenizer
    goal = FAMILIES["ops"].make_task(FAMILIES["ops"].build_world(seed), seed).goal
    ids = encode_session(frontend, "ops", seed).ids
    p = second_item_position(tok, ids, goal["symptom"])
    if p is None:
        return None
    [(_, [row])] = greedy_answers(model, [ids[:p]], 1)
    probs = torch.softmax(row.float(), -1)
    greedy = int(probs.argmax())
    return {
        "seed": seed,
        "symptom": goal["symptom"],
        "root": goal["root"],
        "expert": tok.decode([ids[p]]),
        "greedy": tok.decode([greedy]),
        "right": greedy == ids[p],
        "p_expert": float(probs[ids[p]]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--sessions", type=int, default=12, help="held-out dependency tasks to probe")
    a = ap.parse_args(argv)
    if a.sessions < 1:
        ap.error("--sessions must be at least 1")
    try:
        model = load_weights(ModelConfig(), a.weights).eval()
    except WeightsError as e:
        ap.error(str(e))
    frontend = Frontend(load_tokenizer())
    results = []
    for seed in dependency_seeds(a.sessions):  # each line as it comes: a session takes seconds on CPU
        if r := probe(model, frontend, seed):
            results.append(r)
            print(
                f"seed {r['seed']:>3}  {r['symptom']} <- {r['root']}: expert {r['expert']!r}, "
                f"greedy {r['greedy']!r}, p(expert) {r['p_expert']:.2f}",
                flush=True,
            )
    right = sum(r["right"] for r in results)
    print(f"greedy writes the root in {right} of {len(results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
