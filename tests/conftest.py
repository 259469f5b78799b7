"""What every test shares: events written by the product are held to their records
(dsv4bench/history/events.py), so a kind or field that has none fails the test that writes it,
in this process and in the CLI runs it starts (they inherit the environment)."""

from __future__ import annotations

import os

from dsv4bench.history.events import STRICT_ENV

os.environ[STRICT_ENV] = "1"
