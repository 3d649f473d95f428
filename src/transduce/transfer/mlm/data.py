"""Masked-LM data: reading raw text, preparing it, masking it and batching it.

A corpus (``data.train``, ``data.valid``, each ``data.test`` entry) with ``data.task: mlm`` is one text per line,
plain or gzipped:

- a text file, ``NAME.txt[.gz]`` (any existing file but a ``.tsv`` or ``.jsonl`` one is read so);
- the source side of a translation corpus in the prefix form: ``data.train: data/multi30k/train`` with
  ``data.src_lang: en`` reads ``data/multi30k/train.en`` or ``train.en.gz``, as translation data resolves it.

Every fault is one :class:`~transduce.errors.DataError` naming the file (and line), raised by the first pass before
any vocabulary is trained or any file is written: a missing file, bytes that are not UTF-8, an empty (or blank) line,
a corpus without any line. Texts longer than ``data.max_len`` pieces are truncated (and counted), never dropped:
every line of every corpus is kept, in order.

The vocabulary is learned on a sample of the training texts (``data.vocab_size``, as translation data learns a joint
one), or taken from ``data.vocabulary``: a run directory, a checkpoint, a prepared or vocabulary directory (one with
``tokenizer.json``), whose files are copied as they are, so that the run's vocabulary is that run's, file for file;
or a SentencePiece ``.model`` file with transduce's special ids (pad 0, bos 1, eos 2, unk 3), used with
``data.lowercase``.

The prepared directory has the layout of a translation one (:mod:`transduce.data.binary`): the text ids are the
``src`` side and the ``tgt`` side is empty. Masking happens when batches are made (:class:`MaskedEpochs`), not here.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece
import torch

from transduce.config import DataConfig
from transduce.data.batch import _pad
from transduce.data.binary import ParallelDataset
from transduce.data.manifest import file_record
from transduce.data.sampler import TokenBatchSampler
from transduce.data.texts import Checked, GivenVocabulary, Reservoir, TextTask, cut, prepare_texts, text_corpora
from transduce.errors import DataError
from transduce.text.special import EOS_ID, PAD_ID
from transduce.text.textio import decode_line, iter_raw_lines, resolve_corpus_file
from transduce.text.tokenizer import TOKENIZER_FILE, Tokenizer, Vocabulary
from transduce.text.vocab import load_vocabulary
from transduce.transfer.mlm.masking import MaskedText, Masker

log = logging.getLogger(__name__)

VALID_SEED = 20190524  # the validation masking's seed: the same masking at every validation of every run


# ----------------------------------------------------------------------------------------------------------------------
# corpora


def resolve_corpus(key: str, spec: str | list[str], cfg: DataConfig) -> Path:
    """The text file a data entry names (``key``, e.g. ``data.train``, for messages).

    Raises:
        DataError: two files, a TSV or JSON Lines file, or no such file (nor ``spec.src_lang[.gz]``).
    """
    from transduce.data.download import missing_corpus_hint

    if not isinstance(spec, str):
        raise DataError(f"{key}: a masked-LM corpus is one text file or a path prefix, got two files {spec!r}")
    path = Path(spec)
    name = path.name.removesuffix(".gz")
    if name.endswith((".tsv", ".jsonl")):
        raise DataError(f"{key}: a masked-LM corpus is a text file (one text per line) or a path prefix, got {spec!r}")
    if path.is_file():
        return path
    if name.endswith(".txt"):
        raise DataError(f"{path}: file not found{missing_corpus_hint(key, spec)}")
    try:
        return resolve_corpus_file(spec, cfg.src_lang)  # a translation corpus's source side
    except DataError as e:
        raise DataError(f"{e}{missing_corpus_hint(key, spec)}") from None


def corpora(cfg: DataConfig) -> dict[str, Path]:
    """The text files of the data section by split name: ``train``, ``valid`` and one per test file (its name)."""
    return text_corpora(cfg, lambda key, spec: resolve_corpus(key, spec, cfg), lambda path: path,
                        "--train FILE.txt, or a prefix with --src-lang")  # fmt: skip


def texts(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number from 1, text)`` for every line of ``path``.

    Raises:
        DataError: a line that is not UTF-8 or is empty, naming the file and line.
    """
    for lineno, raw in enumerate(iter_raw_lines(path), start=1):
        text = decode_line(raw, path, lineno) or ""  # (strict: a bad byte raises)
        if not text.strip():
            raise DataError(f"{path}, line {lineno}: empty text")
        yield lineno, text


