"""The harness's own errors: one tree under one base, which the command line catches once and prints
as one line (exit 2), never a traceback.

    Dsv4benchError
    ├── UsageError                  what the user gave cannot be used
    │   ├── ConfigError             a flag or the run's config (harness/config.py; also a ValueError)
    │   ├── RequestMixError         --request-mix (harness/request_mix.py; also a ValueError)
    │   ├── SloError                --slo's latency targets (report/slo.py; also a ValueError)
    │   ├── SessionConfigError      a session's settings (harness/session.py; also a ValueError)
    │   ├── ContextProfileError     --context (harness/context_profile.py; also a ValueError)
    │   ├── CachePlanError          --cache-pressure past what the server can hold (harness/cache_plan.py)
    │   ├── ReferenceRunError       --reference RUN (harness/reference_run.py)
    │   ├── CaptureError            --replay CAPTURE (modes/replay.py)
    │   └── AuditError              what audit was given (modes/audit.py)
    ├── ServerError                 the target server cannot be used (servers/preflight.py)
    ├── HostLimitError              this machine cannot hold the run (servers/preflight.py)
    ├── HistoryError                a run folder that cannot be read (history/run_folder.py)
    ├── ReportError                 a report that cannot be written (history/run_folder.py)
    └── ExporterError               --serve-metrics cannot serve (harness/exporter.py)

Each class lives beside the code that raises it; this module holds the bases only. Signals that
never leave the module that raises them (the proxy's Refused and UpstreamBroke, the stream
reader's BoundExceeded, the dialect's NoIterationStats, Locust's TurnFailure) are control flow,
not errors of the run, and stay outside the tree.
"""

from __future__ import annotations


class Dsv4benchError(Exception):
    """The base of every error the harness raises to its user."""


class UsageError(Dsv4benchError):
    """What the user gave (a flag, a file, a plan) cannot be used: said in one line."""
