"""The texts DSV4-mini's byte-level BPE is trained on (scripts/train_tokenizer.py): DSV4 prompts
rendered by deepseek-recipe from the scenario packs' expert sessions, half of them in thinking
mode, and a few hand-written lines of Chinese and code that broaden the byte merges beyond the
scenarios' English."""

from __future__ import annotations

from collections.abc import Iterator

import deepseek_recipe as dr

from ...agents import FAMILIES, play_expert, session_messages

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
            MODEL_ALIAS, dr.ModelVersion.DeepseekV4Pro
        )
        for thinking in (False, True)
    }
    for family in FAMILIES.values():
        tools = family.openai_tools()
        for seed in range(first_seed, first_seed + seeds):
            body = {"model": MODEL_ALIAS, "messages": session_messages(play_expert(family, seed)), "tools": tools}
            conv = dr.ChatCompletionRequest(body).convert(options[seed % 2 == 1])
            yield encoding.render_conversation(conv.conversation).prompt
