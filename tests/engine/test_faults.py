"""The planted faults' names: Fault members inside the engine, the CLI's strings outside."""

from __future__ import annotations

import json

import pytest

from dsv4bench.engine.config import EngineConfig
from dsv4bench.engine.faults import FAULTS, Fault, FaultError, parse_faults


def test_every_fault_has_its_description_and_the_names_are_the_flag_values():
    assert list(FAULTS) == [f.value for f in Fault]
    assert all(FAULTS[f].fault is f and FAULTS[f].name == f.value for f in Fault)


def test_engine_config_takes_the_cli_strings_and_holds_members():
    cfg = EngineConfig(pd=True, faults=frozenset({"abort-leak", "ghost-decode"}))
    assert cfg.faults == {Fault.ABORT_LEAK, Fault.GHOST_DECODE}
    assert all(isinstance(f, Fault) for f in cfg.faults)
    assert Fault.HEALTH_LIES not in cfg.faults
    assert json.dumps(sorted(cfg.faults)) == '["abort-leak", "ghost-decode"]'
    assert f"{Fault.GHOST_DECODE}" == "ghost-decode"


def test_unknown_names_are_refused_in_one_line():
    with pytest.raises(FaultError, match="unknown fault 'nope'; faults: hicache-index-race, "):
        parse_faults(["ghost-decode", "nope"])
    with pytest.raises(ValueError, match="unknown fault 'nope'"):
        EngineConfig(faults=frozenset({"nope"}))
    assert parse_faults([" health-lies ", Fault.PARSER_SPLIT]) == {Fault.HEALTH_LIES, Fault.PARSER_SPLIT}


def test_a_fault_that_needs_a_mode_says_which():
    with pytest.raises(ValueError, match="fault abort-leak needs PD mode"):
        EngineConfig(faults=frozenset({"abort-leak"}))
