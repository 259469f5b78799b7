"""Train DSV4-mini's byte-level BPE on DSV4 prompts rendered from the scenario packs' expert
sessions and write `engine/assets/tokenizer.json`.

Each expert session becomes an OpenAI chat transcript (system, user, assistant tool calls,
tool results, final answer), which deepseek-recipe renders as a full DSV4 conversation, half
of them in thinking mode so both prompt shapes are covered. A few hand-written lines of
Chinese and code broaden the byte merges beyond the scenarios' English.

    python scripts/train_tokenizer.py [--seeds 300] [--first-seed 0] [--digit-groups 0] [--out engine/assets/tokenizer.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dsv4bench.engine.config import ModelConfig
from dsv4bench.engine.tokenizer import DEFAULT_PATH, load_tokenizer, train_bpe
from dsv4bench.engine.training.tokenizer_corpus import EXTRA_TEXT, rendered_prompts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=300, help="expert sessions per scenario family")
    p.add_argument("--vocab-size", type=int, default=ModelConfig().vocab_size)
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="first expert-session seed (the engine's training seeds start at 100000; 0-99999 are held out)",
    )
    p.add_argument(
        "--digit-groups",
        type=int,
        default=0,
        help="cut digit runs into pieces of at most N digits before the merges (DeepSeek: 3); 0: whole numbers",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_PATH)
    a = p.parse_args(argv)
    if a.digit_groups < 0 or a.seeds < 1 or a.first_seed < 0:
        p.error("--digit-groups, --first-seed must be >= 0 and --seeds >= 1")

    t0 = time.monotonic()
    corpus = list(rendered_prompts(a.seeds, a.first_seed)) + EXTRA_TEXT * 20
    t1 = time.monotonic()
    tok = train_bpe(corpus, a.vocab_size, a.digit_groups)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(a.out), pretty=False)
    t2 = time.monotonic()

    loaded = load_tokenizer(a.out)  # also checks that deepseek-recipe accepts the file
    sample = corpus[0]
    ratio = len(sample) / len(loaded.encode(sample))
    chars = sum(map(len, corpus))
    print(
        f"{len(corpus)} texts, {chars / 1e6:.1f}M chars rendered in {t1 - t0:.1f}s; "
        f"trained {loaded.vocab_size} tokens in {t2 - t1:.1f}s; {ratio:.2f} chars/token; wrote {a.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
