"""Training data for DSV4-mini: expert agent sessions rendered exactly as the server renders them.

Each session of a scenario family is played by the scripted expert against a fresh world
(the tool results come from the world, so arguments must be copied from context), turned into
an OpenAI transcript, and encoded by deepseek-recipe's DSV4 prompt encoding with our tokenizer:
the same path `engine serve` takes for a request. One session is one training sequence; the
loss covers what the model writes in each assistant turn: from after `<｜Assistant｜></think>`
up to and including `<｜end▁of▁sentence｜>`.

The corpus is a compressed .npz: `tokens` (uint16, all sessions back to back), `offsets`
(session starts, plus the end), `loss_mask` (uint8 per token), `meta` (JSON: seeds, families).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...agents import FAMILIES, ExpertSession, play_expert, session_messages
from ...agents.base import Step, ToolAction
from ..frontend import Frontend, RequestError
from ..tokenizer import DSV4Tokenizer, load_tokenizer
from .renames import rename_entities, rename_map


@dataclass(frozen=True)
class EncodedSession:
    family: str
    seed: int
    ids: list[int]
    mask: list[int]


def encode_session(
    frontend: Frontend, family: str, seed: int, perturb: bool = False, rename: bool = False
) -> EncodedSession:
    """Play, render and encode one expert session with its loss mask.

    With `perturb`, one to three turns of the session are mistakes (a wrong argument value, a
    missing or mistyped argument, a repeated list item, another family's tool: _slip) that
    carry no loss, and the expert recovers from each in the turns after: the model learns to
    recover from its own slips instead of collapsing. With `rename`, the world's names are
    consistently replaced by made-up ones (renames.py), so copying from context is the
    only way to get them right.
    """
    fam = FAMILIES[family]
    session, slipped = play_with_slips(family, seed) if perturb else (play_expert(fam, seed), set())
    messages = session_messages(session)
    if rename:
        messages = rename_entities(messages, rename_map(random.Random(seed * 13 + 5)))
    return encode_messages(frontend, family, seed, messages, slipped)


def encode_messages(
    frontend: Frontend, family: str, seed: int, messages: list[dict], skip_turns: set[int] | None = None
) -> EncodedSession:
    """Encode a finished transcript as the server would; the loss covers every assistant turn
    except those numbered in `skip_turns`."""
    body = {
        "model": frontend.model_name,
        "messages": messages,
        "tools": FAMILIES[family].openai_tools(),
        "chat_template_kwargs": {"thinking": False},
    }
    # The server's own path; it appends the next turn's `<｜Assistant｜></think>`, dropped here.
    ids = frontend.prepare_chat(body).prompt_ids[:-2]
    return EncodedSession(family, seed, ids, assistant_mask(ids, frontend.tokenizer, skip_turns=skip_turns))


def assistant_mask(ids: list[int], tok: DSV4Tokenizer, skip_turns: set[int] | None = None) -> list[int]:
    """1 on the tokens the model writes: after each `<｜Assistant｜></think>` through EOS,
    except in the assistant turns numbered in `skip_turns`."""
    assistant, think_end, eos = tok.special_id("Assistant"), tok.special_id("ThinkingEnd"), tok.eos_token_id
    skip = skip_turns or set()
    mask = [0] * len(ids)
    i, inside, turn = 0, False, -1
    while i < len(ids):
        if not inside and ids[i] == assistant and i + 1 < len(ids) and ids[i + 1] == think_end:
            inside, turn = True, turn + 1
            i += 2
            continue
        if inside:
            mask[i] = 0 if turn in skip else 1
            if ids[i] == eos:
                inside = False
        i += 1
    return mask


# Tools that only read the world: repeating one of their earlier calls changes nothing but the
# length of the session.
READ_ONLY = frozenset(
    {
        "list_dir",
        "read_file",
        "search_code",
        "list_tables",
        "describe_table",
        "run_query",
        "compute_aggregate",
        "list_services",
        "get_logs",
        "get_metrics",
    }
)


def play_with_slips(family: str, seed: int, max_turns: int = 16) -> tuple[ExpertSession, set[int]]:
    """The expert's session with one to three slipped turns (_slip) and up to three detours
    (an earlier read-only call made again, so the session runs longer than the expert's own, as
    a model's sessions do); returns the session and the indices of those turns,
    which carry no loss. A perturbed session the expert no longer solves falls back to the
    expert's own.

    Two kinds of slip are planted on purpose, because a model that makes them tends to loop:
    half the sessions whose expert writes a short list that must hold unique items get that
    call with an item repeated, once or twice in a row, before the expert's own; and a third of the
    slips are made again on the next turn, word for word, after the refusal. The model then
    learns that the turn after a refusal, even a second one, is the corrected call."""
    rng = random.Random(seed * 7 + 1)
    slip_at = set(rng.sample(range(1, 12), rng.choice((1, 1, 2, 3))))
    detour_at = set(rng.sample(range(2, 12), rng.choice((0, 1, 2, 3)))) - slip_at
    unique_slips = rng.choice((0, 0, 1, 2))
    perturbed: set[int] = set()
    earlier: list[ToolAction] = []
    again: list[ToolAction] = []  # a slip to be made once more on the next turn

    def alter(n: int, step: Step) -> Step:
        nonlocal unique_slips
        if step.is_final:
            return step
        if again:
            perturbed.add(n)
            return Step(calls=(again.pop(),))
        if unique_slips and _unique_lists(family, step.calls[0]):
            unique_slips -= 1
            perturbed.add(n)
            return Step(calls=(_slip(family, step.calls[0], rng, kind="repeated_item"),))
        if n in slip_at:
            perturbed.add(n)
            slipped = _slip(family, step.calls[0], rng)
            if rng.random() < 1 / 3:
                again.append(slipped)
            return Step(calls=(slipped,))
        reads = [c for c in earlier if c.name in READ_ONLY]
        if n in detour_at and reads:
            perturbed.add(n)
            return Step(calls=(rng.choice(reads),))
        earlier.extend(step.calls)
        return step

    fam = FAMILIES[family]
    session = play_expert(fam, seed, max_turns, alter)
    if not fam.solved(session.task, session.world):
        return play_expert(fam, seed), set()
    return session, perturbed


# A model repeats an item in a short list it assembles itself (the services an incident
# touched); a long list it copies (a table's columns) it copies whole. Slips follow suit.
_SHORT_LIST = 3


def _unique_lists(family: str, call: ToolAction) -> list[str]:
    """The call's short, non-empty list arguments whose schema wants unique items."""
    props = FAMILIES[family].tool_schemas().get(call.name, {}).get("properties", {})
    return [
        k
        for k, v in call.arguments.items()
        if isinstance(v, list) and 0 < len(v) <= _SHORT_LIST and props.get(k, {}).get("uniqueItems")
    ]


def _slip(family: str, call: ToolAction, rng: random.Random, kind: str | None = None) -> ToolAction:
    """A wrong version of the expert's call, of a kind the model makes: a wrong string value
    (the tool answers with an error), a required argument left out, a number written as a
    string, an item repeated in a list that must hold unique items, or a tool of another family
    (the harness refuses all but the first before any tool runs; agents/call_gate.py).
    `kind` picks one; by default it is drawn."""
    schema = FAMILIES[family].tool_schemas()[call.name]
    strings = [k for k, v in call.arguments.items() if isinstance(v, str) and v]
    required = [k for k in schema.get("required", []) if k in call.arguments]
    numbers = [k for k, v in call.arguments.items() if isinstance(v, int) and not isinstance(v, bool)]
    unique = _unique_lists(family, call)
    kinds = (
        (["value"] * 3 if strings else [])
        + (["missing"] if required else [])
        + (["as_string"] if numbers else [])
        + ["foreign"]
        + ["repeated_item"] * 4 * bool(unique)
    )
    kind = kind or rng.choice(kinds)
    if kind == "repeated_item":  # e.g. the same service twice where the schema wants unique items
        k = rng.choice(unique)
        items = list(call.arguments[k])
        if len(items) > 1 and rng.random() < 0.5:
            # The form a model writes when it misses one item (a dependency's root cause): the
            # item it did find written in its place, as [symptom, symptom] for [symptom, root].
            at = rng.randrange(len(items))
            items[at] = rng.choice(items[:at] + items[at + 1 :])
            return ToolAction(call.name, {**call.arguments, k: items})
        return ToolAction(call.name, {**call.arguments, k: [*items, rng.choice(items)]})
    if kind == "value":
        k = rng.choice(strings)
        v = call.arguments[k]
        wrong = rng.choice([v + "_old", v[: max(1, len(v) // 2)], "tmp/" + v, v.upper() + "2"])
        return ToolAction(call.name, {**call.arguments, k: wrong})
    if kind == "missing":
        k = rng.choice(required)
        return ToolAction(call.name, {a: v for a, v in call.arguments.items() if a != k})
    if kind == "as_string":
        k = rng.choice(numbers)
        return ToolAction(call.name, {**call.arguments, k: str(call.arguments[k])})
    others = sorted(t for f, fam in FAMILIES.items() if f != family for t in fam.tool_schemas())
    return ToolAction(rng.choice(others), dict(call.arguments))


def build_corpus(
    families: Iterable[str],
    seeds: Iterable[int],
    out: Path,
    frontend: Frontend | None = None,
    max_tokens: int | None = None,
    slip_share: float = 0.5,
    rename_share: float = 0.0,
) -> dict:
    """Encode every (family, seed) session and write the .npz corpus; returns its summary.
    `slip_share` of the sessions have slipped turns, `rename_share` have their world renamed."""
    frontend = frontend or Frontend(load_tokenizer())

    def sessions() -> Iterable[EncodedSession]:
        for seed in seeds:
            for fam in families:
                pick = random.Random(f"{fam}/{seed}")
                perturb, rename = pick.random() < slip_share, pick.random() < rename_share
                try:
                    yield encode_session(frontend, fam, seed, perturb=perturb, rename=rename)
                except RequestError:  # detours pushed it past the model's context: the expert's own
                    yield encode_session(frontend, fam, seed, rename=rename)

    return write_corpus(sessions(), out, max_tokens)


def write_corpus(sessions: Iterable[EncodedSession], out: Path, max_tokens: int | None = None) -> dict:
    """Write encoded sessions as an .npz corpus; returns its summary. Sessions longer than
    `max_tokens` keep their earlier turns whole and lose the later ones."""
    tokens: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    offsets = [0]
    meta = []
    for s in sessions:
        ids, mask = s.ids, s.mask
        if max_tokens is not None and len(ids) > max_tokens:
            ids, mask = ids[:max_tokens], mask[:max_tokens]
        tokens.append(np.asarray(ids, dtype=np.uint16))
        masks.append(np.asarray(mask, dtype=np.uint8))
        offsets.append(offsets[-1] + len(ids))
        meta.append([s.family, s.seed])
    if not meta:
        raise ValueError("no sessions to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        tokens=np.concatenate(tokens),
        loss_mask=np.concatenate(masks),
        offsets=np.asarray(offsets, dtype=np.int64),
        meta=np.asarray(json.dumps(meta)),
    )
    lengths = np.diff(offsets)
    return {
        "sessions": len(meta),
        "tokens": int(offsets[-1]),
        "loss_tokens": int(sum(m.sum() for m in masks)),
        "median_len": int(np.median(lengths)),
        "max_len": int(lengths.max()),
    }


def read_corpus(path: Path) -> list[EncodedSession]:
    """The sessions of an .npz corpus written by write_corpus."""
    with np.load(path) as z:
        tokens, mask, offsets = z["tokens"], z["loss_mask"], z["offsets"]
        meta = json.loads(str(z["meta"]))
    # Array slices, not lists: a corpus holds tens of millions of tokens.
    return [
        EncodedSession(fam, int(seed), tokens[a:b], mask[a:b])
        for (fam, seed), a, b in zip(meta, offsets[:-1], offsets[1:])
    ]
