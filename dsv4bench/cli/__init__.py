"""The `dsv4bench` command line: one module per command group, each a thin shell that turns its
flags into one config object and its errors into one line on stderr (exit 2).

- common.py: the typer app, the consoles, `fail`, the verdict line
- options.py: the flags several commands share, each declared once with its config's default
- agents.py: `agents`, the main job
- locust.py: `locust`, the same sessions as Locust users (web UI, headless, distributed)
- target.py: the server a load command drives (--url, or the bundled engine started for it)
- sweep.py: `sweep`, agents at rising concurrency: where corruption starts
- proxy.py: `proxy`, a user's own agent audited live through a pass-through
- servers.py: `probe` and `watch`, looking at running servers
- offline.py: `report` and `audit`, working on what was recorded
- engine.py: `engine serve`, `engine faults`, `engine train`
"""

from __future__ import annotations

import sys

# Each module registers its commands on `app` as it is imported, and `--help` lists them in that order.
from dsv4bench.cli import agents, locust, sweep, proxy, servers, offline, engine  # noqa: F401 - imported to register
from dsv4bench.cli.target import BUNDLED_PLACEHOLDER_URL
from dsv4bench.cli.common import app, err, fail
from dsv4bench.errors import Dsv4benchError

__all__ = ["BUNDLED_PLACEHOLDER_URL", "app", "main"]


def main() -> None:
    """Console entry point: Ctrl-C and broken pipes end quietly, never with a traceback; any of the
    harness's own errors (dsv4bench/errors.py: a report that could not be written at the end of
    any command, a server that cannot be used, ...) is one line (exit 2), caught here once."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Dsv4benchError as e:
        sys.exit(fail(str(e)).exit_code)
