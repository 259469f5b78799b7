"""The table of verdict codes: docs/verdicts.md lists exactly its codes, each has a checker or is run-level."""

from __future__ import annotations

import re
from pathlib import Path

from dsv4bench.checks import CHECKERS, ORACLE_CHECKER
from dsv4bench.history.codes import (
    AVAILABILITY,
    CODES,
    CORRUPTION,
    FAMILIES,
    ORACLE,
    ORACLE_CODE,
    STATE,
    STATE_CODES,
    WEDGE,
    WEDGE_CODES,
    code_class,
    meaning,
)

VERDICTS = Path(__file__).resolve().parents[1] / "docs" / "verdicts.md"
# How docs/verdicts.md names each family: `Corruption: ...`, `Wedge (per endpoint): ...`.
_PAGE_FAMILY = {
    "Corruption": CORRUPTION,
    "Availability": AVAILABILITY,
    "Wedge": WEDGE,
    "State": STATE,
    "Oracle": ORACLE,
}


def listed_codes() -> dict[str, list[str]]:
    """The codes docs/verdicts.md's "## Verdict codes" section lists, by family: each list runs from its
    family's name to the end of that sentence."""
    text = VERDICTS.read_text(encoding="utf-8")
    section = text.split("\n## Verdict codes\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[str]] = {}
    for label, body in re.findall(
        r"\b(Corruption|Availability|Wedge|State|Oracle)\b[^:.]*:(.*?)\.(?=\s|$)", section, flags=re.DOTALL
    ):
        out[_PAGE_FAMILY[label]] = re.findall(r"`([a-z][a-z_]*)`", body)
    return out


def test_verdicts_page_lists_exactly_the_tables_codes_per_family() -> None:
    listed = listed_codes()
    assert set(listed) == set(FAMILIES)
    for family in FAMILIES:
        assert sorted(listed[family]) == sorted(c.code for c in CODES if c.family == family), family


def test_every_code_has_a_checker_or_is_a_run_level_code() -> None:
    for c in CODES:
        if c.family == WEDGE:
            assert c.checker is None and c.code in WEDGE_CODES
        elif c.family == STATE:
            assert c.checker is None and c.code in STATE_CODES
        elif c.code == ORACLE_CODE:
            assert ORACLE_CHECKER.__name__ == f"check_{c.code}" and c.family == ORACLE
        else:
            assert CHECKERS[c.code].__name__ == f"check_{c.code}"
            assert c.checker == f"{CHECKERS[c.code].__module__.rsplit('.', 1)[-1]}.check_{c.code}"


def test_every_code_has_a_meaning_and_a_class() -> None:
    assert len({c.code for c in CODES}) == len(CODES)
    for c in CODES:
        assert c.meaning.strip() and meaning(c.code) == c.meaning
        assert code_class(c.code) == c.family
    assert code_class("no_such_code") == "unknown" and meaning("no_such_code")
