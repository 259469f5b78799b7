"""Training DSV4-mini on the expert-session corpus (corpus.py).

Torch only (no deepseek-recipe, no harness): it runs on a bare GPU machine with the corpus
file beside it. One step = a batch of whole sessions (length-bucketed, right-padded), loss =
cross-entropy on the tokens the model writes in its assistant turns + the lightning indexer's
distillation loss; MoE selection biases follow DeepSeek's aux-loss-free balancing rule.
A time budget bounds the run: the LR schedule is fitted to the steps that fit in it.

    dsv4bench engine train --corpus corpus.npz --out dsv4-mini.safetensors --minutes 8
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..model.model import DSV4Mini
from ..weights import load_weights, read_config, save_weights
from .config import TrainConfig


@dataclass
class TrainResult:
    steps: int
    final_loss: float  # mean LM loss over the last log window
    wall_s: float
    tokens_seen: int
    loss_tokens_seen: int
    sessions: int
    losses: list[tuple[int, float]]


class CorpusError(ValueError):
    """The corpus file is missing or is not one build_corpus wrote."""


def load_corpus(path: Path, max_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    try:
        d = np.load(path)
        tokens, mask, offsets = d["tokens"], d["loss_mask"], d["offsets"]
    except (OSError, ValueError, EOFError, KeyError, TypeError) as e:
        raise CorpusError(f"{path} is not a training corpus (build_corpus writes one): {e}") from None
    return [(tokens[a:b][:max_len].astype(np.int64), mask[a:b][:max_len]) for a, b in zip(offsets[:-1], offsets[1:])]


def make_batches(
    corpus: list[tuple[np.ndarray, np.ndarray]], batch_tokens: int, rng: np.random.Generator
) -> list[list[int]]:
    """Sessions grouped by length so padding stays small; each group's padded size <= batch_tokens."""
    order = sorted(range(len(corpus)), key=lambda i: len(corpus[i][0]))
    batches, cur = [], []
    for i in order:
        longest = max(len(corpus[j][0]) for j in cur + [i])
        if cur and longest * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(corpus, idx: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(corpus[i][0]) for i in idx)
    ids = torch.zeros(len(idx), T, dtype=torch.long)
    mask = torch.zeros(len(idx), T, dtype=torch.bool)
    for r, i in enumerate(idx):
        t, m = corpus[i]
        ids[r, : len(t)] = torch.from_numpy(t)
        mask[r, : len(m)] = torch.from_numpy(m.astype(bool))
    return ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)


