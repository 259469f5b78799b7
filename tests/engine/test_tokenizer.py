"""The committed DSV4-mini tokenizer: special tokens, round trips, compression, recipe compatibility."""

from __future__ import annotations

import deepseek_recipe as dr
import pytest
from tokenizers import Tokenizer

from dsv4bench.agents import FAMILIES, play_expert, session_messages
from dsv4bench.engine.config import ModelConfig
from dsv4bench.engine.tokenizer import DEFAULT_PATH, SPECIAL_TOKEN_KINDS, SPECIAL_TOKENS, load_tokenizer, train_bpe

DSML_CALL = (
    '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read_file">\n'
    '<｜DSML｜parameter name="path" string="true">src/main.py</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="start_line" string="false">12</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)
TEXTS = [
    "你好，世界！请把第 3 行改成 `acc += value`。测试全部通过了吗？",
    "def running_total(values: list[int]) -> list[int]:\n\tacc = 0\n    return [acc := acc + v for v in values]\n",
    DSML_CALL,
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>plan</think>ok<｜end▁of▁sentence｜>",
    "emoji 🚀 and combining é, trailing spaces   \n\n",
]
OPTIONS = dr.ConversionOptions(default_thinking_mode=False).with_model_alias("dsv4-mini", dr.ModelVersion.DeepseekV4Pro)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _conversation(family: str, seed: int) -> dr.ConversationRequest:
    fam = FAMILIES[family]
    body = {"model": "dsv4-mini", "messages": session_messages(play_expert(fam, seed)), "tools": fam.openai_tools()}
    return dr.ChatCompletionRequest(body).convert(OPTIONS)


def test_every_special_token_is_one_id(tok):
    assert tok.vocab_size == ModelConfig().vocab_size
    assert len(SPECIAL_TOKEN_KINDS) == 18
    for kind in SPECIAL_TOKEN_KINDS:
        spelling = getattr(dr.SpecialToken, kind).default_str()
        assert tok.encode(spelling) == [tok.special_ids[spelling]]
        assert tok.special_id(kind) == tok.special_id(getattr(dr.SpecialToken, kind)) == tok.special_ids[spelling]
    assert tok.eos_token_id == tok.special_id("Eos") and tok.bos_token_id == tok.special_id("Bos")


def test_dsml_marker_is_special_inside_tags(tok):
    ids = tok.encode('<｜DSML｜invoke name="x">')
    dsml = tok.special_id("Dsml")
    assert ids[0] == tok.encode("<")[0] and ids[1] == dsml and dsml not in ids[2:]
    assert tok.decode(ids) == '<｜DSML｜invoke name="x">'


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_skip_special_tokens_drops_markers(tok):
    assert tok.decode(tok.encode("a</think>b<｜end▁of▁sentence｜>"), skip_special_tokens=True) == "ab"


def test_recipe_prompt_encoding_matches_and_compresses(tok):
    conv = _conversation("data", 7)
    prompt = dr.DeepseekV4Encoding().render_conversation(conv.conversation).prompt
    ids = dr.DeepseekV4Encoding().with_tokenizer(tok.recipe).encode(conv.conversation)
    # The renderer's special ranges are exactly the ids the full vocabulary finds in its output.
    assert ids == tok.encode(prompt)
    assert tok.decode(ids) == prompt
    cut = prompt[:10_000]
    assert len(cut) / len(tok.encode(cut)) >= 3.0


def test_prompt_encoding_keeps_user_spellings_plain(tok):
    body = {"model": "dsv4-mini", "messages": [{"role": "user", "content": "say </think> please"}]}
    conv = dr.ChatCompletionRequest(body).convert(OPTIONS)
    ids = dr.DeepseekV4Encoding().with_tokenizer(tok.recipe).encode(conv.conversation)
    think_end = tok.special_id("ThinkingEnd")
    assert ids.count(think_end) == 1  # only the renderer's own, after <｜Assistant｜>
    assert tok.encode("say </think> please").count(think_end) == 1  # the raw path spells it special


def test_both_libraries_load_the_committed_file(tok):
    hf = Tokenizer.from_file(str(DEFAULT_PATH))
    recipe = dr.Tokenizer.from_file(str(DEFAULT_PATH))
    for text in TEXTS:
        assert recipe.encode(text) == hf.encode(text, add_special_tokens=False).ids == tok.encode(text)


def test_training_is_fast_and_puts_specials_first():
    corpus = ["hello world " * 50, DSML_CALL * 20, TEXTS[0] * 20]
    trained = train_bpe(corpus, vocab_size=400)
    assert [trained.token_to_id(s) for s in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert trained.get_vocab_size() <= 400


def test_digit_groups_cut_numbers_and_both_libraries_agree(tmp_path):
    """With digit groups of 3 no token holds more than 3 digits (whole numbers would, since the
    corpus repeats them), and deepseek-recipe reads the saved file exactly as `tokenizers` does."""
    import re

    corpus = [f"amount {n}.92 rows {n % 97}\n" * 30 for n in (5479, 4825, 3174, 1234567)] + [DSML_CALL * 20]
    whole = train_bpe(corpus, vocab_size=600)
    grouped = train_bpe(corpus, vocab_size=600, digit_groups=3)
    longest = lambda t: max(len(d) for k in t.get_vocab() for d in re.findall(r"\d+", k))
    assert longest(whole) >= 4 and longest(grouped) == 3
    path = tmp_path / "tokenizer.json"
    grouped.save(str(path))
    loaded = load_tokenizer(path)
    text = "The largest order was 5479.92 USD (1234567 rows) on 2024-06."
    ids = loaded.encode(text)
    assert loaded.recipe.encode(text) == ids and loaded.decode(ids) == text
    assert all(len(d) <= 3 for i in ids for d in re.findall(r"\d+", loaded.decode([i])))
