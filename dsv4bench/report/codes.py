"""One sentence per verdict code: the single place the report takes its meanings from.

Keep this in step with `records.py`; a test fails when a code there has no meaning here.
"""

from __future__ import annotations

from ..records import AVAILABILITY_CODES, CORRUPTION_CODES, ORACLE_CODE, WEDGE_CODES

CODE_MEANINGS: dict[str, str] = {
    # Corruption: a complete response that is wrong.
    "dsml_leak_content": "Raw DSML tool-call markup leaked into `content` instead of being parsed into tool calls.",
    "dsml_leak_reasoning": "Raw DSML tool-call markup leaked into the reasoning text.",
    "dsml_in_arguments": "DSML markup appears inside a tool call's `arguments`.",
    "args_not_json": "A tool call's `arguments` is not valid JSON.",
    "schema_violation": "A tool call's arguments are JSON but violate the tool's JSON Schema.",
    "unknown_tool": "A tool call names a tool that the request did not offer.",
    "finish_reason_mismatch": "`finish_reason` disagrees with the content: `tool_calls` without calls, or calls with `stop`.",
    "empty_turn": "The turn finished with no content, no reasoning and no tool calls.",
    "stream_protocol": ("The response broke the streaming protocol (index gaps, missing id or name, deltas after "
                        "finish, no `[DONE]`, a body that is not JSON or not SSE) or passed one of the harness's "
                        "bounds on a turn (line, event, tool calls, arguments, text), where it stopped reading."),
    "truncated": "The response stopped early (length limit or cut-off) mid tool call or mid sentence.",
    "degenerate_repetition": "The output falls into a repetition loop.",
    "garbled_text": ("The text is garbled: control characters, invalid UTF-8, lone surrogates, undecoded tokens, "
                     "mojibake or mixed-up scripts."),
    "reference_mismatch": ("The reference run (--reference) got a different answer to this same greedy request: "
                           "the server computed it from wrong state (a cache or KV race), or is not deterministic."),
    # Availability: the request did not complete.
    "http_error": "The server answered with an HTTP error status.",
    "timeout_ttft": "No first token arrived within the time-to-first-token limit.",
    "timeout_total": "The response did not finish within the total time limit.",
    "connection_error": "The connection failed or was dropped before a complete response.",
    # Wedge: per endpoint, after the nemesis.
    "queue_stuck": "Queue gauges stayed above zero after the drain window with no traffic.",
    "canary_timeout": "A small canary request after the drain did not complete in time.",
    "health_lies": "`/health` answered 200 while the server could not generate.",
    "ghost_requests": "The server still counts running requests that no client is waiting for.",
    # Oracle: not a verdict about the server.
    ORACLE_CODE: "DeepSeek's reference parser read the raw completion differently from the server's parser.",
}


def code_class(code: str) -> str:
    """Which family a code belongs to: corruption, availability, wedge, oracle or unknown."""
    if code in CORRUPTION_CODES:
        return "corruption"
    if code in AVAILABILITY_CODES:
        return "availability"
    if code in WEDGE_CODES:
        return "wedge"
    if code == ORACLE_CODE:
        return "oracle"
    return "unknown"


def meaning(code: str) -> str:
    """The one-sentence meaning of a code; a placeholder for codes this version does not know."""
    return CODE_MEANINGS.get(code, "A code this version of dsv4bench does not know.")
