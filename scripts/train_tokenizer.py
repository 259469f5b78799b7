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
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import deepseek_recipe as dr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsv4bench.agents import FAMILIES, play_expert, session_messages  # noqa: E402
from dsv4bench.engine.config import ModelConfig  # noqa: E402
from dsv4bench.engine.tokenizer import DEFAULT_PATH, load_tokenizer, train_bpe  # noqa: E402

MODEL_ALIAS = "dsv4-mini"

# Not in the scenarios, but users type them: a little goes a long way for byte-level merges.
EXTRA_TEXT = [
    "你好，请帮我检查一下这个函数为什么测试失败。我们需要修复代码中的错误，然后运行全部测试。",
    "数据库查询返回了空结果：请确认表名和过滤条件是否正确，并给出最终的总结。",
    "服务在高并发下出现超时，请查看日志、重启服务并确认健康检查通过。",
    "def main(argv: list[str] | None = None) -> int:\n    args = parse(argv)\n    return run(args)\n",
    "for (int i = 0; i < n; ++i) { total += values[i]; }\nreturn total;\n",
    'SELECT name, COUNT(*) AS n FROM orders WHERE status = "paid" GROUP BY name ORDER BY n DESC;',
]


def rendered_prompts(seeds: int, first_seed: int = 0) -> Iterator[str]:
    """DSV4 prompts of `seeds` expert sessions per family, alternating thinking mode."""
    encoding = dr.DeepseekV4Encoding()
    options = {
        thinking: dr.ConversionOptions(default_thinking_mode=thinking).with_model_alias(
            MODEL_ALIAS, dr.ModelVersion.DeepseekV4Pro)
        for thinking in (False, True)
    }
    for family in FAMILIES.values():
        tools = family.openai_tools()
        for seed in range(first_seed, first_seed + seeds):
            body = {"model": MODEL_ALIAS, "messages": session_messages(play_expert(family, seed)), "tools": tools}
            conv = dr.ChatCompletionRequest(body).convert(options[seed % 2 == 1])
            yield encoding.render_conversation(conv.conversation).prompt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=300, help="expert sessions per scenario family")
    p.add_argument("--vocab-size", type=int, default=ModelConfig().vocab_size)
    p.add_argument("--first-seed", type=int, default=0,
                   help="first expert-session seed (the engine's training seeds start at 100000; 0-99999 are held out)")
    p.add_argument("--digit-groups", type=int, default=0,
                   help="cut digit runs into pieces of at most N digits before the merges (DeepSeek: 3); 0: whole numbers")
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
    print(f"{len(corpus)} texts, {chars / 1e6:.1f}M chars rendered in {t1 - t0:.1f}s; "
          f"trained {loaded.vocab_size} tokens in {t2 - t1:.1f}s; {ratio:.2f} chars/token; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
