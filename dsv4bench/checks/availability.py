"""Availability checks: the turn did not complete, and why (the family in dsv4bench/history/codes.py).

They read only `ctx.status`, `ctx.error_kind`, `ctx.http_status` and `ctx.error`; the
registry runs them for ERROR and TIMEOUT turns only, and each also returns [] on any other
status, so calling one on an OK or KILLED turn is harmless. Exactly one of the four fires
for any ERROR or TIMEOUT turn. `error_kind`, the client's own label, decides; the HTTP
status is only a fallback, because a stream that starts with 200 and then loses its
connection carries http_status 200 and is a connection error, not an HTTP error:

- `http_error`: status ERROR with `error_kind == "http_error"`, or unlabelled with an
  HTTP status that is an error (turn_answer.is_http_error: 3xx too, as no redirect is followed).
- `connection_error`: any other status ERROR (refused, reset, closed mid-stream; an
  unlabelled ERROR without an error status lands here too).
- `timeout_ttft`: status TIMEOUT with `error_kind == "timeout_ttft"`.
- `timeout_total`: status TIMEOUT with any other `error_kind` (None included: a timeout
  not known to be TTFT is counted against the whole request).
"""

from __future__ import annotations

from dsv4bench.checks.common import clip
from dsv4bench.history.records import ErrorKind, TurnContext, TurnStatus, Verdict, error_kind_text
from dsv4bench.wire.turn_answer import is_http_error


def _said(ctx: TurnContext) -> str:
    return f": {clip(ctx.error, 200)}" if ctx.error else ""


def _is_http_error(ctx: TurnContext) -> bool:
    if ctx.status is not TurnStatus.ERROR:
        return False
    if ctx.error_kind is not None:
        return ctx.error_kind == ErrorKind.HTTP_ERROR
    return ctx.http_status is not None and is_http_error(ctx.http_status)


def check_http_error(ctx: TurnContext) -> list[Verdict]:
    """The server answered with an HTTP error status (labelled `http_error`, or unlabelled with an error status)."""
    if not _is_http_error(ctx):
        return []
    status = f"HTTP {ctx.http_status}"
    if ctx.error and ctx.error.startswith(status):  # the client's message already names the status
        return [Verdict("http_error", clip(ctx.error, 200), "http")]
    return [Verdict("http_error", f"{status}{_said(ctx)}", "http")]


def check_connection_error(ctx: TurnContext) -> list[Verdict]:
    """The transport failed: refused, reset, or closed mid-stream (even after a 200 status line)."""
    if ctx.status is not TurnStatus.ERROR or _is_http_error(ctx):
        return []
    kind = error_kind_text(ctx.error_kind) or "unlabelled error"
    after = f" after HTTP {ctx.http_status}" if ctx.http_status is not None else ""
    return [Verdict("connection_error", f"{kind}{after}{_said(ctx)}", "transport")]


def check_timeout_ttft(ctx: TurnContext) -> list[Verdict]:
    """No first token within the TTFT timeout."""
    if ctx.status is not TurnStatus.TIMEOUT or ctx.error_kind != ErrorKind.TIMEOUT_TTFT:
        return []
    return [Verdict("timeout_ttft", f"no first token in time{_said(ctx)}", "ttft")]


def check_timeout_total(ctx: TurnContext) -> list[Verdict]:
    """The whole request outlived the total timeout (also any timeout not labelled TTFT)."""
    if ctx.status is not TurnStatus.TIMEOUT or ctx.error_kind == ErrorKind.TIMEOUT_TTFT:
        return []
    label = "" if ctx.error_kind == ErrorKind.TIMEOUT_TOTAL else f" (error_kind {error_kind_text(ctx.error_kind)!r})"
    return [Verdict("timeout_total", f"request did not finish in time{label}{_said(ctx)}", "e2e")]
