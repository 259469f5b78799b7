"""DSV4-mini's tokenizer: a byte-level BPE (`tokenizers`) with DSV4's special tokens.

The special tokens are every `deepseek_recipe.SpecialToken`, spelled as deepseek-recipe spells
them, added as special tokens (single ids, matched before pre-tokenization). `｜DSML｜` is one
of them and sits *inside* tags (`<｜DSML｜invoke name="x">`): the added-token split leaves `<`
and `invoke name="x">` as plain text on either side, which is exactly how deepseek-recipe's
prompt encoding treats it (its `special_ranges` mark `｜DSML｜` alone, the brackets are plain).

Two encodings exist and differ only on user text that spells a special token:
- `DSV4Tokenizer.encode` uses the full vocabulary (spellings become special ids); it is the
  `/v1/completions` raw-prompt path, as SGLang/HF tokenizers do it.
- prompt encoding (`DeepseekV4Encoding().with_tokenizer(tok.recipe).encode(conv)`) encodes
  only the renderer's own special ranges as special ids; user text stays plain text.

The vocabulary is trained by `scripts/train_tokenizer.py` and committed at
`engine/assets/tokenizer.json`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import deepseek_recipe as dr
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

DEFAULT_PATH = Path(__file__).resolve().parent / "assets" / "tokenizer.json"

# Every DSV4 special token, in deepseek-recipe's declaration order; their ids are 0..17.
SPECIAL_TOKEN_KINDS: tuple[str, ...] = (
    "Bos",
    "Eos",
    "ThinkingStart",
    "ThinkingEnd",
    "System",
    "User",
    "Assistant",
    "LatestReminder",
    "Dsml",
    "Image",
    "Ref",
    "RefEnd",
    "Box",
    "BoxEnd",
    "Point",
    "PointEnd",
    "Polygon",
    "PolygonEnd",
)
SPECIAL_TOKENS: tuple[str, ...] = tuple(getattr(dr.SpecialToken, k).default_str() for k in SPECIAL_TOKEN_KINDS)


def new_bpe(digit_groups: int = 0) -> Tokenizer:
    """An untrained byte-level BPE with DSV4's special tokens and no normalizer or post-processor.

    `digit_groups` > 0 cuts every run of digits into pieces of at most that many before the
    merges, as DeepSeek's own tokenizers do (groups of 3). Without it, BPE on the scenarios'
    tables learns whole numbers (` 5479`): more than half of an 8,192-token vocabulary, each
    one rare. bench-plan.md compares the two for copying numbers."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if digit_groups > 0:
        digits = pre_tokenizers.Split(Regex(rf"\p{{N}}{{1,{digit_groups}}}"), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int, digit_groups: int = 0) -> Tokenizer:
    """Train the byte-level BPE on `texts`; special tokens get ids 0..17, then the 256 bytes."""
    tok = new_bpe(digit_groups)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


@dataclass(frozen=True)
class DSV4Tokenizer:
    """The loaded tokenizer: `hf` (tokenizers) for encode/decode, `recipe` for deepseek-recipe."""

    hf: Tokenizer
    recipe: dr.Tokenizer
    path: Path
    special_ids: dict[str, int] = field(default_factory=dict)  # spelling -> id

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int:
        return self.special_ids[SPECIAL_TOKENS[1]]

    @property
    def bos_token_id(self) -> int:
        return self.special_ids[SPECIAL_TOKENS[0]]

    def special_id(self, kind: dr.SpecialToken | str) -> int:
        """The id of a special token, by `SpecialToken` member, kind name ("Eos") or spelling."""
        if isinstance(kind, dr.SpecialToken):
            return self.special_ids[kind.default_str()]
        if kind in self.special_ids:
            return self.special_ids[kind]
        return self.special_ids[getattr(dr.SpecialToken, kind).default_str()]

    def encode(self, text: str) -> list[int]:
        """Ids of `text` with the full vocabulary: a special-token spelling becomes its id."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; special tokens are kept unless `skip_special_tokens`."""
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids.values()


def load_tokenizer(path: str | Path | None = None) -> DSV4Tokenizer:
    """Load `tokenizer.json` (default: the committed `engine/assets/tokenizer.json`)."""
    p = Path(path) if path is not None else DEFAULT_PATH
    hf = Tokenizer.from_file(str(p))
    ids = {s: hf.token_to_id(s) for s in SPECIAL_TOKENS}
    missing = [s for s, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"{p}: tokenizer lacks DSV4 special tokens {missing}")
    assert sorted(ids.values()) == list(range(len(SPECIAL_TOKENS))), "special tokens must be ids 0..17"
    return DSV4Tokenizer(hf=hf, recipe=dr.Tokenizer.from_file(str(p)), path=p, special_ids=ids)


class IncrementalDecoder:
    """Text of a growing id sequence, piece by piece, never splitting a UTF-8 character.

    vLLM's prefix/read offsets: each push re-decodes only the ids since the last emitted piece.
    """

    def __init__(self, tokenizer: DSV4Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self._prefix = self._read = 0  # ids[_prefix:_read] decode to the last emitted piece

    def push(self, ids: Sequence[int], final: bool = False) -> str:
        """Append `ids`; return the new text (held back while it ends in a partial character,
        unless `final`)."""
        self.ids += ids
        before = self.tokenizer.decode(self.ids[self._prefix : self._read], self.skip)
        after = self.tokenizer.decode(self.ids[self._prefix :], self.skip)
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]
