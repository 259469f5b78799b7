"""The declared gate: CI's command (README's test command) runs `ruff format --check .`,
`ruff check .` and `mypy` (rules in pyproject's [tool.ruff] and [tool.mypy]) after the install and
before the tests; and each suppression that stays, a `noqa` or a `type: ignore`, names its rule and
says why on its line. The gate itself runs outside pytest: these tests hold its declaration."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("dsv4bench", "engine", "agents", "scripts", "tests")
GATE = ("ruff format --check .", "ruff check .", "mypy")

_NOQA = re.compile(r"#\s*noqa\b")
_IGNORE = re.compile(r"#\s*type:\s*ignore\b")
# A noqa: its codes, then ` - why` (or `  # why`); a type ignore: [its codes], then `  # why`.
_NOQA_SAID = re.compile(r"#\s*noqa: [A-Z]+[0-9]+(?:, [A-Z]+[0-9]+)*(?: - |\s+#\s*)\S")
_IGNORE_SAID = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(?:, *[a-z-]+)*\]\s+#\s*\S")


def _ci_steps() -> list[str]:
    """The steps of CI's command, the last line of .ci/run (tests/test_docs.py holds it to README's)."""
    line = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    return [step.strip() for step in line.split("&&")]


def test_ci_runs_the_gate_after_the_install_and_before_the_tests() -> None:
    steps = _ci_steps()
    at = {cmd: steps.index(cmd) for cmd in GATE if cmd in steps}
    assert list(at) == list(GATE), f"CI's command lacks {[c for c in GATE if c not in at]}: {steps}"
    installs = [i for i, s in enumerate(steps) if s.startswith("pip install")]
    tests = [i for i, s in enumerate(steps) if s.startswith("pytest")]
    assert installs and tests, steps
    assert max(installs) < min(at.values()) and max(at.values()) < min(tests), steps


def _comments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each comment in a Python file (strings that look like comments are not)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def _unsaid(comments: list[tuple[int, str]]) -> list[str]:
    """The suppressions among `comments` that do not name their rule or say why."""
    out = []
    for line, text in comments:
        if _NOQA.search(text) and not _NOQA_SAID.search(text):
            out.append(f"{line}: {text}")
        if _IGNORE.search(text) and not _IGNORE_SAID.search(text):
            out.append(f"{line}: {text}")
    return out


def test_each_suppression_names_its_rule_and_says_why() -> None:
    files = sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py"))
    assert len(files) > 100
    found = {str(p.relative_to(ROOT)): bad for p in files if (bad := _unsaid(_comments(p)))}
    assert not found, found


@pytest.mark.parametrize(
    "comment",
    [
        "# noqa: BLE001 - a plot must never cost the report",
        "# noqa: F401, E402  # imported for what importing does",
        "# type: ignore[arg-type]  # uvicorn narrows it",
        "# type: ignore[valid-type, misc]  # a base looked up at run time",
        "# why first  # noqa: BLE001 - and then the rule",
    ],
)
def test_a_suppression_that_names_its_rule_and_says_why_passes(comment: str) -> None:
    assert _unsaid([(1, comment)]) == []


@pytest.mark.parametrize(
    "comment",
    [
        "# noqa",  # every rule, no why
        "# noqa: BLE001",  # no why
        "# noqa - the parser is odd",  # no rule
        "# type: ignore",
        "# type: ignore[attr-defined]",
        "# type: ignore  # aiohttp's internals",  # no code: it would silence every error there
        "# type: ignore[attr-defined] - the nemesis adds it",  # mypy reads no reason after a dash
    ],
)
def test_a_suppression_without_its_rule_or_its_why_is_found(comment: str) -> None:
    assert _unsaid([(1, comment)]) == [f"1: {comment}"]


def test_text_that_only_looks_like_a_suppression_is_not_read_as_one(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('MARK = "# type: ignore"\nNOTE = "# noqa"  # a string, not a comment\n', encoding="utf-8")
    assert _unsaid(_comments(src)) == []
