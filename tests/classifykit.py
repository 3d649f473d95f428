"""Shared helpers of the tests that use a classifier: a random one saved as a checkpoint in a moment."""

from __future__ import annotations

from pathlib import Path

import torch

from transduce.config import Config, DataConfig, ModelConfig
from transduce.text.vocab import load_vocabulary
from transduce.training.checkpoint import save_model
from transduce.transfer.classify import ClassifierModel


def make_classifier_checkpoint(
    directory: Path, vocab_dir: Path, *, labels: tuple[str, ...] = ("neg", "pos"), text2_field: str = "",
    seed: int = 0,
) -> Path:  # fmt: skip
    """A standalone checkpoint of a random ``test``-preset classifier over the vocabulary in ``vocab_dir`` (a
    checkpoint's ``vocab``); ``text2_field``: a classifier of sentence pairs. Returns ``directory``."""
    vocab = load_vocabulary(vocab_dir)
    model = ModelConfig.preset("test", src_vocab_size=vocab.src_vocab_size, tgt_vocab_size=vocab.tgt_vocab_size,
                               labels=list(labels))  # fmt: skip
    torch.manual_seed(seed)
    config = Config(model=model, data=DataConfig(task="classify", text2_field=text2_field))
    return save_model(directory, ClassifierModel(model).eval(), config, vocab_dir)
