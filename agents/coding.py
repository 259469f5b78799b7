"""The coding family: find and fix a planted bug in a small generated Python project."""

from __future__ import annotations

import fnmatch
import random
import re
from typing import Any

from .base import Observation, ScenarioFamily, Step, Task, ToolAction, ToolError, ToolSpec, World
from .coding_world import BY_NAME, Project, build_project, simulate_test
from .toolkit import ToolWorld, call, first_match, follow_plan, numbered, obj, successes

MAX_READ_LINES = 200

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "list_dir",
        "List the files under a directory of the repository, with their sizes.",
        obj(
            {
                "path": {
                    "type": "string",
                    "description": "Directory relative to the repository root; '.' for the root.",
                },
                "recursive": {"type": "boolean", "description": "Include files in subdirectories (default true)."},
            }
        ),
    ),
    ToolSpec(
        "read_file",
        "Read a text file with line numbers, optionally only a range of lines.",
        obj(
            {
                "path": {"type": "string", "minLength": 1},
                "start_line": {"type": "integer", "minimum": 1, "description": "First line to show (1-based)."},
                "end_line": {"type": "integer", "minimum": 1, "description": "Last line to show, included."},
            },
            ["path"],
        ),
    ),
    ToolSpec(
        "search_code",
        "Search the repository for a literal text and list matching lines.",
        obj(
            {
                "pattern": {"type": "string", "minLength": 1, "description": "Literal text to look for (not a regex)."},
                "glob": {
                    "type": "string",
                    "description": "Only search files whose path matches this glob, e.g. '*.py'.",
                },
                "max_results": {"type": "integer", "minimum": 1, "maximum": 100},
                "case_sensitive": {"type": "boolean"},
            },
            ["pattern"],
        ),
    ),
    ToolSpec(
        "edit_file",
        "Replace exact snippets of a file; each `old` must occur exactly once.",
        obj(
            {
                "path": {"type": "string", "minLength": 1},
                "edits": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 10,
                    "items": obj(
                        {
                            "old": {"type": "string", "minLength": 1, "description": "Exact text to replace."},
                            "new": {"type": "string", "description": "Replacement text."},
                        },
                        ["old", "new"],
                    ),
                },
            },
            ["path", "edits"],
        ),
    ),
    ToolSpec(
        "run_tests",
        "Run the project's test suite, or only the named tests.",
        obj(
            {
                "names": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "string", "minLength": 1},
                    "description": "Test function names, e.g. ['test_mean']; all tests when omitted.",
                },
                "verbosity": {"type": "string", "enum": ["quiet", "normal", "verbose"]},
            }
        ),
    ),
)


