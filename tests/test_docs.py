"""The docs a newcomer reads: README.md fits a screen and names every command, each link in README.md,
CONTRIBUTING.md, ARCHITECTURE.md and docs/ reaches a file (and a heading, where it names one), every
source path they name in backticks exists, README's test command is the one CI runs, and
bench-plan.md opens with its table of today's figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from dsv4bench.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
# The pages written for readers of today's tree (bench-plan.md is a notebook: its history names
# files as they were then, so only its links are held).
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "ARCHITECTURE.md", *DOCS]
LINKED = [*PAGES, ROOT / "bench-plan.md"]

_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_SOURCE_PATH = re.compile(r"(?<![\w./-])((?:dsv4bench|engine|agents|tests|scripts)/[\w./-]*)")


def _without_fences(text: str) -> str:
    """The text outside fenced code blocks (links and code spans are not parsed inside them)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", _without_fences(page.read_text(encoding="utf-8")), re.M)}


def test_readme_fits_a_screen_or_two() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n < 160, f"README.md is {n} lines: move the reference into docs/"


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_without_fences(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_source_path_named_in_backticks_exists(page: Path) -> None:
    named = {
        m
        for span in _CODE_SPAN.findall(_without_fences(page.read_text(encoding="utf-8")))
        for m in _SOURCE_PATH.findall(span)
    }
    missing = sorted(p for p in named if "*" not in p and not (ROOT / p.rstrip(".")).exists())
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_layout_page_names_only_modules_that_exist() -> None:
    """docs/layout.md's tree: every top-level folder exists, and every module it lists under
    `dsv4bench/` is a file somewhere in that package."""
    block = re.search(
        r"^```\n(.*?)^```", (ROOT / "docs" / "layout.md").read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE
    )
    assert block, "docs/layout.md has no tree"
    top = re.findall(r"^([\w-]+)/", block[1], re.M)
    assert {"agents", "dsv4bench", "engine", "tests"} <= set(top)
    assert [t for t in top if not (ROOT / t).is_dir()] == []
    package = re.split(r"\ndsv4bench/[^\n]*\n", block[1], maxsplit=1)[1].split("\nengine/", 1)[0]
    modules = set(re.findall(r"\b(\w+\.py)\b", package))
    assert len(modules) > 20
    assert sorted(m for m in modules if not any((ROOT / "dsv4bench").rglob(m))) == []


def test_every_docs_page_is_linked_from_readme() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _LINK.findall(README.read_text(encoding="utf-8"))}
    assert [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in linked] == []


def test_readme_has_one_line_per_command() -> None:
    """Each command of the CLI (and each `engine` subcommand) has its row in README's table."""
    text = README.read_text(encoding="utf-8")
    root = typer.main.get_command(app)
    names = []
    for name, command in root.commands.items():
        subs = getattr(command, "commands", None)
        names += [f"{name} {sub}" for sub in subs] if subs else [name]
    assert len(names) >= 10
    missing = [n for n in names if not re.search(rf"^\| `dsv4bench {re.escape(n)}`", text, re.M)]
    assert not missing, f"README.md's command table lacks {missing}"


def test_readme_gives_the_test_command_ci_runs() -> None:
    """.ci/run runs exactly README's test command; README keeps it in a fenced sh block."""
    ci_line = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    blocks = re.findall(r"^```sh\n(.*?)^```", README.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)
    assert ci_line.startswith("python3 -m venv .venv") and "pytest" in ci_line
    assert f"{ci_line}\n" in blocks


def test_bench_plan_opens_with_todays_figures() -> None:
    """The first section of bench-plan.md is one table (figure, value, command, machine, date); each
    row has a date and a command whose script or module exists."""
    text = (ROOT / "bench-plan.md").read_text(encoding="utf-8")
    first = text.split("\n## ", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in first.splitlines() if line.startswith("|")]
    assert rows[0].replace(" ", "") == "|figure|value|command|machine|date|"
    body = rows[2:]
    assert len(body) >= 10
    for row in body:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 5, row
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", cells[4]), row
        for script in re.findall(r"python (?:-m )?(scripts/\w+\.py|[\w.]+)", cells[2]):
            if script.endswith(".py"):
                assert (ROOT / script).is_file(), row
            else:
                assert script.startswith("dsv4bench."), row
