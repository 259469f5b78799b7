"""summary.json's shape: the typed `Summary` (its verdict a history.verdict.RunVerdict), and its codec.

summary.py computes the figures; this module says what the file holds. A Struct's fields, in
order, are its keys in the file, in order (msgspec writes them as declared), so the names other
tools read are written once, here, and tests/report/test_json_shape.py holds them.

Consumers read the dict view, `Summary.to_dict()` (what `summarize()` returns, equal to
json.loads(summary.json) but for the masking of secrets), not attributes: report.md, the CLI's
verdict line and exit code, the Locust tab, sweep and the tests index the very keys other tools
read from the file, several of them are being extended at once, and moving each to attributes
would be churn that checks nothing more. The typed form is what builds and writes the file, so a
block without a field here, a verdict outside `RunVerdict` or a count of the wrong type fails at
the first test that summarizes a run (`Summary.from_blocks`).

Adding a block: one field here, where it goes in the file (an open-ended map as dict[str, Any],
`| None` where a run may have none), and its line in summary.summary_of(). Blocks copied from the
history as written (wedge findings, the deployment, the reference's run.json entries) are typed
Any or dict: their content is the run's, and judging its shape is wedge_findings()'s job, not the
codec's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dsv4bench.history.run_folder import encode_record
from dsv4bench.history.verdict import RunVerdict


class _Block(msgspec.Struct, kw_only=True):
    """A block of summary.json: every field always written, None included."""


class Turns(_Block):
    """`turns`, and each row of by_depth / by_scenario (summary.outcome_counts says what each counts)."""

    total: int
    ok: int
    good: int
    killed: int
    corrupt: int
    error: int


class HistoryState(_Block):
    """`history`: whether the history holds every turn of its run, why not, and whether it ended."""

    complete: bool
    gaps: list[str]
    finished: bool


class Rate(_Block):
    """One code's row of `rates`: per counted turn, and per tool call for corruption codes."""

    per_turn: float | None
    per_tool_call: float | None


class Sessions(_Block):
    count: int
    finished: int
    ended_by: dict[str, int]


class Distribution(_Block):
    """One latency series: percentiles by `percentile_method`, None when it has no sample."""

    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    n: int


class Latency(_Block):
    ttft_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution


class Reference(_Block):
    """`reference` of a --reference run; run_dir, answers and conflicts as run.json holds them."""

    run_dir: Any
    answers: Any
    conflicts: Any
    compared: int
    mismatched: int


class Summary(_Block):
    """summary.json. `verdict`, `turns`, `tool_calls`, `counts` and `wedge` are the stable
    contract (docs/verdicts.md); the rest may grow, by a field here."""

    summary_version: int
    run: str
    verdict: RunVerdict
    wedge_checked: bool
    wedge_unchecked_reason: str | None
    history: HistoryState
    partial: bool
    # As the run_end event wrote it: a history may hold a reason this version never writes.
    end_reason: str | None
    skipped_lines: int
    duration_s: float | None
    turns: Turns
    corrupt_rate: float | None
    tool_calls: int
    bad_tool_calls: int
    counts: dict[str, int]
    rates: dict[str, Rate]
    check_errors: int
    unjudged: list[str]
    sessions: Sessions
    by_depth: dict[str, Turns]
    by_scenario: dict[str, Turns]
    by_variant: dict[str, dict[str, dict[str, Any]]]
    percentile_method: str
    latency: Latency
    events: dict[str, int]
    harness: dict[str, Any] | None  # the harness_clock event's figures: open-ended
    wedge: dict[str, dict[str, Any]]
    reference: Reference | None
    deployment: dict[str, Any] | None
    slo: dict[str, Any] | None
    triage: dict[str, Any] | None = None
    persistence: dict[str, Any] | None = None
    first_findings: dict[str, dict[str, Any]] | None = None
    cache: dict[str, Any] | None = None  # the KV cache pressure reached (report/cache_summary.py)
    coverage: list[dict[str, str]] | None = None  # what the run could not have found (report/coverage.py)

    @classmethod
    def from_blocks(cls, blocks: dict[str, Any]) -> Summary:
        """The Summary of summary_of()'s blocks; TypeError naming a block that has no field here
        (it would be left out of the file), msgspec.ValidationError for a value of the wrong type."""
        if unknown := [k for k in blocks if k not in cls.__struct_fields__]:
            raise TypeError(f"summary block(s) {unknown} have no field in Summary (report/summary_types.py)")
        return msgspec.convert(blocks, cls)

    def to_dict(self) -> dict[str, Any]:
        """The summary as the JSON objects it is written as (verdicts as their strings)."""
        return msgspec.to_builtins(self, enc_hook=str)

    def to_json(self) -> bytes:
        """summary.json's bytes: indented, secrets masked by structure, a newline at the end."""
        return encode_record(self, indent=2)[0] + b"\n"


def decode_summary(data: bytes | str) -> Summary:
    """A summary.json read back as a Summary; msgspec.ValidationError or DecodeError where it is
    not one (a block of a later version that this one does not know is skipped)."""
    return msgspec.json.decode(data, type=Summary)
