"""Load a file of scripts/ as a module for its tests, as `python scripts/NAME.py` would run it:
with scripts/ on sys.path, so a script that imports a sibling (bench_moe imports bench_decode)
finds it, and registered in sys.modules (dataclasses look their module up there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """The module of scripts/<name>.py, loaded once."""
    if name in sys.modules:
        return sys.modules[name]
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec and spec.loader, name
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
