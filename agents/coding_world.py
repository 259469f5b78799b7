"""The small Python project the coding family's tools act on, generated from a seed.

A project is a package of a few modules built from `FunctionTemplate`s, a test file with
one test per function, a README and a pyproject.toml. One function carries a planted bug:
its key line replaced by a plausible wrong one. Tests are simulated, not executed: a test
passes when its function's body holds the key line and not the buggy one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class FunctionTemplate:
    """A function, the test that pins it down, and the bug that can be planted in it."""

    name: str
    signature: str
    summary: str
    formula: str  # the docstring's statement of the rule; the fix can be read off it
    args: tuple[tuple[str, str], ...]
    body: tuple[str, ...]  # relative to the function body's indentation
    key: str  # the line that must be present (one of `body`, stripped)
    bug: str  # the planted replacement of `key`
    call: str
    expected: str
    buggy_result: str


def _t(
    name: str,
    signature: str,
    summary: str,
    formula: str,
    args: str,
    body: str,
    bug: str,
    call: str,
    expected: str,
    buggy_result: str,
    key: str = "",
) -> FunctionTemplate:
    lines = tuple(body.split("\n"))
    arg_docs = tuple((a.split(": ", 1)[0], a.split(": ", 1)[1]) for a in args.split("; "))
    return FunctionTemplate(
        name, signature, summary, formula, arg_docs, lines, key or lines[-1].strip(), bug, call, expected, buggy_result
    )


# The key line is the body's last line unless given; bug lines appear nowhere else.
TEMPLATES: tuple[FunctionTemplate, ...] = (
    _t(
        "clamp",
        "(value: float, low: float, high: float) -> float",
        "Limit value to the closed range [low, high].",
        "The result is ``max(low, min(value, high))``.",
        "value: the number to limit; low: the lower bound; high: the upper bound, not below low",
        'if low > high:\n    raise ValueError("low must not exceed high")\nreturn max(low, min(value, high))',
        "return min(low, max(value, high))",
        "clamp(15, 0, 10)",
        "10",
        "0",
    ),
    _t(
        "mean",
        "(values: list[float]) -> float",
        "Arithmetic mean of a non-empty list.",
        "The result is ``sum(values) / len(values)``.",
        "values: the numbers to average",
        'if not values:\n    raise ValueError("mean of an empty list")\nreturn sum(values) / len(values)',
        "return sum(values) / (len(values) + 1)",
        "mean([2, 4, 6])",
        "4.0",
        "3.0",
    ),
    _t(
        "percent",
        "(part: float, whole: float) -> float",
        "Express part as a percentage of whole.",
        "The result is ``100.0 * part / whole``.",
        "part: the portion measured; whole: the total, not zero",
        'if whole == 0:\n    raise ZeroDivisionError("whole must not be zero")\nreturn 100.0 * part / whole',
        "return part / whole",
        "percent(1, 4)",
        "25.0",
        "0.25",
    ),
    _t(
        "fahrenheit",
        "(celsius: float) -> float",
        "Convert a temperature from Celsius to Fahrenheit.",
        "The result is ``celsius * 9 / 5 + 32``.",
        "celsius: the temperature in degrees Celsius",
        "# NOTE: no rounding here; callers format for display.\nreturn celsius * 9 / 5 + 32",
        "return celsius * 5 / 9 + 32",
        "fahrenheit(45)",
        "113.0",
        "57.0",
    ),
    _t(
        "total_between",
        "(start: int, stop: int) -> int",
        "Sum of the integers from start to stop, both included.",
        "The result is ``sum(range(start, stop + 1))``.",
        "start: the first integer; stop: the last integer, included",
        "if stop < start:\n    return 0\nreturn sum(range(start, stop + 1))",
        "return sum(range(start, stop))",
        "total_between(1, 4)",
        "10",
        "6",
    ),
    _t(
        "apply_discount",
        "(price: float, rate: float) -> float",
        "Price after a fractional discount, to the cent.",
        "The result is ``round(price * (1 - rate), 2)``.",
        "price: the list price; rate: the discount, between 0 and 1",
        'if not 0 <= rate <= 1:\n    raise ValueError("rate must be within [0, 1]")\n'
        "return round(price * (1 - rate), 2)",
        "return round(price * rate, 2)",
        "apply_discount(80.0, 0.25)",
        "60.0",
        "20.0",
    ),
    _t(
        "is_leap_year",
        "(year: int) -> bool",
        "Whether year is a leap year in the Gregorian calendar.",
        "The rule is ``year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)``.",
        "year: a positive year",
        "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
        "return year % 4 == 0 and year % 100 != 0",
        "is_leap_year(2000)",
        "True",
        "False",
    ),
    _t(
        "last_items",
        "(items: list[int], count: int) -> list[int]",
        "The last count items of a list.",
        "The result is ``items[-count:]`` for a positive count, else an empty list.",
        "items: the source list; count: how many trailing items to keep",
        "return items[-count:] if count > 0 else []",
        "return items[-count + 1:] if count > 0 else []",
        "last_items([1, 2, 3, 4], 2)",
        "[3, 4]",
        "[4]",
    ),
    _t(
        "word_count",
        "(text: str) -> int",
        "Number of whitespace-separated words in text.",
        "Words are counted as ``len(text.split())``, so runs of spaces count once.",
        "text: any string",
        "return len(text.split())",
        'return len(text.split(" "))',
        'word_count("alpha  beta gamma")',
        "3",
        "4",
    ),
    _t(
        "safe_ratio",
        "(numerator: float, denominator: float, default: float) -> float",
        "numerator / denominator, or default when the denominator is zero.",
        "The result is ``numerator / denominator`` when the denominator is non-zero.",
        "numerator: the dividend; denominator: the divisor; default: returned for a zero divisor",
        "return numerator / denominator if denominator else default",
        "return denominator / numerator if denominator else default",
        "safe_ratio(6, 3, 0.0)",
        "2.0",
        "0.5",
    ),
    _t(
        "normalize_name",
        "(name: str) -> str",
        "Collapse whitespace and capitalize each part of a name.",
        "Each part is ``part.capitalize()``, parts joined by one space.",
        "name: a person's name as typed",
        'return " ".join(part.capitalize() for part in name.split())',
        'return " ".join(part.upper() for part in name.split())',
        'normalize_name("ada  lovelace")',
        "'Ada Lovelace'",
        "'ADA LOVELACE'",
    ),
    _t(
        "running_total",
        "(values: list[int]) -> list[int]",
        "Prefix sums of values.",
        "Each step accumulates with ``acc += value``.",
        "values: the increments",
        "totals: list[int] = []\nacc = 0\nfor value in values:\n    acc += value\n    totals.append(acc)\n"
        "return totals",
        "acc = value",
        "running_total([1, 2, 3])",
        "[1, 3, 6]",
        "[1, 2, 3]",
        key="acc += value",
    ),
    _t(
        "compound",
        "(principal: float, rate: float, years: int) -> float",
        "Balance after yearly compound interest.",
        "The result is ``round(principal * (1 + rate) ** years, 2)``.",
        "principal: the starting balance; rate: the yearly rate; years: whole years",
        "return round(principal * (1 + rate) ** years, 2)",
        "return round(principal * (1 + rate) * years, 2)",
        "compound(100.0, 0.1, 2)",
        "121.0",
        "220.0",
    ),
    _t(
        "chunk",
        "(items: list[int], size: int) -> list[list[int]]",
        "Split items into consecutive chunks of size.",
        "Chunks start at ``range(0, len(items), size)``; the last one may be shorter.",
        "items: the list to split; size: the chunk length, at least 1",
        'if size < 1:\n    raise ValueError("size must be at least 1")\n'
        "return [items[i:i + size] for i in range(0, len(items), size)]",
        "return [items[i:i + size] for i in range(0, len(items) - 1, size)]",
        "chunk([1, 2, 3, 4, 5], 2)",
        "[[1, 2], [3, 4], [5]]",
        "[[1, 2], [3, 4]]",
    ),
    _t(
        "count_vowels",
        "(text: str) -> int",
        "Number of vowels in text, ignoring case.",
        'Counts characters of ``text.lower()`` that are in "aeiou".',
        "text: any string",
        'return sum(1 for ch in text.lower() if ch in "aeiou")',
        'return sum(1 for ch in text if ch in "aeiou")',
        'count_vowels("Education")',
        "5",
        "4",
    ),
    _t(
        "bmi",
        "(weight_kg: float, height_m: float) -> float",
        "Body-mass index, one decimal.",
        "The result is ``round(weight_kg / height_m ** 2, 1)``.",
        "weight_kg: the mass in kilograms; height_m: the height in metres",
        'if height_m <= 0:\n    raise ValueError("height must be positive")\n'
        "return round(weight_kg / height_m ** 2, 1)",
        "return round(weight_kg / height_m * 2, 1)",
        "bmi(72.0, 1.8)",
        "22.2",
        "80.0",
    ),
    _t(
        "elapsed_minutes",
        "(start_seconds: int, end_seconds: int) -> int",
        "Whole minutes between two timestamps.",
        "The result is ``(end_seconds - start_seconds) // 60``.",
        "start_seconds: the earlier time; end_seconds: the later time",
        "return (end_seconds - start_seconds) // 60",
        "return (end_seconds - start_seconds) % 60",
        "elapsed_minutes(0, 330)",
        "5",
        "30",
    ),
    _t(
        "median",
        "(values: list[float]) -> float",
        "Middle value of a non-empty list.",
        "For an even length the result is ``(ordered[mid - 1] + ordered[mid]) / 2``.",
        "values: the sample",
        "ordered = sorted(values)\nmid = len(ordered) // 2\nif len(ordered) % 2:\n    return ordered[mid]\n"
        "return (ordered[mid - 1] + ordered[mid]) / 2",
        "return (ordered[mid] + ordered[mid + 1]) / 2",
        "median([4, 1, 3, 2])",
        "2.5",
        "3.5",
    ),
)
BY_NAME = {t.name: t for t in TEMPLATES}

PACKAGES = ("ledger", "tally", "almanac", "harbor", "quarry", "orchard", "fieldkit", "beacon")
MODULES = ("core", "mathutil", "textops", "finance", "timeutil", "stats", "listops", "convert", "helpers")
PURPOSES = (
    "bookkeeping scripts",
    "a weekly reporting job",
    "the data team's notebooks",
    "a billing service",
    "a field survey app",
    "the warehouse dashboards",
)


def render_function(t: FunctionTemplate, buggy: bool) -> list[str]:
    """The source lines of one function, with its docstring and example."""
    body = [f"    {line}" for line in t.body]
    if buggy:
        body = [line.replace(t.key, t.bug) if line.strip() == t.key else line for line in body]
    args = [f"        {name}: {text}." for name, text in t.args]
    returns = t.signature.rsplit("-> ", 1)[1]
    raises = [line.split("raise ", 1)[1].split("(")[0] for line in t.body if "raise " in line]
    notes = (
        ["    Raises:", f"        {raises[0]}: for arguments outside the documented domain.", ""]
        if raises
        else ["    Notes:", "        Total over its documented domain; no argument raises.", ""]
    )
    return [
        f"def {t.name}{t.signature}:",
        f'    """{t.summary}',
        "",
        f"    {t.formula}",
        "",
        "    Args:",
        *args,
        "",
        "    Returns:",
        f"        A new {returns}; the arguments are not modified.",
        "",
        *notes,
        "    Example:",
        f"        >>> {t.call}",
        f"        {t.expected}",
        '    """',
        *body,
    ]


