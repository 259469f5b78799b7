"""Text from a server made safe for the markdown report: the one escaping function.

Everything a server sent (content, arguments, tool names, ids, error messages, gauge labels)
reaches report.md through `escape_text`: control characters, bidi overrides, invisible
separators and lone surrogates become visible escapes (`\\x00`, `\\u202e`), so the report holds
no byte that hides, reorders or cuts what is around it. The markdown helpers in markdown.py
(`cell`, `inline`, `code`, `fence`) call it before they quote anything.
"""

from __future__ import annotations

from dsv4bench.terminal import escape_unsafe


def escape_text(text: str) -> str:
    """`text` with every unsafe character written as a visible escape; \\n and \\t are kept. The
    characters are the terminal's (dsv4bench/terminal.py), but for the line breaks."""
    return escape_unsafe(text, keep_newlines=True)


def plot_text(text: str) -> str:
    """A server's text (a gauge's name, an endpoint) as a plot's label: escaped as above, with `$`
    escaped so matplotlib draws no mathtext from it (an unbalanced `$` would cost the whole plot),
    and no leading `_`, by which matplotlib leaves a line out of the legend."""
    text = escape_text(text).replace("$", r"\$")
    return " " + text if text.startswith("_") else text