def _record(path: Path) -> dict[str, Any]:
    """How the corpus is read and its file's identity, for the manifest (the shape of a translation record)."""
    file = file_record(path)
    return {"format": "text", "src": file, "tgt": dict(file)}


# ----------------------------------------------------------------------------------------------------------------------
# a given vocabulary (data.vocabulary)


def vocabulary_source(spec: str) -> Path:
    """The vocabulary directory (with ``tokenizer.json``) or SentencePiece ``.model`` file that ``data.vocabulary``
    names: a run directory or a standalone checkpoint (its ``vocab/``), a training checkpoint (its run's
    ``vocab/``), a prepared or vocabulary directory, or a ``.model`` file.

    Raises:
        DataError: nothing there, or nothing that holds a vocabulary.
    """
    from transduce.training import checkpoint as ckpt

    path = Path(spec)
    if path.is_file() and path.suffix == ".model":
        return path
    if path.is_file() and path.name == ckpt.MODEL_FILE:
        path = path.parent
    if not path.exists():
        raise DataError(f"{path}: not found (data.vocabulary)")
    for candidate in (path, path / ckpt.VOCAB_DIR):
        if (candidate / TOKENIZER_FILE).is_file():
            return candidate
    if (path / ckpt.MODEL_FILE).is_file():
        return ckpt.vocab_dir_of(path)
    raise DataError(f"{path}: no vocabulary there (data.vocabulary: a run directory, a checkpoint, a directory with "
                    f"{TOKENIZER_FILE} or a SentencePiece .model file)")  # fmt: skip


def vocabulary_identity(source: Path, lowercase: bool) -> str:
    """What identifies a given vocabulary in the manifest: the run's vocabulary identity
    (:func:`transduce.training.checkpoint.vocab_sha256`) of a directory; a ``.model`` file's checksum and
    ``lowercase``."""
    from transduce.training.checkpoint import vocab_sha256

    if source.is_dir():
        return vocab_sha256(source)
    return hashlib.sha256(source.read_bytes() + f"\0lowercase={lowercase}".encode()).hexdigest()


def _write_vocabulary(source: Path, directory: Path, lowercase: bool) -> Tokenizer:
    """Put the vocabulary of ``source`` into ``directory`` and load it (transduce's SentencePiece vocabularies only).

    Raises:
        DataError: not a SentencePiece model, other special ids, or a vocabulary of another kind (Marian's).
    """
    from transduce.training.checkpoint import copy_vocab

    if source.is_dir():
        copy_vocab(source, directory)  # the very files: the run's vocabulary identity is that run's
        tok = load_vocabulary(directory)
    else:
        try:
            proc = sentencepiece.SentencePieceProcessor(model_file=str(source))
        except (RuntimeError, OSError) as e:
            raise DataError(f"{source}: not a SentencePiece model ({str(e).strip().splitlines()[0]})") from None
        try:
            tok = Tokenizer(proc, lowercase=lowercase)
        except DataError as e:
            raise DataError(f"{source}: {e}") from None
        tok.save(directory)
    if not isinstance(tok, Tokenizer):
        raise DataError(f"{source}: a {type(tok).__name__} vocabulary; a masked language model needs a SentencePiece "
                        "vocabulary with transduce's special ids (pad 0, bos 1, eos 2, unk 3)")  # fmt: skip
    return tok


