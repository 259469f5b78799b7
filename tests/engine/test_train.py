"""Training at a tiny size on CPU: corpus masks, a few steps that lower the loss, weights that
round-trip, and clear errors for missing or mismatched weights."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

from dsv4bench.engine.config import ModelConfig
from dsv4bench.engine.frontend import Frontend
from dsv4bench.engine.tokenizer import load_tokenizer
from dsv4bench.engine.training.trainer import TrainConfig, digit_token_ids, heldout_errors, train
from dsv4bench.engine.training.corpus import READ_ONLY, build_corpus, encode_session, play_with_slips
from dsv4bench.engine.training.renames import rename_entities, rename_map
from dsv4bench.engine.weights import WeightsError, load_weights

TINY = ModelConfig(
    d_model=32,
    n_layers=2,
    n_heads=2,
    head_dim=16,
    rope_dim=8,
    window=32,
    hca_rate=8,
    csa_rate=2,
    index_heads=2,
    index_dim=8,
    index_topk=4,
    n_experts=4,
    expert_dim=32,
    shared_expert_dim=32,
)


@pytest.fixture(scope="module")
def frontend():
    return Frontend(load_tokenizer())


def test_slips_are_refused_exactly_as_the_harness_refuses_them():
    """Slips of every kind occur over a few seeds, and each slipped call's result is the one a
    harness session sends back for that call: the model trains on the refusals it will read."""
    from dsv4bench.agents import FAMILIES
    from dsv4bench.harness.session import AgentSession, SessionConfig

    seen = set()
    for family in FAMILIES:
        for seed in range(100_000, 100_012):
            session, slipped = play_with_slips(family, seed)
            for n in slipped:
                call, result = session.steps[n].calls[0], session.results[n][0].result
                if not result.startswith("error"):
                    continue  # a detour
                seen |= {
                    k
                    for k, needle in (
                        ("foreign", "unknown tool"),
                        ("missing", "is a required property"),
                        ("invalid", "invalid arguments at $"),
                        ("world", "no such"),
                        ("repeated", "has non-unique elements"),
                    )
                    if needle in result
                }
                harness = AgentSession("s", FAMILIES[family], seed, SessionConfig(model="m"))
                _, refusal = harness.gate.check(call.name, json.dumps(call.arguments))
                if refusal is not None:  # else a wrong value the world itself refused
                    assert result == refusal
    assert seen == {"foreign", "missing", "invalid", "world", "repeated"}


def test_loss_mask_covers_exactly_what_the_model_writes(frontend):
    tok = frontend.tokenizer
    s = encode_session(frontend, "data", 3)
    spans, i = [], 0
    while i < len(s.mask):
        if s.mask[i]:
            j = i
            while j < len(s.mask) and s.mask[j]:
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    assert len(spans) >= 5
    for a, b in spans:
        assert s.ids[a - 2 : a] == [tok.special_id("Assistant"), tok.special_id("ThinkingEnd")]
        assert s.ids[b - 1] == tok.eos_token_id
    assert "DSML" in tok.decode(s.ids[spans[0][0] : spans[0][1]])


@pytest.mark.parametrize("family,seed", [("coding", 11), ("ops", 100_004), ("data", 100_002)])
def test_slipped_turns_carry_no_loss_and_the_expert_recovers(frontend, family, seed):
    session, slipped = play_with_slips(family, seed)
    assert any(session.results[n][0].result.startswith("error") for n in slipped)
    for n in slipped:  # a slip the tool refuses, or a detour: an earlier read-only call made again
        call = session.steps[n].calls[0]
        earlier = [c for step in session.steps[:n] for c in step.calls]
        assert session.results[n][0].result.startswith("error") or (call in earlier and call.name in READ_ONLY)
    assert session.family.solved(session.task, session.world)
    clean = encode_session(frontend, family, seed)
    slip = encode_session(frontend, family, seed, perturb=True)
    n_turns = lambda s: sum(1 for k in range(1, len(s.mask)) if s.mask[k] and not s.mask[k - 1])
    assert n_turns(slip) == len(session.steps) - len(slipped)  # every turn but the slipped ones is learned
    assert n_turns(clean) >= 5


def test_loop_prone_slips_are_planted_and_followed_by_the_corrected_call():
    """A list that must hold unique items gets an item repeated (added, or written in place of
    another), once or twice in a row, and some slips are made again word for word; after the last refusal comes the expert's call,
    which the world accepts."""
    runs, echoes, in_place = [], 0, 0
    for seed in range(100_000, 100_060):
        session, slipped = play_with_slips("ops", seed)
        for n in slipped:
            if n - 1 in slipped and session.steps[n].calls == session.steps[n - 1].calls:
                echoes += session.results[n][0].result.startswith("error")
        refused = [n for n in sorted(slipped) if "has non-unique elements" in session.results[n][0].result]
        if not refused:
            continue
        runs.append(max(len(list(g)) for _, g in itertools.groupby(enumerate(refused), key=lambda p: p[1] - p[0])))
        learned = next(n for n in range(refused[-1] + 1, len(session.steps)) if n not in slipped)
        after = session.steps[learned].calls[0]  # the first turn after the refusals that carries loss
        assert after.name == "open_incident"
        services = after.arguments["affected_services"]
        assert len(set(services)) == len(services)
        assert not session.results[learned][0].result.startswith("error")
        slipped_lists = [session.steps[n].calls[0].arguments["affected_services"] for n in refused]
        in_place += any(len(s) == len(services) > 1 for s in slipped_lists)  # [a, a] for [a, b]
    assert 1 in runs and 2 in runs  # one refusal, and two in a row
    assert echoes >= 1
    assert in_place >= 1


def test_renamed_sessions_stay_coherent_and_leave_tools_alone():
    from dsv4bench.agents import FAMILIES, play_expert, session_messages

    session = play_expert(FAMILIES["ops"], 100_007)
    messages = session_messages(session)
    mapping = rename_map(__import__("random").Random(1), share=1.0)
    renamed = rename_entities(messages, mapping)
    text = lambda ms: " ".join(str(m.get("content")) + str(m.get("tool_calls")) for m in ms[1:])
    before, after = text(messages), text(renamed)
    used = [old for old in mapping if f"| {old} |" in before]
    assert used, "the world's services appear in its tool results"
    for old in used:  # every occurrence moved, in results and in the calls that copy them
        assert f"| {old} |" not in after and f"| {mapping[old]} |" in after
    assert renamed[0] == messages[0]  # system prompt untouched
    assert [c["function"]["name"] for m in renamed for c in m.get("tool_calls") or []] == [
        c["function"]["name"] for m in messages for c in m.get("tool_calls") or []
    ]
    assert (
        rename_entities([{"role": "user", "content": "Northern North-east North_x"}], {"North": "Zel"})[0]["content"]
        == "Northern Zel-east Zel_x"
    )


def test_tiny_training_lowers_the_loss_and_weights_round_trip(tmp_path, frontend):
    corpus = tmp_path / "c.npz"
    info = build_corpus(["coding", "ops"], range(100_000, 100_002), corpus, frontend, max_tokens=1400)
    assert info["sessions"] == 4 and info["loss_tokens"] > 0
    out = tmp_path / "w.safetensors"
    r = train(
        TINY,
        TrainConfig(
            max_steps=12,
            minutes=5,
            batch_tokens=2800,
            max_len=1400,
            lr=1e-2,
            warmup=2,
            device="cpu",
            log_every=4,
            csa_dense_share=0.5,
        ),
        corpus,
        out,
        log=lambda m: None,
    )
    assert r.steps == 12 and r.losses[-1][1] < r.losses[0][1]
    model = load_weights(TINY, out)
    assert sum(p.numel() for p in model.parameters()) > 0
    with pytest.raises(WeightsError, match="do not match the model config: d_model"):
        load_weights(dataclasses.replace(TINY, d_model=64), out)
    with pytest.raises(WeightsError, match="engine train"):
        load_weights(TINY, tmp_path / "missing.safetensors")
    (tmp_path / "not.safetensors").write_text("# not weights\n")
    with pytest.raises(WeightsError, match="cannot read .* as safetensors"):
        load_weights(TINY, tmp_path / "not.safetensors")
    assert np.load(corpus)["tokens"].dtype == np.uint16
    errors = heldout_errors(model, corpus, __import__("torch").device("cpu"), max_len=1400)
    assert 0.0 < errors["token_error"] <= errors["turn_error"] <= 1.0 and errors["turns"] >= 4
    # Every id a "digit": each turn is one run of digit tokens, so numbers are the turns.
    every = heldout_errors(
        model, corpus, __import__("torch").device("cpu"), max_len=1400, digit_ids=range(TINY.vocab_size)
    )
    assert every["numbers"] == every["turns"] and every["number_error"] == every["turn_error"]


def test_dense_path_csa_picks():
    """The indexer's top-k, a random top-k, none and all eligible entries give four different
    outputs once a query has more eligible blocks than top-k."""
    import torch

    from dsv4bench.engine.model.model import DSV4Mini

    torch.manual_seed(0)
    model = DSV4Mini(TINY).eval()
    ids = torch.randint(0, TINY.vocab_size, (1, 200))  # 100 CSA blocks at rate 2 against top-4
    out = {}
    with torch.no_grad():
        for mode in ("indexer", "random", "none", "all"):
            model.set_csa_pick(mode)
            out[mode] = model.forward_dense(ids)[0, -1]
        model.set_csa_pick("indexer", hca=False)
        out["no-hca"] = model.forward_dense(ids)[0, -1]
    modes = list(out)
    assert all(not torch.allclose(out[a], out[b]) for i, a in enumerate(modes) for b in modes[i + 1 :])
    with pytest.raises(AssertionError):
        model.set_csa_pick("bogus")


def test_shipped_weights_load_with_the_default_config():
    model = load_weights(ModelConfig())
    assert sum(p.numel() for p in model.parameters()) == 9_884_688


def test_training_on_to_a_coarser_hca_rate_stretches_the_slot_bias(tmp_path):
    import torch

    from dsv4bench.engine.model import DSV4Mini
    from dsv4bench.engine.model.compressor import Compressor
    from dsv4bench.engine.training.trainer import _initial_model
    from dsv4bench.engine.weights import save_weights

    def compressors(m, rate):
        return [c for c in m.modules() if isinstance(c, Compressor) and c.rate == rate]

    torch.manual_seed(0)
    model = DSV4Mini(TINY)
    hca = compressors(model, TINY.hca_rate)[0]
    with torch.no_grad():
        hca.slot_bias.copy_(torch.arange(TINY.hca_rate).float().unsqueeze(1).expand_as(hca.slot_bias))
    path = tmp_path / "w.safetensors"
    save_weights(model, path, dtype=torch.float32)
    coarse = _initial_model(dataclasses.replace(TINY, hca_rate=16), path)
    stretched = compressors(coarse, 16)[0]
    assert stretched.slot_bias[:, 0].tolist() == [i // 2 for i in range(16)]  # slot i takes old slot i // 2
    csa_before = [c.slot_bias for c in compressors(model, TINY.csa_rate)]
    csa_after = [c.slot_bias for c in compressors(coarse, TINY.csa_rate)]
    assert all(torch.equal(a, b) for a, b in zip(csa_before, csa_after)) and csa_before
    with pytest.raises(WeightsError):  # a rate the old one does not divide is refused
        _initial_model(dataclasses.replace(TINY, hca_rate=12, window=36), path)


def test_training_on_with_frozen_embeddings_leaves_the_embedding_alone(tmp_path, frontend):
    """--freeze-embeddings: the token embedding (tied to the output) comes out exactly as --init
    had it while the rest of the model trains; without --init it is refused."""
    import torch

    from dsv4bench.engine.model import DSV4Mini
    from dsv4bench.engine.weights import save_weights

    corpus = tmp_path / "c.npz"
    build_corpus(["ops"], range(100_000, 100_002), corpus, frontend, max_tokens=1400)
    torch.manual_seed(0)
    init = tmp_path / "init.safetensors"
    save_weights(DSV4Mini(TINY), init, dtype=torch.float32)
    cfg = TrainConfig(
        max_steps=4, minutes=5, batch_tokens=2800, max_len=1400, lr=1e-2, warmup=1, device="cpu", freeze_embeddings=True
    )
    out = tmp_path / "w.safetensors"
    train(TINY, cfg, corpus, out, log=lambda m: None, init=init)
    before, after = load_weights(TINY, init).state_dict(), load_weights(TINY, out).state_dict()
    as_saved = lambda t: t.to(torch.bfloat16).float()  # train writes bf16
    assert torch.equal(as_saved(before["embed.weight"]), as_saved(after["embed.weight"]))
    assert any(not torch.equal(as_saved(before[k]), as_saved(after[k])) for k in before if k != "embed.weight")
    with pytest.raises(ValueError, match="--init"):
        train(TINY, cfg, corpus, out, log=lambda m: None)


def test_heldout_errors_count_turns_and_numbers_exactly(tmp_path):
    """One session, two written turns ([3 4 5] and [7 8]); the model misses only token 4.
    Digit tokens {4, 5, 8} make two numbers ([4 5] and [8]), one of them wrong."""
    import torch

    from dsv4bench.engine.tokenizer import DEFAULT_PATH

    ids = np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=np.uint16)
    mask = np.array([0, 0, 1, 1, 1, 0, 1, 1], dtype=np.uint8)
    corpus = tmp_path / "h.npz"
    np.savez(corpus, tokens=ids, loss_mask=mask, offsets=np.array([0, len(ids)]), meta=np.asarray("[]"))

    class EchoNextToken:  # predicts each next token, except that it writes 9 for 4
        def eval(self):
            return self

        def train(self):
            return self

        def set_csa_pick(self, *a):
            pass

        def logits(self, h):
            return h

        def hidden_dense(self, x, _):
            nxt = torch.cat([x[0, 1:], x[0, :1]])
            return torch.nn.functional.one_hot(torch.where(nxt == 4, 9, nxt), 10).float().unsqueeze(0), None

    r = heldout_errors(EchoNextToken(), corpus, torch.device("cpu"), digit_ids={4, 5, 8})
    assert (r["turns"], r["turn_error"], r["tokens"], r["token_error"]) == (2, 0.5, 5, 0.2)
    assert (r["numbers"], r["number_error"]) == (2, 0.5)
    assert "numbers" not in heldout_errors(EchoNextToken(), corpus, torch.device("cpu"))
    assert len(digit_token_ids(DEFAULT_PATH)) > 4000  # the shipped vocabulary's whole numbers
