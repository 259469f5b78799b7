"""The building blocks of report.md: numbers as the report writes them, and the only ways text
reaches it (inline text, table cells, code spans, fences), each made inert through escape.py.
Every section of the report (markdown.py and the section modules beside it) writes with these.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dsv4bench.report.escape import escape_text


def fmt_int(n: int) -> str:
    return f"{n:,}"


def plural(n: int, word: str) -> str:
    """'1 turn', '1,612 turns': English plural by appending s, enough for the words used here."""
    return f"{fmt_int(n)} {word}" + ("" if n == 1 else "s")


def fmt_pct(num: int, den: int) -> str:
    return f"{100.0 * num / den:.1f}%" if den else "n/a"


def fmt_rate(x: float | None) -> str:
    return "–" if x is None else f"{100.0 * x:.2f}%"


def fmt_seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1e3:.0f} ms" if x < 1.0 else f"{x:.2f} s"


def _one_line(value: Any, limit: int) -> str:
    """Any value as one line of text: JSON for what is not a string, unsafe characters escaped
    (escape_text), whitespace collapsed, clipped to `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(escape_text(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Inline markdown a server's text must not start: emphasis, strikethrough, math, code spans,
# links, images and footnotes (`[`), and escapes of its own. Backslash-escaped, the characters
# show as they are in every CommonMark renderer.
# An `_` between two letters or digits opens and closes nothing (CommonMark's flanking rules), so
# `num_running_reqs` is left as it reads.
_INLINE_SYNTAX = re.compile(r"[\\`*~$\[\]]|(?<![^\W_])_|_(?![^\W_])")
# The HTML-significant characters as entities: a tag or an autolink (`<http://...>`) stays text,
# and an entity the server wrote (`&lt;`) shows as it was written.
_HTML_CHARS = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# A bare URL is left as it reads: where GFM makes it a link, the link shows its own target.
# What makes a line a heading, quote, list item, thematic break or setext underline when the
# text starts a line or a list item's content.
_BLOCK_START = re.compile(r"^(?:[#>+=-]|\d{1,9}(?=[.)]))")


def inline_text(text: str) -> str:
    """Text already on one line made inert as inline markdown: it shows as it is, and no tag,
    link, image, `<...>` autolink, emphasis or code span starts from it."""
    text = _INLINE_SYNTAX.sub(lambda m: "\\" + m.group(), text)
    text = re.sub(r"[&<>]", lambda m: _HTML_CHARS[m.group()], text)
    m = _BLOCK_START.match(text)
    if m:  # `1.` -> `1\.`, `#` -> `\#`
        end = m.end()
        text = text[:end] + "\\" + text[end:] if m.group()[0].isdigit() else "\\" + text
    return text


def inline(value: Any, limit: int = 300) -> str:
    """Any value as one line of markdown text: escaped, whitespace collapsed, no HTML, no live
    markdown of its own, clipped. The one function for a server's text in running text."""
    return inline_text(_one_line(value, limit))


def cell(value: Any, limit: int = 120) -> str:
    """A value made safe for one markdown table cell (table() escapes its pipes)."""
    return inline(value, limit)


def code_span(value: Any, limit: int = 120) -> str:
    """A value as an inline code span that no backtick inside can end early (HTML and markdown
    inside a code span are shown as text by every renderer)."""
    text = _one_line(value, limit)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    bar = "`" * (longest + 1)
    pad = " " if longest or text.startswith(" ") or text.endswith("`") else ""
    return f"{bar}{pad}{text}{pad}{bar}"


def table_cell(text: str) -> str:
    """A cell's markdown kept in its cell: every `|` escaped. GFM and markdown-it split a row at
    each `|` not right after a backslash, code spans included, and take that one backslash away
    before reading the cell; so `\\|` from inline text and `|` inside a code span both come back as
    they were written. A line break would end the row: cells are one line already (_one_line)."""
    return " ".join(text.split("\n")).replace("|", "\\|")


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A markdown table; every header and cell goes through table_cell, so no text in one can
    add a column or end the row."""
    lines = ["| " + " | ".join(map(table_cell, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(table_cell, r)) + " |" for r in rows]
    return "\n".join(lines)


def fence(text: str, lang: str = "") -> str:
    """An escaped fenced block whose fence is longer than any backtick run inside, so it cannot break."""
    text = escape_text(text)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    bar = "`" * max(3, longest + 1)
    return f"{bar}{lang}\n{text}\n{bar}"