def loss_on_written_tokens(
    model: DSV4Mini, ids: torch.Tensor, mask: torch.Tensor, index_k_dtype: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(LM loss on the assistant-written tokens, indexer loss). Logits only where a loss is
    taken: the lm_head over every position of 8k-token sessions would dominate memory."""
    x, aux = model.hidden_dense(ids, index_k_dtype, want_aux=True)
    target_mask = mask[:, 1:]  # position t predicts token t+1
    h = x[:, :-1][target_mask]
    logits = model.logits(h).float()
    lm = F.cross_entropy(logits, ids[:, 1:][target_mask])
    return lm, (aux if aux is not None else lm * 0.0)


def train(
    model_cfg: ModelConfig, cfg: TrainConfig, corpus_path: Path, out: Path, log=print, init: Path | None = None
) -> TrainResult:
    """Train (from scratch, or on from the weights at `init`) and write the weights to `out`."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    device = torch.device(cfg.device)
    corpus = load_corpus(corpus_path, cfg.max_len)
    model = _initial_model(model_cfg, init).to(device)
    model.train()
    if cfg.freeze_embeddings:
        if init is None:
            raise ValueError("freezing the embeddings needs --init weights to train on from")
        for m in (model.embed, model.lm_head):
            if m is not None:
                m.weight.requires_grad_(False)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trained if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in trained if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    )
    start = time.monotonic()
    budget_s = cfg.minutes * 60
    total_steps = cfg.max_steps
    step, tokens_seen, loss_tokens, window = 0, 0, 0, []
    paced_from = start
    losses: list[tuple[int, float]] = []
    batches: list[list[int]] = []
    while step < total_steps:
        if not batches:
            batches = make_batches(corpus, cfg.batch_tokens, rng)
        idx = batches.pop()
        ids, mask = collate(corpus, idx, device)
        lr = cfg.lr * _schedule(step, cfg.warmup, total_steps, cfg.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        model.set_csa_pick(
            "all" if step < cfg.csa_dense_share * total_steps else "indexer",
            hca=not (cfg.hca_drop and rng.random() < cfg.hca_drop),
        )
        with autocast:
            lm, idx_loss = loss_on_written_tokens(model, ids, mask, "fp8")
            loss = lm + cfg.indexer_loss_weight * idx_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for block in model.blocks:
            if not block.moe.hashed and hasattr(block.moe, "last_counts"):
                block.moe.update_selection_bias(block.moe.last_counts, cfg.bias_step)
        step += 1
        tokens_seen += ids.numel()
        loss_tokens += int(mask[:, 1:].sum())
        window.append(float(lm.detach()))
        if step == 5:
            paced_from = time.monotonic()
        if step == 25 and cfg.max_steps > 25:
            # Fit the schedule to the time budget from the pace of steps 6-25 (the first steps
            # carry one-time CUDA and allocator warm-up and would make the fit too short).
            per_step = (time.monotonic() - paced_from) / 20
            left = budget_s - (time.monotonic() - start)
            total_steps = max(step + 1, min(cfg.max_steps, step + int(left / per_step)))
            log(f"step time {per_step * 1e3:.0f} ms -> {total_steps} steps in {cfg.minutes:g} min")
        if step % cfg.log_every == 0 or step == total_steps:
            mean = sum(window) / len(window)
            losses.append((step, mean))
            log(
                f"step {step}/{total_steps} lm {mean:.4f} idx {float(idx_loss.detach()):.4f} lr {lr:.2e} "
                f"tokens {tokens_seen / 1e6:.1f}M elapsed {time.monotonic() - start:.0f}s"
            )
            window = []
        if time.monotonic() - start > budget_s * 1.05:
            log("time budget reached")
            break
    wall = time.monotonic() - start
    result = TrainResult(
        step, losses[-1][1] if losses else float("nan"), wall, tokens_seen, loss_tokens, len(corpus), losses
    )
    model.eval()
    save_weights(
        model,
        out,
        info={
            "train_config": dataclasses.asdict(cfg),
            "steps": step,
            "final_loss": result.final_loss,
            "wall_s": wall,
            "tokens_seen": tokens_seen,
            "sessions": len(corpus),
        },
    )
    return result


@torch.no_grad()
def heldout_errors(
    model: DSV4Mini,
    corpus_path: Path,
    device: torch.device,
    max_len: int = 16384,
    csa_pick: str = "indexer",
    hca: bool = True,
    digit_ids: Collection[int] = (),
) -> dict:
    """Teacher-forced greedy errors on held-out sessions: the share of assistant-written tokens
    whose argmax is not the expert's token, and the share of assistant turns with any such
    token. A turn with none is one the model would write exactly as the expert did. `csa_pick`
    swaps the indexer's picks for others (Attention.csa_pick), `hca=False` hides HCA layers'
    compressed entries: to measure how much the model leans on them.

    With `digit_ids` (the ids of tokens holding a digit) it also gives `number_error`: the share
    of written numbers (runs of adjacent digit tokens) with any token wrong. Counted per number,
    it compares tokenizers that cut numbers differently."""
    model.eval()
    model.set_csa_pick(csa_pick, hca)
    wrong = total = turns = bad_turns = numbers = bad_numbers = 0
    digits = torch.tensor(sorted(digit_ids), dtype=torch.long, device=device)
    for ids_np, mask_np in load_corpus(corpus_path, max_len):
        ids = torch.from_numpy(ids_np).to(device)
        mask = torch.from_numpy(mask_np.astype(bool)).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            x, _ = model.hidden_dense(ids.unsqueeze(0), "fp8")
        target = mask[1:]
        pred = model.logits(x[0, :-1][target]).argmax(-1)
        miss = pred != ids[1:][target]
        wrong, total = wrong + int(miss.sum()), total + int(target.sum())
        # Turns are runs of adjacent written positions; numbers, runs of adjacent digit tokens.
        where = target.nonzero().squeeze(1)
        n, bad = _runs_with_a_miss(torch.ones_like(miss), where, miss)
        turns, bad_turns = turns + n, bad_turns + bad
        if digits.numel():
            n, bad = _runs_with_a_miss(torch.isin(ids[1:][target], digits), where, miss)
            numbers, bad_numbers = numbers + n, bad_numbers + bad
    model.set_csa_pick("indexer")
    model.train()
    out = {
        "token_error": wrong / max(1, total),
        "turn_error": bad_turns / max(1, turns),
        "tokens": total,
        "turns": turns,
    }
    if digits.numel():
        out |= {"number_error": bad_numbers / max(1, numbers), "numbers": numbers}
    return out


def _runs_with_a_miss(member: torch.Tensor, where: torch.Tensor, miss: torch.Tensor) -> tuple[int, int]:
    """Over the written tokens (at sequence positions `where`): the runs of tokens that are
    `member` and adjacent in the sequence, and how many of those runs hold a `miss`."""
    starts = member.clone()
    starts[1:] &= ~(member[:-1] & (where[1:] == where[:-1] + 1))
    run_of = (starts.cumsum(0) - 1)[member]
    return int(starts.sum()), int(run_of[miss[member]].unique().numel())


def digit_token_ids(tokenizer_json: Path) -> list[int]:
    """Ids of the tokens that hold a digit, read from a tokenizer.json (byte-level: digits are
    spelled as themselves), so that GPU-side tools need no tokenizer library."""
    vocab = json.loads(tokenizer_json.read_text())["model"]["vocab"]
    return sorted(i for t, i in vocab.items() if any(c in "0123456789" for c in t))


def _initial_model(model_cfg: ModelConfig, init: Path | None) -> DSV4Mini:
    """A fresh model, or the weights at `init`. Weights of another sliding window are accepted:
    the window is a span, not a weight, so training on widens or narrows what the model uses.
    So are weights of an HCA rate that divides the new one: each HCA compressor's per-slot bias
    is stretched over the longer block (slot i of the new block takes the bias of the old slot
    at the same relative place), and training on learns the coarser compression."""
    if init is None:
        return DSV4Mini(model_cfg)
    file_cfg = read_config(init)
    stretch = model_cfg.hca_rate // file_cfg.hca_rate if model_cfg.hca_rate % file_cfg.hca_rate == 0 else 0
    if not stretch or dataclasses.replace(file_cfg, window=model_cfg.window, hca_rate=model_cfg.hca_rate) != model_cfg:
        return load_weights(model_cfg, init)  # refused with the config difference spelled out
    state = load_weights(file_cfg, init).state_dict()
    if stretch > 1:
        for layer in (n for n in range(model_cfg.n_layers) if not model_cfg.is_csa(n)):
            name = f"blocks.{layer}.attn.compressor.slot_bias"
            state[name] = state[name].repeat_interleave(stretch, dim=0)
    model = DSV4Mini(model_cfg)
    model.load_state_dict(state)
    return model


def _schedule(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
