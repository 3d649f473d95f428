"""Masked-language-model pretraining (``data.task: mlm``): transduce's encoder trained on raw text with BERT's
objective (Devlin et al., 2019), to be fine-tuned as a classifier afterwards (``train.init_from``, docs/transfer.md).

- :mod:`transduce.transfer.mlm.masking`: which pieces are chosen and how they are replaced (15%; 80/10/10);
- :mod:`transduce.transfer.mlm.data`: raw text corpora, their preparation, the masking per epoch, batches;
- :mod:`transduce.transfer.mlm.model`: :class:`MaskedLM` (the encoder, a learned mask vector, BERT's prediction head);
- :mod:`transduce.transfer.mlm.training`: the loss and the validation (masked-LM loss and accuracy) the training loop
  calls.

Loading a trained masked language model::

    model, config, vocab_dir = load_masked_lm("runs/multi30k_en_mlm")
    states = model.encode(src).states  # (B, S, d_model): the encoder, without a mask
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from transduce.config import Config
from transduce.errors import CheckpointError
from transduce.training import checkpoint as ckpt
from transduce.transfer.mlm.model import MaskedLM

log = logging.getLogger(__name__)


def is_masked_lm(path: str | Path) -> bool:
    """Whether ``path`` (a run directory or checkpoint) holds a masked language model (``data.task: mlm``)."""
    try:
        return ckpt.read_info(ckpt.resolve(path)).config.data.task == "mlm"
    except CheckpointError:
        return False


def load_masked_lm(path: str | Path, device: str | torch.device = "cpu", *, checksums: bool = True
                   ) -> tuple[MaskedLM, Config, Path]:  # fmt: skip
    """A trained masked language model from a run directory (its best checkpoint, else the last) or a checkpoint.

    Returns:
        ``(model, config, vocab_dir)`` as :func:`transduce.training.checkpoint.load_model` returns a translation
        model's: the model in eval mode, the config it was trained with, its vocabulary directory.

    Raises:
        CheckpointError: a missing or corrupt file, a vocabulary that does not match, or a model that is not a
            masked language model.
    """
    checkpoint = ckpt.resolve(path)
    ckpt.verify(checkpoint, checksums=checksums)
    info = ckpt.read_info(checkpoint)
    if info.config.data.task != "mlm":
        raise CheckpointError(f"{path} is not a masked language model (data.task: {info.config.data.task})")
    vocab_dir = ckpt.vocab_dir_of(checkpoint)
    ckpt.check_vocab(info, vocab_dir)
    model = MaskedLM(info.config.model)
    ckpt.load_weights(model, checkpoint)
    model.to(device).eval()
    log.info("loaded the masked language model %s (step %d, %s parameters)", checkpoint, info.step,
             f"{model.num_parameters():,}")  # fmt: skip
    return model, info.config, vocab_dir


__all__ = ["MaskedLM", "is_masked_lm", "load_masked_lm"]
