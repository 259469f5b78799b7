"""persistence.py's pure parts: which sessions are replayed, how deep, and when fresh sessions
that corrupt mean poisoned state, and when they only show a rate the run had from its start."""

from __future__ import annotations

from dsv4bench.harness.persistence import CLEAN, CORRUPT, ERROR, FreshSession, judge


def _fresh(outcome: str, turns: int = 4, corrupt: int = 0) -> FreshSession:
    return FreshSession("persist0-s1", "s1", "coding", 1, turns=turns, corrupt_turns=corrupt, outcome=outcome)


def test_most_fresh_sessions_corrupt_on_a_server_clean_at_the_start_is_poisoned():
    poisoned, why = judge([_fresh(CORRUPT, 4, 3), _fresh(CORRUPT, 4, 2), _fresh(CLEAN)], before=0.0)
    assert poisoned is True and "2 of 3" in why


def test_a_server_that_corrupted_at_that_rate_from_the_start_is_not_poisoned():
    # One fresh turn in four corrupt, as a quarter of the first third's turns were.
    poisoned, why = judge([_fresh(CORRUPT, 4, 1), _fresh(CORRUPT, 4, 1), _fresh(CLEAN)], before=0.25)
    assert poisoned is False and "from the start" in why
    # The same sessions on a server whose start was nearly clean: poisoned.
    assert judge([_fresh(CORRUPT, 4, 1), _fresh(CORRUPT, 4, 1), _fresh(CLEAN)], before=0.02)[0] is True


def test_half_or_fewer_corrupt_is_not_poisoned_and_nothing_judged_is_unknown():
    assert judge([_fresh(CORRUPT, 4, 4), _fresh(CLEAN)], before=0.0)[0] is False
    assert judge([_fresh(ERROR), _fresh("cut")])[0] is None