class CodingWorld(ToolWorld):
    """A virtual repository: a dict of path -> text, plus the project's test table."""

    tools = TOOLS

    def __init__(self, project: Project) -> None:
        self.project = project
        self.files = dict(project.files)

    def state(self) -> Any:
        return {"files": self.files}

    # --- tools ---------------------------------------------------------------------

    def tool_list_dir(self, path: str = ".", recursive: bool = True) -> str:
        prefix = path.strip().strip("/")
        prefix = "" if prefix in ("", ".") else prefix + "/"
        if prefix[:-1] in self.files:
            raise ToolError(f"{path!r} is a file, not a directory; use read_file")
        under = sorted(p for p in self.files if p.startswith(prefix))
        if not under:
            raise ToolError(f"no such directory: {path!r}")
        entries: list[str] = []
        dirs: set[str] = set()
        for p in under:
            rest = p[len(prefix) :]
            if "/" in rest:
                d = prefix + rest.split("/")[0] + "/"
                if d not in dirs:
                    dirs.add(d)
                    entries.append(f"{d:<34} <dir>")
                if not recursive:
                    continue
            text = self.files[p]
            entries.append(f"{p:<34} {text.count(chr(10)):>4} lines {len(text.encode()):>7,} bytes")
        mode = "recursive" if recursive else "top level"
        return f"Listing of {path or '.'} ({mode}): {len(under)} files\n" + "\n".join(entries)

    def tool_read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        text = self._file(path)
        lines = text.rstrip("\n").split("\n")
        if start_line > len(lines):
            raise ToolError(f"start_line {start_line} is past the end of {path} ({len(lines)} lines)")
        last = len(lines) if end_line is None else min(end_line, len(lines))
        if last < start_line:
            raise ToolError(f"end_line {end_line} is before start_line {start_line}")
        last = min(last, start_line + MAX_READ_LINES - 1)
        more = (
            "" if last == len(lines) else f"\n... ({len(lines) - last} more lines; read on with start_line={last + 1})"
        )
        head = f"{path} (lines {start_line}-{last} of {len(lines)})\n"
        return head + numbered(lines[start_line - 1 : last], start_line) + more

    def tool_search_code(
        self, pattern: str, glob: str = "*", max_results: int = 20, case_sensitive: bool = False
    ) -> str:
        needle = pattern if case_sensitive else pattern.lower()
        hits: list[str] = []
        for p in sorted(self.files):
            if not (fnmatch.fnmatchcase(p, glob) or fnmatch.fnmatchcase(p.rsplit("/", 1)[-1], glob)):
                continue
            for i, line in enumerate(self.files[p].split("\n"), 1):
                if needle in (line if case_sensitive else line.lower()):
                    hits.append(f"{p}:{i}: {line.strip()}")
        if not hits:
            return f"No matches for {pattern!r} in files matching {glob!r}."
        files = len({h.split(":", 1)[0] for h in hits})
        shown = hits[:max_results]
        tail = f"\n(showing {len(shown)}; raise max_results to see more)" if len(hits) > len(shown) else ""
        return f"{len(hits)} matches in {files} files for {pattern!r}:\n" + "\n".join(shown) + tail

    def tool_edit_file(self, path: str, edits: list[dict[str, str]]) -> str:
        key = self._resolve(path)
        text = self.files[key]
        # NOTE: all-or-nothing, like an editor's multi-edit: a bad snippet leaves the file as it was.
        spots: list[int] = []
        for n, e in enumerate(edits):
            count = text.count(e["old"])
            if count != 1:
                where = "not found" if count == 0 else f"found {count} times; add context to make it unique"
                raise ToolError(f"edits[{n}].old {where} in {path}")
            spots.append(text[: text.index(e["old"])].count("\n"))
            text = text.replace(e["old"], e["new"])
        self.files[key] = text
        lines = text.rstrip("\n").split("\n")
        shown = [numbered(lines[max(0, at - 4) : at + 5], max(0, at - 4) + 1) for at in spots]
        return f"Edited {path}: {len(edits)} replacement(s) applied.\n" + "\n...\n".join(shown)

    def tool_run_tests(self, names: list[str] | None = None, verbosity: str = "normal") -> str:
        order = [f"test_{n}" for n in self.project.locations]
        unknown = [n for n in names or [] if n not in order]
        if unknown:
            raise ToolError(f"unknown test(s) {unknown}; tests are: {', '.join(order)}")
        selected = [n for n in order if names is None or n in names]
        tpath = self.project.test_path
        tlines = self.files.get(tpath, "").split("\n")
        results: list[tuple[str, str | None]] = []
        for n in selected:
            fn = n[len("test_") :]
            results.append((n, simulate_test(self.files.get(self.project.locations[fn], ""), BY_NAME[fn])))
        failed = [(n, why) for n, why in results if why]
        out = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.11.8, pytest-8.1.1, pluggy-1.4.0",
            f"rootdir: /workspace/{self.project.package}",
            "configfile: pyproject.toml",
            f"collected {len(selected)} items",
            "",
        ]
        marks = "".join("F" if why else "." for _, why in results)
        if verbosity == "verbose":
            for i, (n, why) in enumerate(results, 1):
                out.append(f"{tpath}::{n} {'FAILED' if why else 'PASSED'} [{100 * i // len(results):>3}%]")
        else:
            out.append(f"{tpath if verbosity == 'normal' else ''} {marks} [100%]".strip())
        if failed:
            out += ["", "=================================== FAILURES ==================================="]
            for n, why in failed:
                line = next((i + 2 for i, t in enumerate(tlines) if t.startswith(f"def {n}(")), 0)
                src = tlines[line - 1].strip() if 0 < line <= len(tlines) else "assert ..."
                out += [
                    f"_________________________________ {n} _________________________________",
                    "",
                    f"    def {n}():",
                    f">       {src}",
                    str(why),
                    "",
                    f"{tpath}:{line}: AssertionError",
                ]
            out += ["=========================== short test summary info ============================"]
            out += [f"FAILED {tpath}::{n} - AssertionError" for n, _ in failed]
        passed = len(results) - len(failed)
        parts = ([f"{len(failed)} failed"] if failed else []) + ([f"{passed} passed"] if passed else [])
        out.append(
            f"========================= {', '.join(parts)} in {0.05 + 0.02 * len(results):.2f}s "
            "========================="
        )
        return "\n".join(out)

    def failing_tests(self) -> list[str]:
        """Names of the tests that fail on the current files."""
        return [
            f"test_{fn}"
            for fn, path in self.project.locations.items()
            if simulate_test(self.files.get(path, ""), BY_NAME[fn])
        ]

    def _resolve(self, path: str) -> str:
        key = path.strip()
        key = key[2:] if key.startswith("./") else key
        if key not in self.files:
            raise ToolError(f"no such file: {path!r}")
        return key

    def _file(self, path: str) -> str:
        return self.files[self._resolve(path)]


