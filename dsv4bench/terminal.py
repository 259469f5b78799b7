"""Text from a server or a client made safe for the terminal: the one function every view uses.

What a server sends (/get_server_info values, model ids, metric names and labels, error bodies,
answers) and what a proxied client sends (its `user`, its session header) is printed by `agents`,
`probe`, `watch`, `audit`, `proxy` and `locust`. Printed raw, an ESC starts a control sequence the
terminal obeys (`ESC[2J` clears the screen, OSC 52 writes the clipboard, OSC 8 makes a link whose
target the reader never sees), a carriage return overwrites what the line said, and a bidi
override reorders the characters after it. Through rich, `[link=...]` or `[bold red]` in such text
would be read as markup.

`visible` writes every such character as a visible escape (`\\x1b`, `\\u202e`), the way report.md
shows them (report/escape.py); `markup_safe` also escapes rich markup, for strings printed with
markup on; `visible_text` does the same to a rich Text, keeping its styles.
"""

from __future__ import annotations

import re
from typing import Any

from rich.markup import escape as _markup_escape
from rich.text import Text

# DEL and the C1 controls (0x9b is a one-byte CSI on some terminals), the Arabic letter mark,
# zero-width space, LRM/RLM, line and paragraph separators, bidi embeddings, overrides and
# isolates, the BOM, and lone surrogates: unsafe wherever server text is shown.
_INVISIBLE = "\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff"
# Beside them the C0 controls but \t; on a terminal \n too (a line break in server text would
# forge a line of ours), in report.md not (escape.py keeps the text's own lines).
_UNSAFE = re.compile(f"[\x00-\x08\x0a-\x1f{_INVISIBLE}]")
_UNSAFE_BUT_NEWLINE = re.compile(f"[\x00-\x08\x0b-\x1f{_INVISIBLE}]")


def _escape_one(m: re.Match[str]) -> str:
    o = ord(m.group())
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def escape_unsafe(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control, bidi or invisible character written as a visible escape
    (`\\x1b`, `\\u202e`); \\t kept, and \\n where `keep_newlines` (the report's text)."""
    return (_UNSAFE_BUT_NEWLINE if keep_newlines else _UNSAFE).sub(_escape_one, text)


def visible(value: Any) -> str:
    """`value` as text whose every control, bidi or invisible character is a visible escape."""
    return escape_unsafe(value if isinstance(value, str) else str(value))


def markup_safe(value: Any) -> str:
    """`visible(value)` with rich markup escaped, for a string printed with markup on."""
    return _markup_escape(visible(value))


def visible_text(text: Text) -> Text:
    """A copy of a rich Text with `visible` applied to its characters and its styles kept.

    The escapes lengthen the text, so the spans cannot be shifted in place: the text is cut at
    every span's edge and each piece, made visible, takes the styles that covered it."""
    if not _UNSAFE.search(text.plain):
        return text
    cuts = sorted({i for s in text.spans for i in (s.start, s.end) if 0 < i < len(text.plain)})
    out = Text(style=text.style, justify=text.justify, overflow=text.overflow, no_wrap=text.no_wrap, end=text.end)
    for piece in text.divide(cuts):
        safe = Text(visible(piece.plain))
        for span in piece.spans:
            safe.stylize(span.style)
        out.append_text(safe)
    return out
