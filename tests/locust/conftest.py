"""Locust mode's tests share the end-to-end tests' servers (tests/e2e/conftest.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_e2e_conftest", Path(__file__).resolve().parents[1] / "e2e" / "conftest.py"
)
_e2e = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _e2e  # its dataclasses look their module up there
_spec.loader.exec_module(_e2e)

ROOT, free_port, only_run_dir, run_cli, start_replay, start_fixture_server = (
    _e2e.ROOT,
    _e2e.free_port,
    _e2e.only_run_dir,
    _e2e.run_cli,
    _e2e.start_replay,
    _e2e.start_fixture_server,
)
replay, clean_replay = _e2e.replay, _e2e.clean_replay
