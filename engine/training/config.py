"""The training configs: `TrainConfig` (the trainer's run) and `CorpusConfig` (the corpus that
`dsv4bench engine train` builds when its file is missing). Plain dataclasses, no torch, so the
CLI reads its defaults from here."""

from __future__ import annotations

from dataclasses import dataclass

# Held-out evaluation seeds are below this; training seeds start here.
TRAIN_SEED_BASE = 100_000


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = 100_000
    minutes: float = 8.0  # wall-clock budget; the schedule is fitted to it
    batch_tokens: int = 32768  # padded tokens per step
    max_len: int = 8192  # longer sessions are cut (their later turns dropped)
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 50
    weight_decay: float = 0.05
    indexer_loss_weight: float = 0.5
    # Share of the steps (from the start) in which CSA layers attend every eligible compressed
    # entry, not the indexer's top-k: DSV4's dense warm-up. Attention learns where far tokens
    # are, the indexer is distilled from it, and the sparse steps after it lean on the picks.
    csa_dense_share: float = 0.0
    # Share of steps in which HCA layers read no compressed entry, so far context can only come
    # through CSA's picks: HCA's view of everything otherwise lets the model skip the indexer
    # (bench-plan.md measures how far it moves that).
    hca_drop: float = 0.0
    # Keep the (tied) token embedding as it is: training on from weights whose embedding already
    # fits the vocabulary. Rare tokens (most of the vocabulary's numbers, as ` 5479`) appear in
    # few batches, yet the softmax pushes their rows down on every step, and Adam scales those
    # small gradients up: a fine-tune on other sessions then loses the ability to write them
    # (`"value": un.92` for 5479.92; bench-plan.md).
    freeze_embeddings: bool = False
    bias_step: float = 1e-3
    seed: int = 0
    device: str = "cuda"
    log_every: int = 25


@dataclass(frozen=True)
class CorpusConfig:
    families: tuple[str, ...] = ("coding", "data", "ops")
    seeds: int = 1000  # training seeds per family
    first_seed: int = TRAIN_SEED_BASE
    slip_share: float = 0.6  # sessions with slipped turns the expert recovers from
    rename_share: float = 0.5  # sessions whose world names are replaced by made-up ones
