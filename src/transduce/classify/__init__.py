"""Sentence classification (``data.task: classify``): transduce's encoder with a classification head, trained from
scratch or started from a translation model's encoder (docs/transfer.md).

- :mod:`transduce.classify.data`: labelled TSV / JSON Lines corpora, their preparation, batches;
- :mod:`transduce.classify.model`: :class:`Classifier` (encoder, ``<cls>``/mean/max pooling, head; CoVe's task model);
- :mod:`transduce.classify.transfer`: what a classifier takes from a translation model, freezing, learning rates;
- :mod:`transduce.classify.training`: the loss and the validation (accuracy) the training loop calls.

Loading a trained classifier::

    loaded = load_classifier("runs/movie_reviews_finetune")
    loaded.labels                                  # ['negative', 'positive']
    loaded.predict(["a gripping , funny film ."])  # ['positive']
    loaded.probabilities(texts)                    # (N, classes) tensor
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from transduce import checkpoint as ckpt
from transduce.classify.data import collate_classes, encode_texts
from transduce.classify.model import Classifier
from transduce.config import Config
from transduce.errors import CheckpointError
from transduce.tokenizer import Vocabulary
from transduce.vocab import load_vocabulary

log = logging.getLogger(__name__)


@dataclass
class LoadedClassifier:
    """A trained classifier with what it needs to read text.

    Attributes:
        model: the :class:`Classifier`, in eval mode.
        tokenizer: its vocabulary (the texts are encoded with the source side).
        labels: the class names; logit ``i`` is ``labels[i]``.
        config: the resolved config it was trained with (``data.max_len`` truncates texts as prepare did).
        device: where the model is.
    """

    model: Classifier
    tokenizer: Vocabulary
    labels: list[str]
    config: Config
    device: torch.device

    @torch.inference_mode()
    def logits(self, texts: Sequence[str], texts2: Sequence[str] | None = None, *, batch_size: int = 64
               ) -> torch.Tensor:  # fmt: skip
        """Class scores of each text (or ``(text, text2)`` pair), in input order: ``(N, classes)`` float32 on the CPU.

        Texts are encoded as ``transduce prepare`` encoded the training data (truncated to ``data.max_len`` pieces)
        and run in batches of ``batch_size``; a text's scores do not depend on its batch.
        """
        if isinstance(texts, str):
            raise TypeError("texts: a sequence of strings, not one string")
        if texts2 is not None and len(texts2) != len(texts):
            raise ValueError(f"texts2: {len(texts2)} second texts for {len(texts)} texts")
        c = self.config.model
        ids = encode_texts(self.tokenizer, texts, texts2, self.config.data.max_len, c.eos_id)
        out = [torch.zeros(0, len(self.labels))]
        for start in range(0, len(ids), batch_size):
            batch = collate_classes([(s, [0]) for s in ids[start : start + batch_size]], c.pad_id, c.eos_id)
            out.append(self.model(batch.src.to(self.device)).float().cpu())
        return torch.cat(out)

    def probabilities(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> torch.Tensor:
        """The softmax of :meth:`logits`: ``(N, classes)``."""
        return self.logits(texts, texts2).softmax(dim=-1)

    def predict(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> list[str]:
        """The most probable label of each text."""
        return [self.labels[int(i)] for i in self.logits(texts, texts2).argmax(dim=-1)]


def is_classifier(path: str | Path) -> bool:
    """Whether ``path`` (a run directory or checkpoint) holds a classifier (``data.task: classify``)."""
    try:
        return ckpt.read_info(ckpt.resolve(path)).config.data.task == "classify"
    except CheckpointError:
        return False


def load_classifier(path: str | Path, device: str | torch.device = "cpu", *, checksums: bool = True
                    ) -> LoadedClassifier:  # fmt: skip
    """A trained classifier from a run directory (its best checkpoint, else the last) or a checkpoint directory.

    Raises:
        CheckpointError: a missing or corrupt file, a vocabulary that does not match, or a model that is not a
            classifier.
    """
    checkpoint = ckpt.resolve(path)
    ckpt.verify(checkpoint, checksums=checksums)
    info = ckpt.read_info(checkpoint)
    if info.config.data.task != "classify":
        raise CheckpointError(f"{path} is not a classifier (data.task: {info.config.data.task})")
    vocab_dir = ckpt.vocab_dir_of(checkpoint)
    ckpt.check_vocab(info, vocab_dir)
    model = Classifier(info.config.model)
    ckpt.load_weights(model, checkpoint)
    device = torch.device(device)
    model.to(device).eval()
    log.info("loaded the classifier %s (step %d, labels %s)", checkpoint, info.step, ", ".join(model.config.labels))
    return LoadedClassifier(model, load_vocabulary(vocab_dir), list(model.config.labels), info.config, device)


__all__ = ["Classifier", "LoadedClassifier", "is_classifier", "load_classifier"]
