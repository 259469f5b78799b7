"""Test fixtures for the benchmark scripts: tests/ is not an installed package, so a fixture
module is loaded by its path. Scripts import this as a sibling (`python scripts/x.py` puts
scripts/ first on the import path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_fixture(name: str) -> ModuleType:
    """tests/fixtures/NAME.py as a module."""
    path = ROOT / "tests" / "fixtures" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"dsv4bench_fixture_{name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
