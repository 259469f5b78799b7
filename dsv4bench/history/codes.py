"""Every verdict code in one table: its family, its meaning, and the checker that finds it.

The rest derive from `CODES`: `dsv4bench.checks` builds its registry from the `checker` column,
the report takes each code's class and meaning from here, the history and summary count by the
family views below, and a test holds docs/verdicts.md's "Verdict codes" list to this table. The code
names are a stable contract: `turns.jsonl` and `summary.json` carry them.

Families:
- corruption: a complete response that is wrong (judged on ok turns);
- availability: the request did not complete (judged on error and timeout turns);
- wedge: a server after the load, judged per endpoint by wedge.py, not per turn: no checker;
- state: the server's state after the load, judged by fresh sessions played alone after it
  (dsv4bench/harness/persistence.py), not per turn: no checker;
- oracle: evidence, never a verdict about the server: the --raw oracle disagreed with the
  server's own parser, or markup was found that the answer alone cannot judge.

A turn our own nemesis cancelled is `killed` (a turn status, not a code): never judged.
"""

from __future__ import annotations

from dataclasses import dataclass

CORRUPTION, AVAILABILITY, WEDGE, STATE, ORACLE = "corruption", "availability", "wedge", "state", "oracle"
FAMILIES = (CORRUPTION, AVAILABILITY, WEDGE, STATE, ORACLE)
RUN_LEVEL = (WEDGE, STATE)  # judged of the server after the load, not of a turn: no checker


@dataclass(frozen=True)
class VerdictCode:
    """One verdict code. `checker` names its checker in `dsv4bench.checks` as `module.function`
    (resolved there, so this table imports no checker); None for a run-level (wedge or state) code."""

    code: str
    family: str
    meaning: str
    checker: str | None = None

    def __post_init__(self) -> None:
        assert self.family in FAMILIES, f"{self.code}: unknown family {self.family!r}"
        assert (self.checker is None) == (self.family in RUN_LEVEL), f"{self.code}: a checker unless run-level"
        assert self.meaning.strip(), f"{self.code}: no meaning"


def _turn(code: str, family: str, module: str, meaning: str) -> VerdictCode:
    """A code judged per turn, by `check_<code>` in `dsv4bench/checks/<module>.py`."""
    return VerdictCode(code, family, meaning, f"{module}.check_{code}")


