"""``transduce prepare`` for the tasks of an encoder alone: texts, labelled (sentence classification,
:mod:`transduce.transfer.classify.data`) or not (masked-LM pretraining, :mod:`transduce.transfer.mlm.data`).

What these preparations share is here; what a task's corpora are, how they are read and checked and how a chunk of
them is encoded is the task's (a :class:`TextTask`). :func:`prepare_texts` then

1. records each corpus's file and reuses an earlier preparation of the same inputs and options
   (:func:`~transduce.data.manifest.earlier_preparation`);
2. runs the task's first pass (:attr:`TextTask.check`), which raises every fault before any vocabulary is trained or
   any file is written, and samples the training texts (:class:`Reservoir`);
3. learns a SentencePiece vocabulary on that sample, or takes a given one (:class:`GivenVocabulary`);
4. encodes every split in chunks of :data:`CHUNK_LINES` lines, truncating texts longer than ``data.max_len`` pieces
   by the task's rule (counted, never dropped), into the layout of a translation directory
   (:mod:`transduce.data.binary`): the text ids are the ``src`` side, and the ``tgt`` side holds each line's class
   index (labelled texts) or nothing;
5. writes the manifest (with ``labels`` for labelled texts) and renames the directory into place
   (:func:`~transduce.data.manifest.install_prepared`); nothing is left behind on failure.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import sentencepiece

import transduce
from transduce.config import DataConfig
from transduce.data.binary import SplitWriter, ids_dtype, split_files
from transduce.data.manifest import FORMAT, VERSION, earlier_preparation, install_prepared
from transduce.data.output import make_temp_dir, read_json
from transduce.errors import DataError
from transduce.text.special import SPECIAL_IDS
from transduce.text.tokenizer import Tokenizer, Vocabulary

log = logging.getLogger(__name__)

CHUNK_LINES = 4096  # lines encoded at a time
SAMPLE_SEED = 12345  # the vocabulary sample is a deterministic function of the data
# DataConfig fields that change a preparation of texts
OPTION_KEYS = ("vocab_type", "vocab_size", "character_coverage", "input_sentence_size", "lowercase", "max_len")

C = TypeVar("C")  # a task's corpus: what it resolves a data entry to
E = TypeVar("E", bound=tuple)  # one line of a corpus as the task reads it: (line number from 1, ...)


@dataclass
class Checked:
    """What a task's first pass found, every corpus read to the end and every fault raised."""

    lines: dict[str, int]  # each split's line count
    sample: list[str]  # the training texts a vocabulary is learned on
    labels: list[str] = field(default_factory=list)  # labelled texts: the classes, in the order of their indices


class GivenVocabulary(NamedTuple):
    """A vocabulary to encode with instead of one learned on the texts."""

    identity: str  # the manifest's options["vocabulary"]: an earlier preparation is reused only with the same one
    write: Callable[[Path], Vocabulary]  # puts the vocabulary into the prepared directory and loads it


@dataclass(frozen=True)
class TextTask(Generic[C, E]):
    """What a task of texts gives :func:`prepare_texts`."""

    name: str  # data.task, in the options and the manifest
    record: Callable[[C], dict[str, Any]]  # a corpus's manifest record: how it is read, its file (file_record)
    check: Callable[[dict[str, C], int], Checked]  # the first pass over the corpora (and the sample size)
    lines: Callable[[C], Iterable[E]]  # the second pass: a corpus's lines, in order
    # a chunk's ids truncated to max_len (the third argument) by the task's rule, for labelled texts each line's label
    # (else None), and how many lines were truncated
    encode: Callable[[Vocabulary, list[E], int], tuple[list[list[int]], list[str] | None, int]]


def cut(ids: list[list[int]], max_len: int) -> tuple[list[list[int]], int]:
    """Each text's ids cut to ``max_len``, and how many were longer (a task's ``encode`` for single texts)."""
    return [s[:max_len] for s in ids], sum(len(s) > max_len for s in ids)


