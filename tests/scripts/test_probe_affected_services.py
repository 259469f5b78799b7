"""The affected-services probe: it finds the second list item's first token, and the shipped
weights write the root there on the ops task they loop on in the closed loop (seed 4)."""

from __future__ import annotations


import pytest

from tests.scripts.script_loader import load_script

probe = load_script("probe_affected_services")


def test_the_position_is_the_second_items_first_token():
    from dsv4bench.engine.tokenizer import load_tokenizer

    tok = load_tokenizer()
    ids = tok.encode('x ["auth", "notifications"] y ["recommendations", "catalog"]')
    p = probe.second_item_position(tok, ids, "recommendations")
    assert tok.decode(ids[:p]).endswith('["recommendations", "') and tok.decode(ids[p:]).startswith("catalog")
    assert probe.second_item_position(tok, ids, "search") is None


def test_the_shipped_weights_write_the_root_in_the_experts_context():
    from dsv4bench.engine.config import ModelConfig
    from dsv4bench.engine.frontend import Frontend
    from dsv4bench.engine.tokenizer import load_tokenizer
    from dsv4bench.engine.weights import load_weights

    assert probe.dependency_seeds(2) == [4, 5]
    r = probe.probe(load_weights(ModelConfig()).eval(), Frontend(load_tokenizer()), 4)
    assert (r["symptom"], r["root"], r["expert"]) == ("recommendations", "catalog", "catalog")
    assert r["right"] and r["p_expert"] > 0.5


def test_bad_arguments_get_one_line(capsys):
    for args in (["--sessions", "0"], ["--weights", "README.md"]):
        with pytest.raises(SystemExit):
            probe.main(args)
    assert "cannot read README.md" in capsys.readouterr().err