def function_span(lines: list[str], name: str) -> tuple[int, int] | None:
    """0-based [start, end) of a top-level function's lines, or None when it is absent."""
    start = next((i for i, line in enumerate(lines) if line.startswith(f"def {name}(")), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "\t")), len(lines))
    return start, end


def _norm(line: str) -> str:
    return " ".join(line.split())


def simulate_test(module_text: str, t: FunctionTemplate) -> str | None:
    """None when the simulated test passes, else the failure's explanation lines."""
    lines = module_text.split("\n")
    span = function_span(lines, t.name)
    if span is None:
        return f"E   ImportError: cannot import name '{t.name}'"
    body = {_norm(line) for line in lines[span[0] : span[1]]}
    if _norm(t.bug) in body:
        return f"E       assert {t.buggy_result} == {t.expected}\nE        +  where {t.buggy_result} = {t.call}"
    if _norm(t.key) not in body:
        return f"E       AssertionError: {t.call} did not return {t.expected}"
    return None


@dataclass(frozen=True)
class Project:
    """A generated project: its files, where each function lives, and the planted bug."""

    package: str
    files: dict[str, str]
    locations: dict[str, str]  # function name -> module path
    test_path: str
    bug: str  # the name of the function with the planted bug


def build_project(rng: random.Random) -> Project:
    """Generate a project with 3-4 modules of 4-5 functions each and one planted bug."""
    package = rng.choice(PACKAGES)
    modules = rng.sample(MODULES, rng.randint(3, 4))
    funcs = rng.sample(TEMPLATES, min(len(TEMPLATES), 4 * len(modules) + rng.randint(0, 2)))
    bug = rng.choice(funcs).name
    groups: dict[str, list[FunctionTemplate]] = {m: [] for m in modules}
    for i, t in enumerate(funcs):
        groups[modules[i % len(modules)]].append(t)
    files: dict[str, str] = {}
    locations: dict[str, str] = {}
    for mod, ts in groups.items():
        path = f"{package}/{mod}.py"
        files[path] = _render_module(package, mod, ts, bug, rng)
        locations.update((t.name, path) for t in ts)
        # NOTE: the expert's edit replaces the bug line by exact match, so it must occur once.
        assert bug not in {t.name for t in ts} or files[path].count(BY_NAME[bug].bug) == 1, (package, mod, bug)
    version = f"0.{rng.randint(2, 9)}.{rng.randint(0, 12)}"
    files[f"{package}/__init__.py"] = f'"""The {package} package."""\n\n__version__ = "{version}"\n'
    test_path = f"tests/test_{package}.py"
    files[test_path] = _render_tests(package, groups)
    files["README.md"] = _render_readme(package, groups, test_path, rng)
    files["pyproject.toml"] = (
        f'[project]\nname = "{package}"\nversion = "0.{rng.randint(2, 9)}.0"\n'
        f'requires-python = ">=3.10"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
        f'addopts = "-ra"\n\n[tool.ruff]\nline-length = {rng.choice((100, 110, 120))}\n'
    )
    return Project(package, files, locations, test_path, bug)


