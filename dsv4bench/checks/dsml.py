"""DSML leaks: DeepSeek's tool-call markup (V4 / V3.2 DSML, V3 / V3.1 tool tokens) that reached
the client as text, judged with evidence by markup.py; the detector itself, with every variant
spelling, is dsv4bench/families/deepseek.py.
"""

from __future__ import annotations

from dsv4bench.checks.markup import verdicts_of
from dsv4bench.families.base import BARS
from dsv4bench.families.deepseek import DsmlMatch, find_dsml
from dsv4bench.history.records import TurnContext, Verdict


def check_dsml_leak_content(ctx: TurnContext) -> list[Verdict]:
    """DSML markup (any variant `find_dsml` knows) in `content`: one verdict at the first match."""
    return verdicts_of(ctx, "dsml_leak_content")


def check_dsml_leak_reasoning(ctx: TurnContext) -> list[Verdict]:
    """DSML markup in `reasoning`: the parser let a tool call stay inside the thinking text."""
    return verdicts_of(ctx, "dsml_leak_reasoning")


def check_dsml_in_arguments(ctx: TurnContext) -> list[Verdict]:
    """DSML markup in a call's arguments: one verdict per call, judged per string value where
    the arguments decode (so a leak behind `\\uff5cDSML\\uff5c` escapes is seen)."""
    return verdicts_of(ctx, "dsml_in_arguments")


__all__ = [
    "BARS",
    "DsmlMatch",
    "check_dsml_in_arguments",
    "check_dsml_leak_content",
    "check_dsml_leak_reasoning",
    "find_dsml",
]
