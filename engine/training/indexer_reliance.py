"""How much do DSV4-mini's weights lean on the lightning indexer's picks, and on compressed
entries at all?

Teacher-forced greedy errors on held-out expert sessions (train.heldout_errors) with the CSA
layers attending the indexer's top-k (as served), a random top-k, no compressed entry at all,
and every eligible entry; and with HCA layers' compressed entries hidden ("no-hca"). A model
that loses nothing without them reads only its sliding window. If random picks cost about as
little as the indexer's, a fault that corrupts the picks (`hicache-index-race`: stale index
keys) cannot corrupt what the model writes either. Torch only, like trainer.py, so it runs on a bare GPU machine:

    python -m dsv4bench.engine.training.indexer_reliance --weights W --heldout heldout.npz
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .trainer import digit_token_ids, heldout_errors
from ..weights import WeightsError, load_weights, read_config

# CSA picks, and "no-hca": the indexer's picks with HCA layers' compressed entries hidden.
MODES = ("indexer", "random", "none", "all", "no-hca")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Held-out errors of DSV4-mini's weights with other CSA picks.")
    p.add_argument("--weights", type=Path, required=True)
    p.add_argument("--heldout", type=Path, required=True, help="Held-out corpus (corpus.build_corpus).")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default=",".join(MODES), help=f"Comma-separated, of {', '.join(MODES)}.")
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="The corpus's tokenizer.json: also report the share of written numbers with a wrong token.",
    )
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        p.error(f"unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
    try:
        digits = digit_token_ids(a.tokenizer) if a.tokenizer else []
    except (OSError, ValueError, KeyError, TypeError) as e:
        p.error(f"--tokenizer {a.tokenizer}: not a BPE tokenizer.json ({e})")
    torch.manual_seed(0)
    try:
        net = load_weights(read_config(a.weights), a.weights).to(a.device)
    except WeightsError as e:
        p.error(str(e))
    for mode in modes:
        pick, hca = ("indexer", False) if mode == "no-hca" else (mode, True)
        r = heldout_errors(net, a.heldout, torch.device(a.device), csa_pick=pick, hca=hca, digit_ids=digits)
        print(json.dumps({"weights": str(a.weights), "csa_pick": mode, **r}), flush=True)


if __name__ == "__main__":
    main()