# In the order the report and summary.json list them.
CODES: tuple[VerdictCode, ...] = (
    _turn(
        "dsml_leak_content",
        CORRUPTION,
        "dsml",
        "DeepSeek tool-call markup (DSML, V3 tool tokens) leaked into `content` instead of being parsed into "
        "tool calls: structural, or absent from the text the request gave the model.",
    ),
    _turn(
        "dsml_leak_reasoning",
        CORRUPTION,
        "dsml",
        "DeepSeek tool-call markup leaked into the reasoning text (structural, or absent from the request's text).",
    ),
    _turn(
        "dsml_in_arguments",
        CORRUPTION,
        "dsml",
        "DeepSeek tool-call markup inside a tool call's `arguments` or name that is structural or absent from the "
        "request's text (markup the task gave the model, as in a file being edited, is clean).",
    ),
    _turn(
        "markup_leak_content",
        CORRUPTION,
        "markup",
        "Another family's tool-call markup (`<tool_call>`, `[TOOL_CALLS]`, harmony `to=functions.x`, Kimi or "
        "GLM call tokens, `<|python_tag|>`...) leaked into `content`: structural, or absent from the request's text.",
    ),
    _turn(
        "markup_leak_reasoning",
        CORRUPTION,
        "markup",
        "Another family's tool-call markup leaked into the reasoning (structural, or absent from the request's text).",
    ),
    _turn(
        "markup_in_arguments",
        CORRUPTION,
        "markup",
        "Another family's tool-call markup inside a tool call's `arguments` or name, structural or absent from the "
        "request's text.",
    ),
    _turn(
        "special_token_leak",
        CORRUPTION,
        "special_tokens",
        "A special token of the server's family (every family where unknown), in any spelling "
        "(`<｜end▁of▁sentence｜>` or `<|end_of_sentence|>`, `<|im_end|>`, `<think>`...), reached the client in "
        "`content`, the reasoning or `arguments`, and appears nowhere in the text the request gave the model.",
    ),
    _turn("args_not_json", CORRUPTION, "arguments", "A tool call's `arguments` is not valid JSON."),
    _turn(
        "schema_violation",
        CORRUPTION,
        "arguments",
        "A tool call's arguments are JSON but violate the tool's JSON Schema.",
    ),
    _turn("unknown_tool", CORRUPTION, "arguments", "A tool call names a tool that the request did not offer."),
    _turn(
        "finish_reason_mismatch",
        CORRUPTION,
        "protocol",
        "`finish_reason` disagrees with the turn: anything but `length` when `usage.completion_tokens` "
        "reached the request's `max_tokens` (or `max_completion_tokens`), streamed or not (the cap cut "
        "it; except `stop` exactly at the cap under the request's own stop sequences); `tool_calls` "
        "without calls; calls with `stop`; or a value clients do not know, such as `abort`.",
    ),
    _turn(
        "empty_turn",
        CORRUPTION,
        "protocol",
        "The turn finished with no content, no reasoning and no tool calls (a `stop` with nothing is no "
        "finding where the request's stop sequences or an assistant message it continues allow it).",
    ),
    _turn(
        "stream_protocol",
        CORRUPTION,
        "protocol",
        "The response broke the streaming protocol (a tool call's index skipped or out of order, its "
        "first delta without id or name, its name sent again in a later delta, a second id at its "
        "index, two calls sharing an id, deltas after finish, no `[DONE]`, a body that is not JSON or "
        "not SSE) or passed one of the harness's bounds on a turn (line, event, tool calls, arguments, "
        "text), where it stopped reading.",
    ),
    _turn(
        "truncated",
        CORRUPTION,
        "protocol",
        "The response stopped early (length limit or cut-off) mid tool call or mid sentence.",
    ),
    _turn("degenerate_repetition", CORRUPTION, "text", "The output falls into a repetition loop."),
    _turn(
        "garbled_text",
        CORRUPTION,
        "text",
        "The text is garbled: control characters, invalid UTF-8, lone surrogates, undecoded tokens, "
        "mojibake or mixed-up scripts.",
    ),
    # What the request asked of the answer (dsv4bench/history/request_terms.py; varied by --request-mix).
    _turn(
        "tool_choice_violation",
        CORRUPTION,
        "request_compliance",
        'The answer broke the request\'s `tool_choice`: a tool call under `"none"`, none under '
        '`"required"`, or a named function not called or another tool called instead.',
    ),
    _turn(
        "parallel_calls_violation",
        CORRUPTION,
        "request_compliance",
        "`parallel_tool_calls` was false, yet the turn holds more than one tool call.",
    ),
    _turn(
        "stop_sequence_ignored",
        CORRUPTION,
        "request_compliance",
        "A stop sequence of the request appears in `content` or the reasoning: the server did not stop at it.",
    ),
    _turn(
        "reasoning_only",
        CORRUPTION,
        "request_compliance",
        "The turn finished (`stop`) with reasoning but no content and no tool call, before its "
        "`max_tokens`, and the request had no stop sequence and no assistant message to continue that "
        "could end it there: nothing an agent can act on.",
    ),
    # Judged only with --reference (dsv4bench/harness/reference_run.py).
    _turn(
        "reference_mismatch",
        CORRUPTION,
        "reference",
        "The reference run (--reference) got a different answer to this same greedy request: "
        "the server computed it from wrong state (a cache or KV race), or is not deterministic.",
    ),
    # Judged only with --recheck (dsv4bench/harness/recheck.py), after the load.
    _turn(
        "answer_changed_under_load",
        CORRUPTION,
        "reference",
        "Sent again alone after the load (--recheck), this greedy request got another answer than under the load, "
        "on a server that answered the same request alone the same way twice: the load changed what the model "
        "was given (a cache or KV race, batching).",
    ),
    _turn("http_error", AVAILABILITY, "availability", "The server answered with an HTTP error status."),
    _turn("timeout_ttft", AVAILABILITY, "availability", "No first token arrived within the time-to-first-token limit."),
    _turn("timeout_total", AVAILABILITY, "availability", "The response did not finish within the total time limit."),
    _turn(
        "connection_error",
        AVAILABILITY,
        "availability",
        "The connection failed or was dropped before a complete response.",
    ),
    VerdictCode("queue_stuck", WEDGE, "Queue gauges stayed above zero after the drain window with no traffic."),
    VerdictCode("canary_timeout", WEDGE, "A small canary request after the drain did not complete in time."),
    VerdictCode("health_lies", WEDGE, "`/health` answered 200 while the server could not generate."),
    VerdictCode(
        "ghost_requests", WEDGE, "After every client was gone, the server kept decoding requests nobody waits for."
    ),
    VerdictCode(
        "poisoned_state",
        STATE,
        "After the load, most fresh sessions played alone on seeds that were clean early in the run corrupted: "
        "the load left the server's state wrong (a cache, a draft model's state, a KV pool) until it restarts.",
    ),
    _turn(
        "parser_disagreement",
        ORACLE,
        "oracle",
        "The family's reference parser read the raw completion (--raw) differently from the server's parser.",
    ),
    _turn(
        "markup_unproven",
        ORACLE,
        "markup",
        "Markup or a special token that is not structural, in a turn whose request text is not known: the "
        "answer alone cannot say whether it was quoted from the task (auditing with the request bodies, or "
        "--raw, decides).",
    ),
)
BY_CODE: dict[str, VerdictCode] = {c.code: c for c in CODES}
assert len(BY_CODE) == len(CODES), "each code once"
CODE_MEANINGS: dict[str, str] = {c.code: c.meaning for c in CODES}


def codes_of(family: str) -> tuple[str, ...]:
    """The codes of one family, in table order."""
    return tuple(c.code for c in CODES if c.family == family)


CORRUPTION_CODES = codes_of(CORRUPTION)
AVAILABILITY_CODES = codes_of(AVAILABILITY)
WEDGE_CODES = codes_of(WEDGE)
STATE_CODES = codes_of(STATE)
EVIDENCE_CODES = codes_of(ORACLE)
ORACLE_CODE = "parser_disagreement"
assert ORACLE_CODE in EVIDENCE_CODES
REFERENCE_CODE = "reference_mismatch"
assert REFERENCE_CODE in CORRUPTION_CODES
ANSWER_CHANGED_CODE = "answer_changed_under_load"
assert ANSWER_CHANGED_CODE in CORRUPTION_CODES
# The codes a turn can carry (summary.json `counts` has each of them, zero or not).
TURN_CODES = tuple(c.code for c in CODES if c.family not in RUN_LEVEL)


def code_class(code: str) -> str:
    """Which family a code belongs to: corruption, availability, wedge, oracle or unknown."""
    known = BY_CODE.get(code)
    return known.family if known else "unknown"


def meaning(code: str) -> str:
    """The one-sentence meaning of a code; a placeholder for codes this version does not know."""
    return CODE_MEANINGS.get(code, "A code this version of dsv4bench does not know.")
