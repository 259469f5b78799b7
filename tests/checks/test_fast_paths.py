"""The text checkers' fast paths give what the full searches give, on random texts that hold
loops, markup and bad characters, and on clean ones."""

from __future__ import annotations

import random

import pytest

from dsv4bench.checks import text
from dsv4bench.families import deepseek

WORDS = [
    "the",
    "file",
    "server",
    "x = 1",
    "<div>",
    "|",
    "DSML",
    "string",
    "tool",
    "Ã©",
    "—",
    "\x07",
    "é",
    "ſ",
    "é",
    "0, ",
    "-",
    "  ",
    "\n",
    "invoke",
    '<｜DSML｜invoke name="f">',
    "def f():",
    "return",
    "{}",
    "ab",
]


def _texts(seed: int, n: int = 300) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(0, 120))]
        if rng.random() < 0.5:  # a loop somewhere: a unit of 1-250 characters, repeated 2-12 times
            unit = "".join(rng.choice("abcdefgh ,.-") for _ in range(rng.randint(1, 250)))
            at = rng.randint(0, len(words))
            words[at:at] = [unit * rng.randint(2, 12)]
        out.append((" " if rng.random() < 0.7 else "").join(words))
    return out


def _tail_loop_reference(s: str) -> text.Loop | None:
    """_tail_loop as it was before its fast path."""
    for p in range(1, min(text.MAX_UNIT, len(s) // 2) + 1):
        unit, i, reps = s[-p:], len(s) - p, 1
        while i >= p and s.startswith(unit, i - p):
            i, reps = i - p, reps + 1
        need = text.TAIL_MIN_CHARS_ONE if len(set(unit)) == 1 else text.TAIL_MIN_CHARS
        if reps >= text._min_reps(p) and reps * p >= need:
            return text.Loop(unit, reps, i, len(s), "tail")
    return text._tail_block(s)


@pytest.mark.parametrize("seed", range(4))
def test_find_loop_is_the_full_search(seed, monkeypatch):
    texts = _texts(seed)
    fast = [text.find_loop(t) for t in texts]
    monkeypatch.setattr(text, "_periodic_stretch", lambda s, period, length: True)
    monkeypatch.setattr(text, "_may_have_long_run", lambda s: True)
    monkeypatch.setattr(text, "_tail_loop", _tail_loop_reference)
    assert fast == [text.find_loop(t) for t in texts]
    assert sum(x is not None for x in fast) > 20  # the texts do hold loops


def test_periodic_stretch():
    assert text._periodic_stretch("xx" + "ab" * 8 + "yy", 2, 14)
    assert not text._periodic_stretch("xx" + "ab" * 7 + "yy", 2, 14)
    assert text._periodic_stretch("a" * 8, 1, 7) and not text._periodic_stretch("a" * 7, 1, 7)


@pytest.mark.parametrize("seed", range(3))
def test_find_garbled_ascii_path_is_the_full_search(seed):
    for t in _texts(seed):
        t = t.encode("ascii", "ignore").decode()
        assert text.find_garbled(t) == text._find_garbled_any(t)


@pytest.mark.parametrize("seed", range(3))
def test_find_dsml_prefilter_keeps_every_finding(seed, monkeypatch):
    texts = _texts(seed) + ["<|DS", "a |DSML| b", 'x string="true">', "|tool_sep|", "plain prose, no markup"]
    fast = [deepseek.find_dsml(t) for t in texts]
    monkeypatch.setattr(deepseek, "_may_hold_dsml", lambda t: True)
    assert fast == [deepseek.find_dsml(t) for t in texts]
    assert sum(bool(x) for x in fast) > 20