def check_prepared(prepared: Path, cfg: DataConfig) -> None:
    """A given prepared directory (``data.prepared`` without raw data) must hold ``data.vocabulary``'s vocabulary.

    Raises:
        DataError: it was prepared for another task or with another vocabulary.
    """
    from transduce.data.binary import read_manifest

    manifest = read_manifest(prepared)
    if manifest.get("task") != "mlm":
        raise DataError(f"{prepared}: not prepared for masked-LM pretraining (data.task: mlm)")
    if cfg.vocabulary:
        identity = vocabulary_identity(vocabulary_source(cfg.vocabulary), cfg.lowercase)
        if manifest["options"].get("vocabulary") != identity:
            raise DataError(f"{prepared}: prepared with another vocabulary than {cfg.vocabulary}; set data.train to "
                            "prepare the corpus with it")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# preparing


def prepare_mlm(cfg: DataConfig, out_dir: str | Path, *, force: bool = False) -> dict[str, Any]:
    """``transduce prepare`` for ``data.task: mlm`` (see the module docstring): the texts prepared by
    :func:`~transduce.data.texts.prepare_texts` (``cfg``, ``out_dir`` and ``force`` are its arguments; it returns
    the manifest), encoded with ``data.vocabulary``'s vocabulary where it is set.

    Raises:
        DataError: bad input (see the module docstring), or an ``out_dir`` that cannot be replaced safely.
    """
    splits = corpora(cfg)
    given = None
    if cfg.vocabulary:
        source = vocabulary_source(cfg.vocabulary)
        given = GivenVocabulary(vocabulary_identity(source, cfg.lowercase),
                                functools.partial(_given_vocabulary, source, cfg))  # fmt: skip
    return prepare_texts(cfg, out_dir, _TASK, splits, vocabulary=given, force=force)


def _given_vocabulary(source: Path, cfg: DataConfig, directory: Path) -> Tokenizer:
    """``data.vocabulary``'s vocabulary, put into ``directory`` and loaded."""
    tok = _write_vocabulary(source, directory, cfg.lowercase)
    log.info("encoding with the vocabulary of %s (%s)", cfg.vocabulary, tok)
    return tok


def _check(splits: dict[str, Path], sample_size: int) -> Checked:
    """Pass 1: read every corpus to the end; returns each split's line count and a uniform sample of at most
    ``sample_size`` training texts (for the vocabulary).

    Raises:
        DataError: the first fault, naming its file and line; a corpus without any line.
    """
    sample = Reservoir(sample_size)
    lines: dict[str, int] = {}
    for split, path in splits.items():
        lines[split] = 0
        for lineno, text in texts(path):
            lines[split] = lineno
            if split == "train":
                sample.offer(text)
        if not lines[split]:
            raise DataError(f"{path}: no texts (the file is empty)")
    return Checked(lines, sample.texts)


def _encode(tok: Vocabulary, chunk: list[tuple[int, str]], max_len: int) -> tuple[list[list[int]], None, int]:
    """Pass 2: the ids of a chunk of texts cut to ``max_len`` (the target side is empty), and how many were cut."""
    ids, truncated = cut(tok.encode_src_batch([text for _, text in chunk]), max_len)
    return ids, None, truncated


_TASK = TextTask("mlm", record=_record, check=_check, lines=texts, encode=_encode)


# ----------------------------------------------------------------------------------------------------------------------
# masking and batches


@dataclass
class MaskedBatch:
    """A masked-LM batch: batch-first tensors, the texts right-padded with the pad id.

    Shape:
        src: ``(B, S)`` input ids + eos, S = longest text + 1 (``unk`` where the mask vector goes).
        masked: ``(B, S)`` bool, True where the input is the mask vector.
        positions: ``(N,)`` the chosen positions as flat indices into ``(B * S)`` (``row * S + column``), in order.
        labels: ``(N,)`` the original ids at ``positions``: what the model predicts.
    """

    src: torch.Tensor
    masked: torch.Tensor
    positions: torch.Tensor
    labels: torch.Tensor
    n_src_tokens: int  # real tokens (eos included, padding not)
    n_tgt_tokens: int  # chosen positions: what the loss is normalised by

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MaskedBatch:
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return MaskedBatch(move(self.src), move(self.masked), move(self.positions), move(self.labels),
                           self.n_src_tokens, self.n_tgt_tokens)  # fmt: skip

    def pin_memory(self) -> MaskedBatch:
        return MaskedBatch(self.src.pin_memory(), self.masked.pin_memory(), self.positions.pin_memory(),
                           self.labels.pin_memory(), self.n_src_tokens, self.n_tgt_tokens)  # fmt: skip

    def __len__(self) -> int:
        return self.src.shape[0]