# --- tasks -------------------------------------------------------------------------

PROMPTS: dict[str, tuple[str, ...]] = {
    "named": (
        "The function `{function}` in `{module}` returns the wrong value: `{call}` gives `{actual}`, but it "
        "should give `{expected}`. Find and fix the bug, then run the tests to confirm.",
        "Bug report: in `{module}`, `{call}` evaluates to {actual} instead of {expected}. Please fix "
        "`{function}` and make sure the test suite passes.",
        "`{function}` (defined in `{module}`) is broken: for example `{call}` should return {expected} but "
        "returns {actual}. Fix it without touching the tests, and run them afterwards.",
    ),
    "report": (
        "A user of the {package} project reports that `{call}` returns {actual}, while the docs promise "
        "{expected}. Locate the function, fix it, and verify with the test suite.",
        "Something is off in {package}: calling `{call}` yields {actual}; the expected result is {expected}. "
        "Find where `{function}` is defined, correct it and rerun the tests.",
        "Our dashboards show wrong numbers. I traced it to `{call}`, which returns {actual} instead of "
        "{expected}. Please find the bug in the {package} codebase and fix it; run the tests when done.",
    ),
    "failing_test": (
        "CI is failing on `{test}` in `{test_path}`. Figure out why and fix the code (not the test), then run "
        "the test suite.",
        "The test `{test}` started failing after the last merge. Investigate, fix the underlying bug in the "
        "source, and confirm the suite is green.",
        "Please make `{test}` pass again. The test itself is correct; the bug is in the {package} package.",
    ),
    "red_suite": (
        "The test suite of the {package} project is red after a refactor. Find the failing test, fix the "
        "underlying bug in the source (do not edit tests), and confirm everything passes.",
        "Someone broke {package} and didn't notice. Run the tests, find what fails, fix the code and verify.",
        "Before we cut a release of {package}, make sure all tests pass: run them, fix whatever is broken in "
        "the package code, and report what you changed.",
    ),
}

SYSTEM_PROMPT = (
    "You are a careful software engineer working in a Python repository through tools. Explore before "
    "you change anything: list the files, read the README and the code involved, and run the tests to see "
    "the failure. Make the smallest edit that fixes the cause; never weaken or delete a test. After an "
    "edit, run the affected test and then the whole suite. When you are done, answer with a short summary "
    "of the cause, the change (file and line) and the final test result."
)


class CodingFamily(ScenarioFamily):
    """Coding agent on a virtual file tree: locate and fix a planted bug, then run the tests."""

    name = "coding"
    description = "Find and fix a bug in a small Python project, verified by its (simulated) test suite."
    system_prompt = SYSTEM_PROMPT
    tools = TOOLS

    def build_world(self, seed: int) -> CodingWorld:
        return CodingWorld(build_project(random.Random(f"coding-world:{seed}")))

    def make_task(self, world: World, seed: int) -> Task:
        assert isinstance(world, CodingWorld)
        rng = random.Random(f"coding-task:{seed}")
        p = world.project
        t = BY_NAME[p.bug]
        kind = rng.choice(sorted(PROMPTS))
        goal = {
            "kind": kind,
            "function": t.name,
            "module": p.locations[t.name],
            "test": f"test_{t.name}",
            "test_path": p.test_path,
            "package": p.package,
            "bug_line": t.bug,
            "fix_line": t.key,
            "call": t.call,
            "expected": t.expected,
            "actual": t.buggy_result,
        }
        prompt = rng.choice(PROMPTS[kind]).format(**goal)
        return Task(self.name, seed, prompt, goal)

    def expert_step(self, task: Task, seen: list[Observation]) -> Step:
        return follow_plan(task, seen, _STAGES, _finish)

    def solved(self, task: Task, world: World) -> bool:
        """Whether the whole (simulated) test suite passes."""
        assert isinstance(world, CodingWorld)
        return not world.failing_tests()


