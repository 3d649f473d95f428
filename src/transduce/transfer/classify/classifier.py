"""Classifying text with a trained classifier: its model, its vocabulary and its labels, batched and order-preserving.

    classifier = Classifier.load("runs/movie_reviews_finetune")  # a run directory or a checkpoint
    classifier.labels                                            # ['negative', 'positive']
    classifier.predict(["A gripping, funny film."])              # ['positive']
    classifier.classify(["A gripping, funny film."])             # [Classification('positive', {...: 0.03, ...})]
    classifier.probabilities(texts)                              # (N, classes) tensor, columns in label order
    classifier.predict(premises, hypotheses)                     # a classifier trained on sentence pairs

Texts are encoded as ``transduce prepare`` encoded the training data (truncated to ``data.max_len`` pieces, a pair
longest-first; with learned positions to at most ``model.max_positions - 1``), sorted by length and run in batches
of ``batch_size``; the results come back in input order, one per text. A text's scores do not depend on the other
texts of its batch (up to float rounding). An empty (or blank) text has no label: it is refused, as ``transduce
classify`` refuses it. The texts are a sequence (a list, a tuple): a generator is refused, as ``Translator`` refuses
it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transduce.config import Config
from transduce.device import resolve_device
from transduce.errors import CheckpointError
from transduce.text.tokenizer import Vocabulary
from transduce.text.vocab import load_vocabulary
from transduce.training import checkpoint as ckpt
from transduce.transfer.classify.data import collate_classes, encode_texts
from transduce.transfer.classify.model import ClassifierModel

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 64  # texts per forward pass


@dataclass(frozen=True)
class Classification:
    """The class of one text.

    Attributes:
        label: the most probable label.
        probabilities: every label's probability, in the classifier's label order (they sum to 1).
    """

    label: str
    probabilities: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """``{"label": ..., "probabilities": {label: p, ...}}``: the shape ``classify --json`` and ``/classify``
        write."""
        return {"label": self.label, "probabilities": dict(self.probabilities)}


class Classifier:
    """A trained classifier with what it needs to read text.

    Args:
        model: the :class:`~transduce.transfer.classify.model.ClassifierModel`; it is moved to ``device`` and put in
        eval
            mode.
        tokenizer: its vocabulary (texts are encoded with the source side).
        config: the resolved config it was trained with: ``model.labels`` names the classes, ``data.max_len``
            truncates texts as prepare did, ``data.text2_field`` says whether it reads sentence pairs.
        device: ``cpu`` (the default), ``auto`` (a GPU when there is one), ``cuda``, ``cuda:N``, ``mps`` or a
            ``torch.device``.
        batch_size: texts per forward pass.

    Attributes:
        labels: the class names; logit ``i`` is ``labels[i]``.
        pairs: whether the classifier reads sentence pairs (``text``, ``text2``).
    """

    def __init__(
        self,
        model: ClassifierModel,
        tokenizer: Vocabulary,
        config: Config,
        device: str | torch.device = "cpu",
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.config = config
        self.labels: list[str] = list(model.config.labels)
        self.pairs = bool(config.data.text2_field)
        self.max_len = config.data.max_len  # pieces a text (a pair: text <sep> text2) keeps
        if model.config.positions == "learned":  # the text and its eos must fit the position table (<cls> has none)
            self.max_len = min(self.max_len, model.config.max_positions - 1)
        self.batch_size = batch_size
        self._encode_lock = threading.Lock()  # tokenizers are not all documented as thread-safe

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        checksums: bool = True,
    ) -> Classifier:
        """A trained classifier from a run directory (its best checkpoint, else the last) or a checkpoint directory.

        Raises:
            CheckpointError: a missing or corrupt file, a vocabulary that does not match, or a model that is not a
                classifier (one line that names the command for it).
        """
        checkpoint = ckpt.resolve(path)
        ckpt.verify(checkpoint, checksums=checksums)
        info = ckpt.read_info(checkpoint)
        if info.config.data.task != "classify":
            raise CheckpointError(not_a_classifier(path, info.config.data.task))
        vocab_dir = ckpt.vocab_dir_of(checkpoint)
        ckpt.check_vocab(info, vocab_dir)
        model = ClassifierModel(info.config.model)
        ckpt.load_weights(model, checkpoint)
        log.info("loaded the classifier %s (step %d, labels %s)", checkpoint, info.step, ", ".join(model.config.labels))
        return cls(model, load_vocabulary(vocab_dir), info.config, device, batch_size=batch_size)

    # ------------------------------------------------------------------------------------------------------------------
    # public API

    @torch.inference_mode()
    def logits(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> torch.Tensor:
        """Class scores of each text (or ``(text, text2)`` pair), in input order: ``(N, classes)`` float32 on the CPU.

        Raises:
            ValueError: a blank text; ``texts2`` missing for a classifier of pairs, given to one of single texts, or
                of another length than ``texts``.
            TypeError: one string, or an iterator (a generator, ``map``), instead of a sequence of strings; an item
                that is not a string.
        """
        self._check(texts, texts2)
        c = self.config.model
        with self._encode_lock:
            ids = encode_texts(self.tokenizer, texts, texts2, self.max_len, c.eos_id)
        out = torch.empty(len(ids), len(self.labels))
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # by length: little padding
        for start in range(0, len(order), self.batch_size):
            index = order[start : start + self.batch_size]
            batch = collate_classes([(ids[i], [0]) for i in index], c.pad_id, c.eos_id)
            out[index] = self.model(batch.src.to(self.device)).float().cpu()
        return out

    def probabilities(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> torch.Tensor:
        """The softmax of :meth:`logits`: ``(N, classes)``, columns in :attr:`labels` order; each row sums to 1."""
        return self.logits(texts, texts2).softmax(dim=-1)

    def predict(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> list[str]:
        """The most probable label of each text, in input order."""
        return [self.labels[int(i)] for i in self.logits(texts, texts2).argmax(dim=-1)]

    def classify(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> list[Classification]:
        """Each text's label with the probability of every label, in input order."""
        probs = self.probabilities(texts, texts2)
        return [
            Classification(self.labels[int(row.argmax())], dict(zip(self.labels, row.tolist(), strict=True)))
            for row in probs
        ]

    # ------------------------------------------------------------------------------------------------------------------

    def _check(self, texts: Sequence[str], texts2: Sequence[str] | None) -> None:
        for name, given in (("texts", texts), ("texts2", texts2)):
            if isinstance(given, str):
                raise TypeError(f"{name}: a sequence of strings, not one string")
            if given is not None and not isinstance(given, Collection):  # a generator, map(...): read once, no len
                raise TypeError(f"{name}: a sequence of strings, not a {type(given).__name__}: pass list({name})")
        if self.pairs and texts2 is None:
            raise ValueError(f"this classifier reads sentence pairs (data.text2_field: {self.config.data.text2_field})"
                             ": give texts2, the second text of each pair")  # fmt: skip
        if not self.pairs and texts2 is not None:
            raise ValueError("this classifier reads single texts (it was trained without data.text2_field): leave "
                             "texts2 out")  # fmt: skip
        if texts2 is not None and len(texts2) != len(texts):
            raise ValueError(f"texts2: {len(texts2)} second texts for {len(texts)} texts")
        for name, given in (("texts", texts), ("texts2", texts2 or ())):
            for i, text in enumerate(given):
                if not isinstance(text, str):
                    raise TypeError(f"{name}[{i}]: a string, not {type(text).__name__}")
                if not text.strip():
                    raise ValueError(f"{name}[{i}] is empty: an empty text has no class")


def not_a_classifier(path: str | Path, task: str) -> str:
    """The one line that refuses a model that is not a classifier, naming the command that takes it."""
    verb = "transduce parse" if task == "parse" else "transduce translate"
    return f"{path} is not a classifier (data.task: {task}): use {verb}"


def is_classifier(path: str | Path) -> bool:
    """Whether ``path`` (a run directory or checkpoint) holds a classifier (``data.task: classify``)."""
    try:
        return ckpt.read_info(ckpt.resolve(path)).config.data.task == "classify"
    except CheckpointError:
        return False


def load_classifier(path: str | Path, device: str | torch.device = "cpu", *, checksums: bool = True) -> Classifier:
    """:meth:`Classifier.load` (the older spelling)."""
    return Classifier.load(path, device, checksums=checksums)


__all__ = ["Classification", "Classifier", "is_classifier", "load_classifier", "not_a_classifier"]
