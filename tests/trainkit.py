"""Shared helpers of the training tests: a tiny copy-task corpus and a config that trains on it in seconds."""

from __future__ import annotations

import random
from pathlib import Path

from transduce.config import Config

WORDS = ["red", "blue", "green", "cat", "dog", "bird", "runs", "sits", "eats", "big", "small", "the", "a"]


def write_corpus(directory: Path, *, n_train: int = 200, n_valid: int = 20, seed: int = 0) -> Path:
    """A copy task (target = source) in ``directory/{train,valid}.{en,de}``; returns ``directory``."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(n)]
        for lang in ("en", "de"):
            (directory / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def toy_config(corpus: Path, run_dir: Path, prepared: Path | None = None, **train: object) -> Config:
    """configs/toy.yaml pointed at ``corpus`` and ``run_dir``, with ``train`` overrides."""
    root = Path(__file__).resolve().parents[1]
    overrides = [f"data.train={corpus / 'train'}", f"data.valid={corpus / 'valid'}", f"train.run_dir={run_dir}"]
    if prepared is not None:
        overrides.append(f"data.prepared={prepared}")
    train = {"precision": "fp32", **train}  # exact comparisons; `auto` would pick bf16 on a CPU with bf16 units
    overrides += [f"train.{k}={v}" for k, v in train.items()]
    return Config.load(root / "configs" / "toy.yaml", overrides=overrides)
