"""Text-quality checks: repetition loops and garbled (non-language) text.

Both run over every text a turn produced: `content`, `reasoning` and each call's arguments
(the whole, and, when it decodes, each string value inside it, so a loop closed by `"}`
or a control character behind a JSON escape is still seen). At most one verdict per text.

Thresholds are tuned so that code, logs, markdown tables and JSON arrays, whose lines
repeat a structure but rarely repeat the same characters back to back, pass; the clean
fixtures in tests/checks/test_text.py pin that down.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import NamedTuple

from dsv4bench.checks.common import excerpt, judged_texts, response_of
from dsv4bench.history.records import TurnContext, Verdict

# --- degenerate repetition ------------------------------------------------------------

MAX_SCAN = 65_536  # longer texts are judged on their last MAX_SCAN characters
MAX_UNIT = 200  # longest repeated unit searched, in characters
SHORT_UNIT = 16  # units up to this long must repeat REPEATS_SHORT times, longer ones REPEATS_LONG
REPEATS_SHORT = 8
REPEATS_LONG = 4
REPEATS_BLOCK = 3  # a unit longer than MAX_UNIT (a paragraph, a file) repeating up to the end
BLOCK_SLACK = 8  # ... whose first copy may lack a few characters
TAIL_MIN_CHARS = 40  # a loop that runs to the end of the text
TAIL_MIN_CHARS_ONE = 100  # ... made of one character ("-----" rulers stay clean)
ANYWHERE_MIN_CHARS = 320  # a loop anywhere in the text
DOMINANT_FRACTION = 0.5  # a loop that is most of a short text
DOMINANT_MIN_CHARS = 32
LINE_REPEATS = 8  # the same line back to back
LINE_MIN_CHARS = 4  # non-blank characters a repeated line needs ("}" or "---" lines are fine)

_WS = re.compile(r"\s+")
_RUN_SHORT = re.compile(rf"(.{{1,{SHORT_UNIT}}}?)\1{{{REPEATS_SHORT - 1},}}", re.DOTALL)


class Loop(NamedTuple):
    """A unit repeated back to back: `s[start:end]` is `reps` copies of `unit` (whitespace collapsed)."""

    unit: str
    reps: int
    start: int
    end: int
    rule: str


def _min_reps(unit_len: int) -> int:
    return REPEATS_SHORT if unit_len <= SHORT_UNIT else REPEATS_LONG


def _tail_loop(s: str) -> Loop | None:
    """The shortest unit that repeats up to the very end of `s` (a loop cut mid-unit counts)."""
    last = s[-1] if s else ""
    for p in range(1, min(MAX_UNIT, len(s) // 2) + 1):
        if s[-1 - p] != last:
            continue  # the unit's copy before it would end in another character: one copy only
        unit, i, reps = s[-p:], len(s) - p, 1
        while i >= p and s.startswith(unit, i - p):
            i, reps = i - p, reps + 1
        if reps >= _min_reps(p):
            need = TAIL_MIN_CHARS_ONE if len(set(unit)) == 1 else TAIL_MIN_CHARS
            if reps * p >= need:
                return Loop(unit, reps, i, len(s), "tail")
    return _tail_block(s)


def _tail_block(s: str, sig_len: int = 32) -> Loop | None:
    """A unit longer than MAX_UNIT repeated REPEATS_BLOCK+ times up to the end of `s`.

    Candidate periods are the distances back to earlier copies of the last `sig_len`
    characters, nearest first, so only a few slices are compared. The first copy may lack
    up to BLOCK_SLACK characters (the separator between copies is often missing there).
    """
    sig, n = s[-sig_len:], len(s)
    j = s.rfind(sig, 0, n - 1 - MAX_UNIT)
    while j >= 0 and (p := n - sig_len - j) * REPEATS_BLOCK <= n + BLOCK_SLACK:
        unit, reps = s[-p:], 1
        while (reps + 1) * p <= n and s[n - (reps + 1) * p : n - reps * p] == unit:
            reps += 1
        start = n - reps * p
        while start > 0 and s[start - 1] == s[start - 1 + p]:
            start -= 1
        if n - start >= REPEATS_BLOCK * p - BLOCK_SLACK:
            return Loop(unit, round((n - start) / p), start, n, "tail")
        j = s.rfind(sig, 0, j + sig_len - 1)
    return None


def _long_runs(s: str) -> Iterator[Loop]:
    """Loops of units of SHORT_UNIT+1..MAX_UNIT characters, found through repeated k-grams.

    For each position, the distance back to the previous copy of the SHORT_UNIT-gram there;
    a stretch of positions sharing one distance d is a stretch of text with period d.
    (A regex with a backreference does the same but is ten times slower on long texts.)
    """
    k = SHORT_UNIT
    last: dict[str, int] = {}  # each k-gram's latest position
    run_d, run_start = 0, 0
    for i in range(len(s) - k + 2):
        d = 0
        if i <= len(s) - k:
            gram = s[i : i + k]
            prev = last.get(gram)
            last[gram] = i
            d = i - prev if prev is not None and SHORT_UNIT < i - prev <= MAX_UNIT else 0
        if d != run_d:
            if run_d:
                start, end = run_start - run_d, i - 1 + k
                yield Loop(s[start : start + run_d], (end - start) // run_d, start, end, "")
            run_d, run_start = d, i


def _periodic_stretch(s: str, period: int, length: int) -> bool:
    """Whether `s[x] == s[x + period]` for `length` positions x in a row.

    Any such stretch holds a multiple of `length`, so only those positions are tried first (two
    strided slices, compared in one pass) and a stretch is grown only around a hit.
    """
    n = len(s) - period
    if n < length:
        return False
    for j, (a, b) in enumerate(zip(s[0:n:length], s[period::length])):
        if a != b:
            continue
        lo = hi = j * length
        while lo > 0 and s[lo - 1] == s[lo - 1 + period]:
            lo -= 1
        while hi + 1 < n and s[hi + 1] == s[hi + 1 + period]:
            hi += 1
        if hi - lo + 1 >= length:
            return True
    return False


def _runs(s: str) -> Iterator[Loop]:
    """The candidate loops of `s`, short units first; find_loop keeps the first that counts.

    NOTE: the two searches are slow (a backreference regex, a k-gram walk), so each runs only
    when `s` holds what any loop it could report with enough repeats must hold (a unit of u
    characters repeated REPEATS_SHORT times is a stretch of period u and length
    (REPEATS_SHORT - 1) * u; for longer units see `_may_have_long_run`). Loops with fewer
    repeats find_loop skips anyway.
    """
    if any(_periodic_stretch(s, u, (REPEATS_SHORT - 1) * u) for u in range(1, SHORT_UNIT + 1)):
        for m in _RUN_SHORT.finditer(s):
            unit = m.group(1)
            yield Loop(unit, (m.end() - m.start()) // len(unit), m.start(), m.end(), "")
    if _may_have_long_run(s):
        yield from _long_runs(s)


def _may_have_long_run(s: str) -> bool:
    """Whether `_long_runs` can find a run of REPEATS_LONG copies of a unit longer than SHORT_UNIT.

    Such a run is `need` positions in a row whose k-gram occurs d back (SHORT_UNIT < d <=
    MAX_UNIT), `need` = (REPEATS_LONG - 1) * d - SHORT_UNIT + 1 at least; any `need` positions in
    a row hold a multiple of `need`, so only those k-grams are looked up.
    """
    k = SHORT_UNIT
    need = (REPEATS_LONG - 1) * (SHORT_UNIT + 1) - SHORT_UNIT + 1
    for g in range(need, len(s) - k + 1, need):
        if s.find(s[g : g + k], max(0, g - MAX_UNIT), g - SHORT_UNIT - 1 + k) >= 0:
            return True
    return False


def _repeated_line(text: str) -> Loop | None:
    """A line of LINE_MIN_CHARS+ non-blank characters repeated LINE_REPEATS+ times back to back."""
    run_line, run, pos, run_pos = None, 0, 0, 0
    for line in [*text.splitlines(keepends=True), None]:  # None ends the last run
        body = None if line is None else line.rstrip()
        if body == run_line:
            run += 1
        else:
            if run >= LINE_REPEATS and run_line is not None and len(run_line.strip()) >= LINE_MIN_CHARS:
                return Loop(run_line, run, run_pos, pos, "line")
            run_line, run, run_pos = body, 1, pos
        pos += len(line or "")
    return None


def find_loop(text: str) -> Loop | None:
    """The first repetition loop in `text` by the rules of `check_degenerate_repetition`, or None."""
    text = text[-MAX_SCAN:]
    line = _repeated_line(text)
    if line:
        return line
    s = _WS.sub(" ", text).strip()
    if len(s) < DOMINANT_MIN_CHARS:
        return None
    tail = _tail_loop(s)
    if tail:
        return tail
    for loop in _runs(s):
        if loop.reps < _min_reps(len(loop.unit)) or loop.unit.isspace():
            continue
        covered = loop.end - loop.start
        if covered >= ANYWHERE_MIN_CHARS:
            return loop._replace(rule="anywhere")
        wordy = any(c.isalpha() for c in loop.unit)  # "0, 0, 0" buffers in code are not loops
        if wordy and covered >= DOMINANT_MIN_CHARS and covered >= DOMINANT_FRACTION * len(s):
            return loop._replace(rule="dominant")
    return None


def _describe_loop(loop: Loop) -> str:
    if loop.rule == "line":
        return f"line {loop.unit[:80]!r} repeated {loop.reps} times back to back"
    where = {"tail": " up to the end", "anywhere": "", "dominant": ", most of the text"}[loop.rule]
    unit = loop.unit if len(loop.unit) <= 60 else loop.unit[:57] + "..."
    return f"{unit!r} repeated {loop.reps} times{where} ({loop.reps * len(loop.unit)} chars)"


# --- garbled text ---------------------------------------------------------------------

BPE_MARKERS_MIN = 3  # byte-level BPE marker characters (Ġ Ċ, ĉ in runs) in BPE positions
MOJIBAKE_MIN = 2  # double-encoded UTF-8 pairs (Ã©, â€™, Â°)
MIXED_WORDS_MIN = 2  # words mixing two non-Latin scripts
COMBINING_RUN = 4  # combining marks stacked on one character (Zalgo)

_BPE = re.compile(r"[\u0120\u010a\u0109]{2,}|(?<=\S)[\u0120\u010a](?=\S)|\u00e2[\u0100-\u0143]")
_MOJIBAKE = re.compile(r"[\u00c2\u00c3][\u0080-\u00bf]|\u00e2\u20ac")
_WORD = re.compile(r"[^\W\d_]+")
_CJK = {"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "BOPOMOFO", "IDEOGRAPHIC"}


def _script(ch: str) -> str | None:
    """The script of a letter from its Unicode name; None for letters that go with any script."""
    code = ord(ch)
    if ch.isascii() or 0x2100 <= code <= 0x214F or 0x1D400 <= code <= 0x1D7FF:
        return "LATIN"  # ASCII, letterlike symbols (ℝ, ℓ, K), mathematical alphanumerics
    if unicodedata.category(ch) == "Lm":
        return None  # modifier letters: ー in katakana, ʼ in Ukrainian
    words = unicodedata.name(ch, "UNKNOWN").split()
    first = words[1] if words[0] in ("FULLWIDTH", "HALFWIDTH") and len(words) > 1 else words[0]
    first = first.split("-")[0]
    return "CJK" if first in _CJK else ("LATIN" if first == "MICRO" else first)


def _mixed_words(text: str) -> list[re.Match[str]]:
    """Words (runs of letters) mixing two non-Latin scripts, or three scripts of any kind."""
    mixed = []
    for m in _WORD.finditer(text):
        word = m.group()
        if word.isascii() or len(word) < 2:
            continue
        scripts = {_script(c) for c in word} - {None}
        if len(scripts - {"LATIN"}) >= 2 or len(scripts) >= 3:
            mixed.append(m)
    return mixed


_NONCHARS = "".join(f"{chr(plane << 16 | 0xFFFE)}{chr(plane << 16 | 0xFFFF)}" for plane in range(17))
# Control characters but \t \n \r, lone surrogates, U+FFFD, and the Unicode noncharacters.
_BAD_CODEPOINT = re.compile(rf"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffd\ufdd0-\ufdef{_NONCHARS}]")
_BAD_ASCII = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # what of _BAD_CODEPOINT is ASCII


# What of _BAD_CODEPOINT stays a signal inside a decoded argument string: a control character
# there was sent as a JSON escape (raw ones make the JSON invalid), which is how a correct server
# carries a terminal colour (`\u001b[1m`) or a NUL a tool's input needs.
_BAD_IN_STRING = re.compile(rf"[\ud800-\udfff\ufffd\ufdd0-\ufdef{_NONCHARS}]")


def find_garbled(text: str, controls: bool = True) -> tuple[str, int] | None:
    """(signal, offset) of the first garbled-text signal in `text`, or None. `controls=False`
    for a string value decoded from JSON arguments: its control characters came as escapes."""
    if text.isascii():  # every signal but a control character needs a non-ASCII character
        bad = _BAD_ASCII.search(text) if controls else None
        return None if bad is None else (f"invalid character U+{ord(bad.group()):04X}", bad.start())
    return _find_garbled_any(text, controls)


def _find_garbled_any(text: str, controls: bool = True) -> tuple[str, int] | None:
    """find_garbled for text of any characters."""
    bad = (_BAD_CODEPOINT if controls else _BAD_IN_STRING).search(text)
    if bad:
        ch = bad.group()
        return ("U+FFFD replacement character" if ch == "\ufffd" else f"invalid character U+{ord(ch):04X}"), bad.start()
    bpe = list(_BPE.finditer(text))
    if sum(m.end() - m.start() for m in bpe) >= BPE_MARKERS_MIN:
        return "byte-level BPE markers (Ġ/Ċ) in text", bpe[0].start()
    moji = list(_MOJIBAKE.finditer(text))
    if len(moji) >= MOJIBAKE_MIN:
        return "double-encoded UTF-8 (mojibake)", moji[0].start()
    zalgo = re.search(rf"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]{{{COMBINING_RUN},}}", text)
    if zalgo:
        return f"{COMBINING_RUN}+ stacked combining marks", zalgo.start()
    mixed = _mixed_words(text)
    if len(mixed) >= MIXED_WORDS_MIN:
        return f"{len(mixed)} words mixing unrelated scripts", mixed[0].start()
    return None


# --- the checkers ---------------------------------------------------------------------


def check_degenerate_repetition(ctx: TurnContext) -> list[Verdict]:
    """Repetition loops in content, reasoning or arguments: at most one verdict per text.

    Whitespace is collapsed first, so "the the\\nthe" is one loop. A unit of up to 16
    characters must repeat at least 8 times back to back, a longer unit (up to 200
    characters: a sentence, a line, a short block) at least 4 times; then the loop counts when
    - it runs to the end of the text (what a model stuck until max_tokens leaves) and
      covers >= 40 characters (>= 100 when the unit is one character, so a ruler of
      dashes or a row of closing braces in real code stays clean), or
    - it covers >= 320 characters anywhere in the text, or
    - it covers >= 32 characters and at least half of the text, and its unit holds a
      letter (a `[0, 0, 0, ...]` buffer in a short snippet is code, not a loop).
    Also counted: a unit longer than 200 characters (a paragraph, a whole file) 3+ times
    back to back up to the end, and the same line of >= 4 non-blank characters 8+ times
    back to back. Texts are judged on their last 64 KiB; arguments as a whole (re-serialized
    without ASCII escapes when they decode) and per string value.
    """
    verdicts = []
    for where, texts in judged_texts(response_of(ctx)):
        for label, text in texts:
            loop = find_loop(text)
            if loop is not None:
                prefix = "" if label in ("raw", "json", where) else f"in {label}: "
                verdicts.append(Verdict("degenerate_repetition", prefix + _describe_loop(loop), where))
                break
    return verdicts


def check_garbled_text(ctx: TurnContext) -> list[Verdict]:
    """Text that is not language, in content, reasoning or arguments: at most one verdict per text.

    Signals, first found wins:
    - any U+FFFD, control character other than \\n \\t \\r, lone surrogate or Unicode
      noncharacter (a broken detokenizer or a UTF-8 sequence split across chunks); in a call's
      arguments that decode, control characters are not a signal: JSON carried them escaped
      (`"\\u001b[1m"`, a terminal colour in a shell command), as a correct server sends; invalid
      UTF-8 bytes arrive as U+FFFD, and a lone surrogate sent as a JSON escape (`\\ud800`),
      which the assembler records as U+FFFD, is named as such;
    - >= 3 byte-level BPE marker characters in BPE positions: runs like `ĠĠĊ`, `Ġ`/`Ċ`
      between two non-space characters, or `â` followed by U+0100-U+0143 (`âĢĻ`), i.e.
      token bytes that were never decoded (a Maltese `Ġ` starting a word stays clean);
    - >= 2 double-encoded UTF-8 pairs (`Ã©`, `Ã¼`, `Â°`, `â€™`);
    - a run of >= 4 stacked combining marks (Zalgo);
    - >= 2 words (runs of letters) that mix two non-Latin scripts, or three scripts of any
      kind (`ꙮ걸ҹ拉`). Latin next to one other script (`使用Python`, `μs`, `API를`) is normal,
      and Hiragana, Katakana, Han and Hangul count as one CJK script.
    Not detected: random ASCII (ids, hashes, base64 and minified code look alike) and
    random but valid CJK characters; both need a language model to judge.
    """
    resp = response_of(ctx)
    # Where the assembler replaced lone surrogates, by the owner names judged_texts uses.
    replaced = {"content", "reasoning"} & set(resp.surrogates_replaced)
    replaced |= {
        f"tool_calls[{i}].arguments"
        for i, c in enumerate(resp.tool_calls)
        if f"tool_calls[{c.index}].arguments" in resp.surrogates_replaced
    }
    verdicts = []
    for where, texts in judged_texts(resp):
        for label, text in texts:
            # A decoded argument value, or the arguments re-serialized from it: control characters
            # there were JSON escapes (a raw one would not decode; args_not_json owns that).
            found = find_garbled(text, controls=where in ("content", "reasoning") or label == "raw")
            if found is not None:
                signal, offset = found
                if where in replaced and signal.startswith("U+FFFD"):
                    signal = "lone UTF-16 surrogate (invalid Unicode; recorded as U+FFFD)"
                prefix = "" if label in ("raw", "json", where) else f"in {label}: "
                detail = f"{prefix}{signal}: {excerpt(text, offset, offset + 1, 24)}"
                at = f"{where}@{offset}" if label == where else where
                verdicts.append(Verdict("garbled_text", detail, at))
                break
        else:
            if where in replaced:  # the replacement was clipped away by a bound; the fact stands
                verdicts.append(Verdict("garbled_text", "lone UTF-16 surrogate (invalid Unicode)", where))
    return verdicts