class Reservoir:
    """A uniform sample of at most ``size`` of the texts offered, a deterministic function of them (reservoir sampling:
    memory bounded by the sample, not the corpus)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.texts: list[str] = []  # the sample
        self.seen = 0  # texts offered so far
        self._rng = random.Random(SAMPLE_SEED)

    def offer(self, text: str) -> None:
        """Keep ``text``: always while the sample is not full, then with probability ``size / seen`` in place of a
        uniformly chosen kept one."""
        self.seen += 1
        if len(self.texts) < self.size:
            self.texts.append(text)
        elif (j := self._rng.randrange(self.seen)) < self.size:
            self.texts[j] = text


def text_corpora(
    cfg: DataConfig, resolve: Callable[[str, str | list[str]], C], path_of: Callable[[C], Path], usage: str
) -> dict[str, C]:
    """The corpora of the data section by split name: ``train``, ``valid`` and one per test file (its name).

    Args:
        resolve: the task's corpus of a data entry: ``resolve(key, spec)``, ``key`` (``data.train``) for messages.
        path_of: a corpus's file, whose name names a test split.
        usage: how to give a training corpus, for the error that there is none.

    Raises:
        DataError: no training corpus, two test files of one name, or what ``resolve`` raises.
    """
    if not cfg.train:
        raise DataError(f"no training corpus: set data.train ({usage})")
    out = {"train": resolve("data.train", cfg.train)}
    if cfg.valid:
        out["valid"] = resolve("data.valid", cfg.valid)
    for spec in cfg.test:
        corpus = resolve("data.test", spec)
        path = path_of(corpus)
        name = path.name.removesuffix(".gz").rsplit(".", 1)[0]
        if name in out:
            raise DataError(f"test set {path}: the split name {name!r} is already taken; rename the file")
        out[name] = corpus
    return out


def prepare_texts(
    cfg: DataConfig, out_dir: str | Path, task: TextTask[C, E], splits: dict[str, C], *,
    vocabulary: GivenVocabulary | None = None, force: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Prepare the corpora ``splits`` of ``task`` into ``out_dir`` (see the module docstring).

    Args:
        cfg: the data section.
        out_dir: the prepared directory to create (atomically: nothing is left on failure).
        task: what the task reads and how.
        splits: its corpora by split name (:func:`text_corpora`).
        vocabulary: a vocabulary to encode with; None: learn one on a sample of the training texts.
        force: rebuild even when ``out_dir`` already holds this preparation.

    Returns:
        The manifest (also written to ``out_dir/manifest.json``).

    Raises:
        DataError: what the task's first pass raises, or an ``out_dir`` that cannot be replaced safely.
    """
    started = time.perf_counter()
    out_dir = Path(out_dir)
    options: dict[str, Any] = {"task": task.name, **{key: getattr(cfg, key) for key in OPTION_KEYS}}
    if vocabulary is not None:
        options["vocabulary"] = vocabulary.identity
    inputs = {split: task.record(corpus) for split, corpus in splits.items()}
    existing = earlier_preparation(out_dir, options, inputs, force=force)
    if existing is not None:
        return existing
    checked = task.check(splits, cfg.input_sentence_size)  # every fault raised before anything is written
    tmp = make_temp_dir(out_dir)
    try:
        if vocabulary is not None:
            tok = vocabulary.write(tmp)
        else:
            log.info("training a %s vocabulary of %d on %d sampled texts", cfg.vocab_type, cfg.vocab_size,
                     len(checked.sample))  # fmt: skip
            tok = Tokenizer.train(tmp, checked.sample, vocab_size=cfg.vocab_size, vocab_type=cfg.vocab_type,
                                  lowercase=cfg.lowercase, character_coverage=cfg.character_coverage,
                                  threads=cfg.workers or os.cpu_count() or 1)  # fmt: skip
        dtype = ids_dtype(max(tok.src_vocab_size, len(checked.labels)))
        info = {split: _encode_split(tmp, split, task, corpus, tok, checked.labels, cfg.max_len, dtype)
                for split, corpus in splits.items()}  # fmt: skip
        for split, entry in info.items():
            entry["read"] = checked.lines[split]
            for side in ("src", "tgt"):
                inputs[split][side]["lines"] = checked.lines[split]
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "transduce_version": transduce.__version__,
            "sentencepiece_version": sentencepiece.__version__,
            "task": task.name,
            "options": options,
            "inputs": inputs,
            "special_ids": dict(SPECIAL_IDS),
            "tokenizer": read_json(tmp / "tokenizer.json"),
            "dtype": dtype.name,
            **({"labels": checked.labels} if checked.labels else {}),
            "splits": info,
        }
        install_prepared(tmp, out_dir, manifest, started)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if checked.labels:
        log.info("prepared %s in %.1f s: labels %s", out_dir, manifest["seconds"], ", ".join(checked.labels))
    else:
        log.info("prepared %s in %.1f s: %d training texts", out_dir, manifest["seconds"], info["train"]["pairs"])
    return manifest


def _encode_split(
    tmp: Path, split: str, task: TextTask[C, E], corpus: C, tok: Vocabulary, labels: Sequence[str], max_len: int,
    dtype: np.dtype,
) -> dict[str, Any]:  # fmt: skip
    """The second pass for one split: encode and append every line; returns the split's manifest entry."""
    index = {label: i for i, label in enumerate(labels)}
    writer = SplitWriter(tmp, split, dtype)
    truncated = 0
    per_label = np.zeros(len(labels), dtype=np.int64)

    def flush(chunk: list[E]) -> None:
        nonlocal truncated
        ids, chunk_labels, cut = task.encode(tok, chunk, max_len)
        truncated += cut
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter((i for s in ids for i in s), dtype=np.int64, count=int(lens.sum()))
        lines = np.asarray([example[0] - 1 for example in chunk], dtype=np.int64)
        if chunk_labels is None:  # the target side is empty
            writer.append(lines, flat, lens, np.zeros(0, dtype=np.int64), np.zeros(len(chunk), dtype=np.int64))
            return
        classes = np.asarray([index[label] for label in chunk_labels], dtype=np.int64)
        per_label[:] += np.bincount(classes, minlength=len(labels))
        writer.append(lines, flat, lens, classes, np.ones(len(chunk), dtype=np.int64))  # one class index each

    chunk: list[E] = []
    for example in task.lines(corpus):
        chunk.append(example)
        if len(chunk) == CHUNK_LINES:
            flush(chunk)
            chunk = []
    if chunk:
        flush(chunk)
    info = writer.close()
    kind = "train" if split == "train" else "valid" if split == "valid" else "test"
    counts: dict[str, Any] = {"truncated": truncated}
    if labels:
        counts["labels"] = {label: int(n) for label, n in zip(labels, per_label, strict=True)}
        log.info("%s: %d examples (%s), %d truncated to %d pieces", split, info["pairs"],
                 ", ".join(f"{n} {label}" for label, n in counts["labels"].items()), truncated, max_len)  # fmt: skip
    else:
        log.info("%s: %d texts, %d pieces, %d truncated to %d pieces", split, info["pairs"], info["src_tokens"],
                 truncated, max_len)  # fmt: skip
    return {**info, "kind": kind, "counts": counts, "files": split_files(split)}


__all__ = [
    "CHUNK_LINES",
    "OPTION_KEYS",
    "SAMPLE_SEED",
    "Checked",
    "GivenVocabulary",
    "Reservoir",
    "TextTask",
    "prepare_texts",
    "text_corpora",
]
