"""Text from a server made safe for the markdown report: the one escaping function.

Everything a server sent (content, arguments, tool names, ids, error messages, gauge labels)
reaches report.md through `escape_text`: control characters, bidi overrides, invisible
separators and lone surrogates become visible escapes (`\\x00`, `\\u202e`), so the report holds
no byte that hides, reorders or cuts what is around it. The markdown helpers in markdown.py
(`cell`, `inline`, `code`, `fence`) call it before they quote anything.
"""

from __future__ import annotations

import re

# C0 controls but \t and \n, DEL and the C1 controls, the Arabic letter mark, zero-width space,
# LRM/RLM, line and paragraph separators, bidi embeddings, overrides and isolates, the BOM,
# and lone surrogates (which UTF-8 cannot even encode).
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
)


def _escape_one(m: re.Match[str]) -> str:
    o = ord(m.group())
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def escape_text(text: str) -> str:
    """`text` with every unsafe character written as a visible escape; \\n and \\t are kept."""
    return _UNSAFE.sub(_escape_one, text)


def plot_text(text: str) -> str:
    """A server's text (a gauge's name, an endpoint) as a plot's label: escaped as above, with `$`
    escaped so matplotlib draws no mathtext from it (an unbalanced `$` would cost the whole plot),
    and no leading `_`, by which matplotlib leaves a line out of the legend."""
    text = escape_text(text).replace("$", r"\$")
    return " " + text if text.startswith("_") else text
