"""On-policy training data for DSV4-mini (engine/training/onpolicy.py): the model plays sessions
on training seeds through the real server, then the expert takes over from the states the
model reached, and the relabelled sessions are encoded as a training corpus.

    python scripts/onpolicy_corpus.py --rollouts runs/train/rollouts.jsonl --sessions 600 \
        --family ops --family data [--weights W | --url URL] [--temperature 0 --temperature 0.8] \
        [--out runs/train/onpolicy.npz [--mix corpus.npz --mix-sessions 3000]]

Rollouts are appended to the --rollouts file one line per finished session, so a run that dies
loses nothing and a rerun plays only the sessions still missing. With --out the corpus is
built from every rollout in the file; --mix adds a random subset of another corpus's sessions.
With --stats it prints how the rollouts went, per temperature and family: tool-call turns the
harness's call gate accepts, sessions with a refused call, final answers and solved tasks.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import httpx


from dsv4bench.agents import FAMILIES
from dsv4bench.wire.turn_answer import Deadlines
from dsv4bench.harness.driver import play_session
from dsv4bench.engine.training.onpolicy import Rollout, relabel, score
from dsv4bench.harness.session import AgentSession, SessionConfig

# Seeds no other corpus uses: expert corpora start at 100000 and run a few thousand seeds.
ONPOLICY_SEED_BASE = 500_000


async def play(
    url: str,
    jobs: list[tuple[str, int, float]],
    concurrency: int,
    max_turns: int,
    context: int | None,
    out: Path,
    minutes: float | None,
) -> None:
    """Play every (family, seed, temperature) job, `concurrency` at a time, appending each
    finished session to `out` at once; after `minutes`, sessions still in play are dropped."""
    done = 0
    t0 = time.monotonic()
    lock = anyio.Lock()
    async with httpx.AsyncClient(
        timeout=600, trust_env=False, limits=httpx.Limits(max_connections=concurrency + 4)
    ) as client:
        sem = anyio.Semaphore(concurrency)

        async def one(family: str, seed: int, temperature: float) -> None:
            nonlocal done
            async with sem:
                config = SessionConfig(
                    model="dsv4-mini", max_turns=max_turns, context_tokens=context, temperature=temperature
                )
                sess = AgentSession(f"onpolicy-{family}-{seed}", FAMILIES[family], seed, config)
                await play_session(client, url, sess, Deadlines(300, 600))
            line = json.dumps(Rollout(family, seed, temperature, sess.messages).to_json(), ensure_ascii=False)
            async with lock:
                with out.open("a") as f:
                    f.write(line + "\n")
                done += 1
                if done % 10 == 0 or done == len(jobs):
                    rate = done / (time.monotonic() - t0)
                    print(f"  {done}/{len(jobs)} sessions played, {rate * 60:.1f}/min", flush=True)

        with anyio.move_on_after(minutes * 60 if minutes else None) as scope:
            async with anyio.create_task_group() as tg:
                for job in jobs:
                    tg.start_soon(one, *job)
        if scope.cancelled_caught:
            print(f"  time is up: {done} of {len(jobs)} sessions played; a rerun plays the rest", flush=True)


def read_rollouts(path: Path) -> list[Rollout]:
    """Every whole line of the file; a line cut short by a crash is skipped."""
    rollouts = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rollouts.append(Rollout.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
    return rollouts


def build(rollouts: list[Rollout], out: Path, mix: Path | None, mix_sessions: int, seed: int) -> None:
    from dsv4bench.engine.frontend import Frontend, RequestError
    from dsv4bench.engine.tokenizer import load_tokenizer
    from dsv4bench.engine.training.corpus import encode_messages, read_corpus, write_corpus

    frontend = Frontend(load_tokenizer())
    rng = random.Random(seed)
    why: Counter[str] = Counter()
    encoded = []
    for r in rollouts:
        relabelled, reason = relabel(r, rng)
        why[reason or "relabelled"] += 1
        for x in relabelled:
            try:
                encoded.append(encode_messages(frontend, x.family, x.seed, x.messages, set(x.no_loss)))
            except RequestError:  # past the model's context
                why["too long"] += 1
    print(
        f"{len(rollouts)} rollouts: "
        + ", ".join(f"{k} {v}" for k, v in why.most_common())
        + f"; {len(encoded)} relabelled sessions"
    )
    if mix is not None:
        base = read_corpus(mix)
        encoded += rng.sample(base, min(mix_sessions, len(base)))
        rng.shuffle(encoded)
    summary = write_corpus(encoded, out)
    print(f"wrote {out}: {summary}")


def stats(rollouts: list[Rollout]) -> list[str]:
    """A table of how the rollouts went, one row per (temperature, family) and one per temperature."""
    groups: dict[tuple[float, str], Counter[str]] = {}
    for r in rollouts:
        sc = score(r)
        for key in ((r.temperature, r.family), (r.temperature, "all")):
            c = groups.setdefault(key, Counter())
            c["sessions"] += 1
            c["turns"] += sc.turns
            c["call_turns"] += sc.call_turns
            c["bad_turns"] += sc.bad_turns
            c["bad_sessions"] += sc.bad_turns > 0
            c["final"] += sc.final_answer
            c["solved"] += sc.solved
    lines = [
        f"{'T':>4} {'family':<7} {'sessions':>8} {'turns':>6} {'valid tool-call turns':>24} "
        f"{'with a refused call':>19} {'final':>6} {'solved':>6}"
    ]
    for (t, fam), c in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == "all", kv[0][1])):
        ok = c["call_turns"] - c["bad_turns"]
        share = f"{ok / c['call_turns']:.2%}" if c["call_turns"] else "-"
        valid = f"{ok}/{c['call_turns']} = {share}"
        lines.append(
            f"{t:>4g} {fam:<7} {c['sessions']:>8} {c['turns']:>6} {valid:>24} "
            f"{c['bad_sessions']:>19} {c['final']:>6} {c['solved']:>6}"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=Path, required=True, help="JSONL file of rollouts, appended to.")
    p.add_argument(
        "--sessions", type=int, default=0, help="Sessions per family and temperature to play (0: play none)."
    )
    p.add_argument(
        "--family", action="append", choices=sorted(FAMILIES), help="Family to play (repeatable; default all)."
    )
    p.add_argument("--temperature", type=float, action="append", help="Sampling temperature (repeatable; default 0).")
    p.add_argument("--first-seed", type=int, default=ONPOLICY_SEED_BASE)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=16)
    p.add_argument("--url", default=None, help="A running server; default: start the bundled engine.")
    p.add_argument("--weights", type=Path, default=None, help="Weights for the started engine.")
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        help="Extra flag for the started engine, repeatable, e.g. --engine-arg=--device=cuda.",
    )
    p.add_argument(
        "--minutes", type=float, default=None, help="Stop playing after this long (finished sessions are kept)."
    )
    p.add_argument("--out", type=Path, default=None, help="Write the relabelled corpus here.")
    p.add_argument("--mix", type=Path, default=None, help="Add sessions drawn from this corpus.")
    p.add_argument("--mix-sessions", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0, help="Seed for takeover points and the mix draw.")
    p.add_argument("--stats", action="store_true", help="Print how the rollouts in the file went.")
    a = p.parse_args()
    if a.sessions < 0 or a.concurrency < 1 or a.max_turns < 1 or (a.minutes is not None and a.minutes <= 0):
        p.error("--sessions must be >= 0, --concurrency and --max-turns >= 1, --minutes > 0")
    if a.mix is not None and not a.mix.is_file():
        p.error(f"--mix {a.mix}: no such file")
    temps = a.temperature or [0.0]
    have = {(r.family, r.seed, r.temperature) for r in read_rollouts(a.rollouts)}
    # Each temperature gets its own seeds (T=0.7 from first seed + 700000), so greedy and
    # sampled sessions never replay the same task.
    jobs = [
        (f, a.first_seed + round(t * 1000) * 1000 + i, t)
        for t in temps
        for i in range(a.sessions)
        for f in (a.family or FAMILIES)
    ]
    jobs = [j for j in jobs if j not in have]
    if jobs:
        from dsv4bench.engine.launcher import EngineStartError, start_engine
        from dsv4bench.servers.preflight import server_facts

        a.rollouts.parent.mkdir(parents=True, exist_ok=True)
        engine = None
        if a.url is None:
            try:
                engine = start_engine([*(["--weights", str(a.weights)] if a.weights else []), *a.engine_arg])
            except EngineStartError as exc:
                sys.exit(f"onpolicy_corpus: {exc}")
        url = (a.url or engine.url).rstrip("/")
        print(f"playing {len(jobs)} sessions ({len(have)} already in {a.rollouts})", flush=True)
        try:
            anyio.run(
                play,
                url,
                jobs,
                a.concurrency,
                a.max_turns,
                server_facts(url).get("context_length"),
                a.rollouts,
                a.minutes,
            )
        finally:
            if engine:
                engine.stop()
    if a.stats or a.out is not None:
        rollouts = read_rollouts(a.rollouts)
        if not rollouts:
            p.error(f"no rollouts in {a.rollouts}")
        if a.stats:
            print("\n".join(stats(rollouts)))
        if a.out is not None:
            build(rollouts, a.out, a.mix, a.mix_sessions, a.seed)


if __name__ == "__main__":
    main()