def collate_masked(texts: Sequence[MaskedText], pad_id: int = PAD_ID, eos_id: int = EOS_ID) -> MaskedBatch:
    """Pad masked texts into a :class:`MaskedBatch`: ids + eos, right-padded."""
    if not texts:
        raise ValueError("collate_masked: empty batch")
    src, n_src = _pad([t.ids for t in texts], pad_id, None, eos_id)
    width = src.shape[1]
    masked = np.zeros(src.shape, dtype=bool)
    for row, t in enumerate(texts):
        masked[row, t.masked] = True
    positions = np.concatenate([row * width + t.chosen for row, t in enumerate(texts)])
    labels = np.concatenate([t.labels for t in texts])
    return MaskedBatch(torch.from_numpy(src), torch.from_numpy(masked), torch.from_numpy(positions.astype(np.int64)),
                       torch.from_numpy(labels.astype(np.int64)), n_src, len(positions))  # fmt: skip


class MaskedEpochs:
    """The training split's dataset and batch sampler in one: ``self[i]`` is text ``i`` masked for the epoch that
    :meth:`iter_from` last started, a pure function of ``(seed, epoch, i)`` (whatever the batch, the rank or the
    number of ranks), so that every epoch masks anew and a resumed run masks as the run it continues did.

    Args:
        dataset: the prepared training split.
        masker: the model's :class:`~transduce.transfer.mlm.masking.Masker`.
        max_tokens, seed, rank, world_size: as :class:`~transduce.data.sampler.TokenBatchSampler` takes them.
    """

    def __init__(self, dataset: ParallelDataset, masker: Masker, max_tokens: int, *, seed: int, rank: int = 0,
                 world_size: int = 1) -> None:  # fmt: skip
        self.dataset, self.masker, self.seed = dataset, masker, seed
        self.sampler = batch_sampler(dataset, max_tokens, seed=seed, rank=rank, world_size=world_size)
        self.epoch = 0

    def iter_from(self, epoch: int, position: int = 0) -> Iterator[list[int]]:
        """This rank's batches of ``epoch``, skipping the first ``position``; ``self[i]`` masks for ``epoch``."""
        self.epoch = epoch
        return self.sampler.iter_from(epoch, position)

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return len(self.sampler)

    def __getitem__(self, i: int) -> MaskedText:
        return self.masker(self.dataset[i][0], np.random.default_rng([self.seed, self.epoch, int(i)]))


class FixedMasking:
    """A split masked once and for all: ``self[i]`` is text ``i`` masked by a generator seeded with
    ``(VALID_SEED, i)``, the same at every validation (and in every run, whatever its ``train.seed``)."""

    def __init__(self, dataset: ParallelDataset, masker: Masker) -> None:
        self.dataset, self.masker = dataset, masker

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> MaskedText:
        return self.masker(self.dataset[i][0], np.random.default_rng([VALID_SEED, int(i)]))


def batch_sampler(dataset: ParallelDataset, max_tokens: int, *, seed: int, shuffle: bool = True, rank: int = 0,
                  world_size: int = 1) -> TokenBatchSampler:  # fmt: skip
    """Length-grouped batches of a masked-LM split under ``max_tokens``."""
    return TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, max_tokens, seed=seed, shuffle=shuffle,
                             rank=rank, world_size=world_size)  # fmt: skip


__all__ = [
    "FixedMasking",
    "MaskedBatch",
    "MaskedEpochs",
    "batch_sampler",
    "check_prepared",
    "collate_masked",
    "corpora",
    "prepare_mlm",
    "resolve_corpus",
    "texts",
    "vocabulary_source",
]
