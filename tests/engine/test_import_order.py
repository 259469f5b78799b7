"""Every kernel module, and the model package that imports them, imports first in a fresh
interpreter: no import cycle that works only when another module happened to be imported
before (the kernels package once failed as a circular import unless the model came first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dsv4bench.engine

ENGINE = Path(dsv4bench.engine.__file__).resolve().parent
MODULES = [
    "dsv4bench.engine.model",
    *sorted(f"dsv4bench.engine.kernels.{p.stem}".removesuffix(".__init__") for p in (ENGINE / "kernels").glob("*.py")),
]


def test_every_module_imports_first():
    # one interpreter each, started together: the imports are mostly torch's, a second each
    runs = {
        m: subprocess.Popen(
            [sys.executable, "-c", f"import {m}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for m in MODULES
    }
    failed = {m: p.communicate(timeout=300)[1][-1500:] for m, p in runs.items()}
    assert len(MODULES) >= 7
    assert {m: err for m, err in failed.items() if runs[m].returncode != 0} == {}
