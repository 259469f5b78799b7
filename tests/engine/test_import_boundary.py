"""The serving engine never imports the harness's scenario packs or the making of weights:
a `dsv4bench engine serve` process loads neither `dsv4bench.agents` nor
`dsv4bench.engine.training` (nor torch.compile's machinery), and no file of engine/ outside training/ names them."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
from pathlib import Path

import dsv4bench.engine

ENGINE = Path(dsv4bench.engine.__file__).resolve().parent
FORBIDDEN = ("dsv4bench.agents", "dsv4bench.engine.training")
SERVING = [
    "dsv4bench.engine.serve",
    "dsv4bench.engine.deployment",
    "dsv4bench.engine.pd.halves",
    "dsv4bench.engine.pd.http_router",
    "dsv4bench.engine.server",
    "dsv4bench.engine.launcher",
    "dsv4bench.engine.model_runner",
]


def forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def module_name(path: Path) -> str:
    parts = ["dsv4bench", "engine", *path.relative_to(ENGINE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parse(path: Path) -> ast.Module:
    """`ast.parse` with the collector off while it builds the tree.

    NOTE: Python 3.11 keeps one recursion counter for building AST objects (CPython gh-106905).
    A collection during the build can run a finalizer whose warning pytest's unraisable hook
    formats as a traceback, and formatting a traceback parses source: that nested build resets
    the counter, and the outer one fails with `SystemError: AST constructor recursion depth
    mismatch` (seen in CI, with a socket another test's server thread left to the collector).
    Garbage is collected once before the parses instead (the test's start), where its warnings
    are what they are: once, not per file, since a full collection of the suite's heap took about
    0.2 s a file in CI."""
    source = path.read_text()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, str(path))
    finally:
        if was_enabled:
            gc.enable()


def imported_names(path: Path) -> set[str]:
    """Every module an import statement in the file names, relative imports resolved."""
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    names = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package[: len(package) - node.level + 1]
                base = ".".join([*head, base] if base else head)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def serving_files() -> list[Path]:
    return [p for p in sorted(ENGINE.rglob("*.py")) if "training" not in p.relative_to(ENGINE).parts]


def test_no_engine_file_outside_training_imports_agents_or_training():
    gc.collect()  # the garbage other tests left, collected before any parse (see _parse)
    bad = {str(p.relative_to(ENGINE)): sorted(n for n in imported_names(p) if forbidden(n)) for p in serving_files()}
    assert serving_files() and not {k: v for k, v in bad.items() if v}


def test_the_static_walk_sees_relative_and_absolute_imports():
    training = ENGINE / "training" / "corpus.py"
    assert any(n.startswith("dsv4bench.agents") for n in imported_names(training))
    assert "dsv4bench.engine.training.renames" in imported_names(training)


def test_a_serving_process_loads_neither_agents_nor_training(tmp_path):
    code = f"import sys; import {', '.join(SERVING)}; print('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "dsv4bench.engine.serve" in loaded and "dsv4bench.engine.pd.halves" in loaded
    assert [m for m in loaded if forbidden(m)] == []
    # nor torch.compile's machinery (some 1.4 s of every engine start on a CPU): only a
    # compiled CUDA step needs it, and loads it then (model/pool_writes.py)
    assert "torch._dynamo.eval_frame" not in loaded
