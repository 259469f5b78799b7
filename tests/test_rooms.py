"""The harness's rooms and the directions their imports may run (as tests/engine/test_import_boundary.py
holds the engine's): each subpackage of dsv4bench/ imports only the rooms below it, so the tree
stays a set of floors with no loop between rooms. The metadata lists every package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dsv4bench"
# room -> the rooms it may import; a room always imports itself. `terminal` is the one leaf module
# at the top beside the rooms; `engine` and `agents` are the installed dsv4bench.engine / .agents.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "terminal": set(),
    "families": set(),
    "history": {"families"},
    "loop": set(),
    "wire": {"history", "loop"},
    "checks": {"history", "families", "wire"},
    "servers": {"history", "families", "wire", "terminal"},
    "report": {"history", "families", "checks", "servers", "terminal"},
    "harness": {"history", "families", "loop", "wire", "checks", "servers", "report", "terminal", "agents"},
    "modes": {"history", "families", "loop", "wire", "checks", "servers", "report", "harness", "terminal"},
    "locust": {"history", "families", "loop", "wire", "checks", "servers", "report", "harness", "terminal", "agents"},
    "cli": {
        "history",
        "families",
        "loop",
        "wire",
        "checks",
        "servers",
        "report",
        "harness",
        "modes",
        "locust",
        "terminal",
        "engine",
        "agents",
        "__init__",
    },
    "__main__": {"cli"},
    "__init__": set(),
}


def room_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_rooms(path: Path) -> set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: a relative import; rooms import each other by absolute name")
        for name in names:
            parts = name.split(".")
            if parts[0] == "dsv4bench":
                rooms.add(parts[1] if len(parts) > 1 else "__init__")
    return rooms


MODULES = sorted(p for p in PKG.rglob("*.py") if p.relative_to(PKG).parts[0] not in ("engine", "agents"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(ROOT)) for p in MODULES])
def test_each_module_imports_only_the_rooms_below_its_own(path: Path) -> None:
    room = room_of(path)
    assert room in ALLOWED, f"{room}: a room this test does not know; give it its floor in ALLOWED"
    wrong = imported_rooms(path) - ALLOWED[room] - {room}
    assert not wrong, f"{path.relative_to(ROOT)} ({room}) imports {sorted(wrong)}"


# Leaves every room may import: the error bases and the terminal's escaping.
for _room, _below in ALLOWED.items():
    if _room not in ("errors", "terminal", "__init__"):
        _below.add("errors")


def test_the_rooms_form_floors() -> None:
    """No two rooms may import each other, even through others: ALLOWED itself has no loop."""

    def reaches(a: str, b: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(n == b or (n not in seen and n in ALLOWED and reaches(n, b, seen | {n})) for n in ALLOWED[a])

    assert [r for r in ALLOWED if reaches(r, r)] == []


def test_the_package_metadata_lists_every_package() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "dsv4bench." + ".".join(p.parent.relative_to(PKG).parts) if p.parent != PKG else "dsv4bench"
        for p in PKG.rglob("__init__.py")
        if p.relative_to(PKG).parts[0] not in ("engine", "agents")
    }
    for extra, folder in (("dsv4bench.engine", ROOT / "engine"), ("dsv4bench.agents", ROOT / "agents")):
        found |= {
            extra + "".join("." + q for q in p.parent.relative_to(folder).parts) for p in folder.rglob("__init__.py")
        }
    assert found - listed == set(), "packages missing from pyproject's [tool.setuptools] packages"


def test_every_error_the_harness_raises_to_its_user_is_under_one_base() -> None:
    """dsv4bench/errors.py draws the tree; each class named there derives from Dsv4benchError, and
    no other Exception subclass of the harness is left outside it but the control-flow signals
    the tree's docstring names."""
    import dsv4bench.errors as errors

    signals = {"Refused", "UpstreamBroke", "BoundExceeded", "NoIterationStats", "TurnFailure"}
    outside = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ClassDef)
                and node.name.endswith(("Error", "Exception"))
                or isinstance(node, ast.ClassDef)
                and node.name in signals
            ):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if node.name in signals or path.name == "errors.py":
                    continue
                if not bases & {"Dsv4benchError", "UsageError", "ConfigError", "HistoryError"}:
                    outside.append(f"{path.relative_to(ROOT)}:{node.name}")
                assert node.name in (errors.__doc__ or ""), f"{node.name} is not drawn in dsv4bench/errors.py"
    assert outside == [], outside


def test_the_command_line_catches_the_base_once_as_one_line(monkeypatch, capsys) -> None:
    """An error of the tree that no command caught itself still ends as one line and exit 2."""
    import dsv4bench.cli as cli
    from dsv4bench.servers.preflight import ServerError

    def raising() -> None:
        raise ServerError("http://127.0.0.1:9/v1 answered nothing")

    monkeypatch.setattr(cli, "app", raising)
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == 2
    out = capsys.readouterr()
    assert "answered nothing" in out.err + out.out and "Traceback" not in out.err + out.out