# --- the expert ----------------------------------------------------------------------


def _module(task: Task, seen: list[Observation]) -> str:
    """The module defining the function, as the search found it (the goal only as a fallback)."""
    m = first_match(seen, "search_code", rf"^(\S+\.py):\d+: def {re.escape(task.goal['function'])}\(", re.M)
    return m.group(1) if m else task.goal["module"]


def _readme(task: Task, seen: list[Observation]) -> list[ToolAction] | None:
    found = [first_match(seen, "list_dir", rf"^({name})\s", re.M) for name in (r"README\.md", r"pyproject\.toml")]
    return [call("read_file", path=m.group(1)) for m in found if m] or None


def _test_section(task: Task, seen: list[Observation]) -> list[ToolAction] | None:
    path = task.goal["test_path"]
    m = first_match(seen, "run_tests", rf"^({re.escape(path)}):(\d+): AssertionError", re.M)
    if m is None:
        return [call("read_file", path=path)]
    line = int(m.group(2))
    return [call("read_file", path=m.group(1), start_line=max(1, line - 40), end_line=line + 40)]


def _edit(task: Task, seen: list[Observation]) -> list[ToolAction] | None:
    g = task.goal
    module = _module(task, seen)
    for o in successes(seen, "edit_file"):
        edits = o.action.arguments.get("edits") or []
        if o.action.arguments.get("path") == module and any(
            isinstance(e, dict) and g["fix_line"] in str(e.get("new")) for e in edits
        ):
            return None  # someone already made the fix
    return [call("edit_file", path=module, edits=[{"old": g["bug_line"], "new": g["fix_line"]}])]


def _verify_read(task: Task, seen: list[Observation]) -> list[ToolAction] | None:
    """Re-read the edited function, located by the search hit, to check the change in place."""
    m = first_match(seen, "search_code", rf"^(\S+\.py):(\d+): def {re.escape(task.goal['function'])}\(", re.M)
    if m is None:
        return None
    line = int(m.group(2))
    return [call("read_file", path=m.group(1), start_line=max(1, line - 3), end_line=line + 30)]


_STAGES = (
    lambda t, s: [call("list_dir", path=".", recursive=True)],
    _readme,
    lambda t, s: [call("run_tests", verbosity="verbose")],
    lambda t, s: [
        call("search_code", pattern=f"def {t.goal['function']}(", glob="*.py", max_results=20, case_sensitive=True)
    ],
    lambda t, s: [call("read_file", path=_module(t, s))],
    lambda t, s: [call("search_code", pattern=f"{t.goal['function']}(", max_results=30)],
    _test_section,
    _edit,
    _verify_read,
    lambda t, s: [call("run_tests", names=[t.goal["test"]], verbosity="normal")],
    lambda t, s: [call("run_tests", verbosity="quiet")],
)


def _finish(task: Task, seen: list[Observation]) -> str:
    g = task.goal
    runs = successes(seen, "run_tests")
    summary = runs[-1].result.strip().split("\n")[-1].strip("= ") if runs else "no test run"
    fixed = any(o.action.arguments.get("path") == _module(task, seen) for o in successes(seen, "edit_file"))
    if fixed and "failed" not in summary:
        return (
            f"Fixed `{g['function']}` in `{_module(task, seen)}`: the line `{g['bug_line']}` contradicted the "
            f"docstring's rule, so I replaced it with `{g['fix_line']}`. Now `{g['call']}` returns "
            f"{g['expected']}. Test suite: {summary}."
        )
    return (
        f"I could not confirm a fix for `{g['function']}` (expected `{g['call']}` == {g['expected']}). "
        f"Last test run: {summary}."
    )