def _render_module(package: str, mod: str, ts: list[FunctionTemplate], bug: str, rng: random.Random) -> str:
    names = ", ".join(f'"{t.name}"' for t in ts)
    lines = [
        f'"""{mod.capitalize()} helpers of the {package} package.',
        "",
        f"Used by {rng.choice(PURPOSES)}; every function is pure and documented with an example",
        "that the test suite mirrors. Keep the docstring formulas in sync with the code.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "",
        f"__all__ = [{names}]",
        "",
        f"PRECISION = {rng.choice((2, 3, 4))}",
        "",
        "",
        "@dataclass(frozen=True)",
        "class Options:",
        f'    """Settings shared by the {mod} helpers when they format results for display."""',
        "",
        "    precision: int = PRECISION",
        f"    strict: bool = {rng.choice(('True', 'False'))}",
        f'    label: str = "{mod}"',
        "",
        "    def describe(self) -> str:",
        '        """One line for log messages."""',
        '        return f"{self.label}: precision={self.precision}, strict={self.strict}"',
        "",
    ]
    for t in ts:
        lines += ["", *render_function(t, t.name == bug), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _render_tests(package: str, groups: dict[str, list[FunctionTemplate]]) -> str:
    lines = [f'"""Tests for the {package} package: one per public function, mirroring the docstring examples."""', ""]
    for mod, ts in groups.items():
        lines.append(f"from {package}.{mod} import {', '.join(t.name for t in ts)}")
    for ts in groups.values():
        for t in ts:
            lines += ["", "", f"def test_{t.name}():", f"    assert {t.call} == {t.expected}"]
    return "\n".join(lines) + "\n"


def _render_readme(package: str, groups: dict[str, list[FunctionTemplate]], test_path: str, rng: random.Random) -> str:
    lines = [f"# {package}", "", f"Small, dependency-free helpers used by {rng.choice(PURPOSES)}.", "", "## Layout", ""]
    for mod, ts in groups.items():
        lines.append(f"- `{package}/{mod}.py`: " + ", ".join(f"`{t.name}`" for t in ts))
    lines += ["", "## Functions", ""]
    for ts in groups.values():
        for t in ts:
            lines.append(f"- `{t.name}{t.signature}`: {t.summary} {t.formula}")
    first = next(iter(groups.values()))[:3]
    lines += ["", "## Usage", "", "```python"]
    lines += [f"from {package}.{next(iter(groups))} import {', '.join(t.name for t in first)}", ""]
    lines += [f"print({t.call})  # {t.expected}" for t in first]
    lines += [
        "```",
        "",
        "## Development",
        "",
        f"Run the suite with `pytest -q` (tests live in `{test_path}`).",
        "Every public function has a docstring that states its rule and one example; the test",
        "for the function asserts that example. When a test fails, fix the code, not the test.",
        "",
        "## Conventions",
        "",
        "- Pure functions only: no I/O, no globals.",
        "- Type hints on every signature; `from __future__ import annotations` at the top.",
        "- Raise `ValueError` for arguments outside the documented domain.",
        "",
        "## Changelog",
        "",
        f"- 0.{rng.randint(5, 9)}: split the helpers into {len(groups)} modules; docstrings now state each rule.",
        "- 0.4: added examples to every docstring and a test per example.",
        "- 0.3: dropped Python 3.8 support; type hints use builtin generics.",
        "- 0.2: first internal release.",
    ]
    return "\n".join(lines) + "\n"
