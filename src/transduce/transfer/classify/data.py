"""Sentence classification data: reading labelled text, preparing it, and batching it.

A corpus (``data.train``, ``data.valid``, each ``data.test`` entry) with ``data.task: classify`` is

- a TSV file, ``NAME.tsv[.gz]``: ``label<TAB>text`` on every line (``label<TAB>text<TAB>text2`` when
  ``data.text2_field`` is set: sentence pairs);
- a JSON Lines file, ``NAME.jsonl[.gz]``: an object per line with the label in ``data.label_field`` (a string or an
  integer), the text in ``data.text_field`` and, for sentence pairs, the second text in ``data.text2_field``.

A pair is encoded as ``text <sep> text2`` with the vocabulary's end-of-sentence id as the separator (the encoder then
adds one more at the end, as for every input). The label set is read from the training corpus (sorted by name) and
stored in the prepared manifest; the run puts it into ``model.labels``.

Every fault is one :class:`~transduce.errors.DataError` naming the file and line, raised by the first pass, before
any vocabulary is trained or any file is written: a line without its tab(s), a line that is not a JSON object with the
fields, bytes that are not UTF-8, an empty label or text, a label holding a line break, a label in the validation or
a test corpus that the training corpus never has, and a corpus without any line. Texts longer than ``data.max_len``
pieces are truncated (and counted), never dropped: every line of every corpus is kept, in order. A pair is truncated
longest-first, as BERT's are: pieces go from the end of the longer of its texts until ``text <sep> text2`` fits
(:func:`fit_pair`), so that neither text is cut off entirely (``data.max_len`` >= 3). Classifying truncates so too.

The prepared directory has the layout of a translation one (:mod:`transduce.data.binary`): the text ids are the
``src`` side and the class index of each line, one id, the ``tgt`` side; ``manifest.json`` adds ``labels``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transduce.config import DataConfig
from transduce.data.batch import _pad
from transduce.data.binary import ParallelDataset
from transduce.data.corpus import corpus_format
from transduce.data.manifest import file_record
from transduce.data.sampler import TokenBatchSampler
from transduce.data.texts import Checked, GivenVocabulary, Reservoir, TextTask, cut, prepare_texts, text_corpora
from transduce.errors import DataError
from transduce.text.special import EOS_ID, PAD_ID
from transduce.text.textio import decode_line, iter_raw_lines
from transduce.text.tokenizer import Vocabulary
from transduce.text.vocab import load_vocabulary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabelledCorpus:
    """One classification corpus: its file, its form (``"tsv"`` or ``"jsonl"``) and the fields of JSON Lines.

    Attributes:
        path: the file (``"-"``: standard input).
        format: ``"tsv"`` or ``"jsonl"``.
        label_field, text_field: JSON Lines fields (dotted names reach into nested objects).
        text2_field: the second text of a sentence pair; ``""``: single texts (a TSV line then has one tab).
        labelled: False for texts to classify: the label is not read (a JSON Lines line needs no label field, a TSV
            line's label column may hold anything) and :meth:`examples` gives None for it.
    """

    path: Path
    format: str
    label_field: str = "label"
    text_field: str = "text"
    text2_field: str = ""
    labelled: bool = True

    def examples(self) -> Iterator[tuple[int, str | None, str, str | None]]:
        """``(line number from 1, label (None when not labelled), text, second text or None)`` for every line.

        Raises:
            DataError: naming the file and line (see the module docstring).
        """
        for lineno, raw in enumerate(iter_raw_lines(self.path), start=1):
            where = f"{self.path}, line {lineno}"
            if self.format == "tsv":
                parts = (decode_line(raw, self.path, lineno) or "").split("\t")  # (strict: a bad byte raises)
                want = 3 if self.text2_field else 2
                if len(parts) != want:
                    found = "no tab" if len(parts) == 1 else f"{len(parts) - 1} tabs"
                    shape = "label<TAB>text<TAB>text2 (two tabs)" if self.text2_field else "label<TAB>text (one tab)"
                    raise DataError(f"{where}: expected {shape}, found {found}")
                fields = parts
            else:
                fields = self._json_fields(raw, where)
            label, text = fields[0].strip() if self.labelled else None, fields[1]
            text2 = fields[2] if self.text2_field else None
            if label == "":
                raise DataError(f"{where}: empty label")
            if label is not None and ("\n" in label or "\r" in label):  # (a JSON string): a label is written a line
                raise DataError(f"{where}: the label holds a line break")
            for what, value in (("text", text), ("second text", text2)):
                if value is not None and not value.strip():
                    raise DataError(f"{where}: empty {what}")
            yield lineno, label, text, text2

    def _json_fields(self, raw: bytes, where: str) -> list[str]:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise DataError(f"{where}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
        except json.JSONDecodeError as e:
            what = "an empty line" if not raw.strip() else f"{e.msg} at column {e.colno}"
            raise DataError(f"{where}: not valid JSON ({what}); JSON Lines needs one object per line") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object")
        names = [("label", self.label_field)] if self.labelled else []
        names.append(("text", self.text_field))
        if self.text2_field:
            names.append(("text2", self.text2_field))
        out = [] if self.labelled else [""]  # (the label's place)
        for option, name in names:
            value: Any = obj
            for part in name.split("."):
                if not isinstance(value, dict) or part not in value:
                    found = ", ".join(map(repr, value)) if isinstance(value, dict) else "no object"
                    raise DataError(f"{where}: no field {name!r} (found: {found}); --{option}-field names another")
                value = value[part]
            if option == "label" and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)  # integer labels (0/1) name their classes too
            if not isinstance(value, str):
                raise DataError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
            out.append(value if option == "label" else value.replace("\n", " ").replace("\r", " "))  # one line each
        return out

    def record(self) -> dict[str, Any]:
        """How the corpus is read and its file's identity, for the manifest (the shape of a translation record)."""
        file = file_record(self.path)
        fields = [self.label_field, self.text_field, self.text2_field]
        # pairs: how they are cut to max_len (fit_pair), so that a preparation cut otherwise is not reused
        pairs = {"pair_truncation": "longest_first"} if self.text2_field else {}
        return {"format": self.format, "fields": fields, **pairs, "src": file, "tgt": dict(file)}


def resolve_corpus(key: str, spec: str | list[str], cfg: DataConfig) -> LabelledCorpus:
    """The :class:`LabelledCorpus` a data entry names (``key``, e.g. ``data.train``, for messages).

    Raises:
        DataError: not a .tsv or .jsonl file name, or a missing file.
    """
    from transduce.data.download import missing_corpus_hint

    form = corpus_format(spec)
    if form == "files":
        raise DataError(f"{key}: a classification corpus is a .tsv (label<TAB>text) or .jsonl file, got {spec!r}")
    path = Path(spec)  # (a str: a list is the two-file form)
    if not path.is_file():
        raise DataError(f"{path}: file not found{missing_corpus_hint(key, str(spec))}")
    return LabelledCorpus(path, form, cfg.label_field, cfg.text_field, cfg.text2_field)


def corpora(cfg: DataConfig) -> dict[str, LabelledCorpus]:
    """The corpora of the data section by split name: ``train``, ``valid`` and one per test file (its name)."""
    return text_corpora(cfg, lambda key, spec: resolve_corpus(key, spec, cfg), lambda corpus: corpus.path,
                        "--train FILE.tsv or FILE.jsonl")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# encoding: one rule for preparing and for classifying


def encode_texts(
    vocab: Vocabulary, texts: Sequence[str], texts2: Sequence[str] | None, max_len: int, sep_id: int
) -> list[list[int]]:
    """The ids of each text (``text <sep> text2`` for pairs), truncated to ``max_len`` (:func:`fit_examples`); no
    end-of-sentence id (the collate adds it). ``sep_id`` is the model's end-of-sentence id."""
    return _encoded(vocab, texts, texts2, max_len, sep_id)[0]


def _encoded(
    vocab: Vocabulary, texts: Sequence[str], texts2: Sequence[str] | None, max_len: int, sep_id: int
) -> tuple[list[list[int]], int]:
    """:func:`encode_texts`, and how many texts (pairs) were truncated."""
    ids2 = vocab.encode_src_batch(list(texts2)) if texts2 is not None else None
    return fit_examples(vocab.encode_src_batch(list(texts)), ids2, max_len, sep_id)


def fit_examples(
    ids: list[list[int]], ids2: list[list[int]] | None, max_len: int, sep_id: int
) -> tuple[list[list[int]], int]:
    """Each text's ids cut to ``max_len``, or with ``ids2`` each pair's ``text <sep> text2`` fitted into ``max_len``
    (:func:`fit_pair`); and how many were truncated."""
    if ids2 is None:
        return cut(ids, max_len)
    truncated = sum(len(a) + 1 + len(b) > max_len for a, b in zip(ids, ids2, strict=True))
    return [fit_pair(a, b, max_len, sep_id) for a, b in zip(ids, ids2, strict=True)], truncated


def fit_pair(ids: Sequence[int], ids2: Sequence[int], max_len: int, sep_id: int) -> list[int]:
    """``ids <sep> ids2`` in at most ``max_len`` ids, truncated longest-first as BERT's pairs are: a piece at a time
    goes from the end of the longer text (the second on a tie) until the pair fits; the separator stays.

    The closed form of that loop: the second text keeps what the first leaves it, but at least half the room (rounded
    down); the first then keeps the rest.
    """
    room = max(max_len - 1, 0)  # the separator's place taken
    n2 = min(len(ids2), max(room - len(ids), room // 2))
    n1 = min(len(ids), room - n2)
    return [*ids[:n1], sep_id, *ids2[:n2]][:max_len]


# ----------------------------------------------------------------------------------------------------------------------
# preparing


def prepare_classification(
    cfg: DataConfig, out_dir: str | Path, *, force: bool = False, vocabulary: str | Path | None = None
) -> dict[str, Any]:
    """``transduce prepare`` for ``data.task: classify`` (see the module docstring): the labelled texts prepared by
    :func:`~transduce.data.texts.prepare_texts` (``cfg``, ``out_dir`` and ``force`` are its arguments; it returns
    the manifest).

    Args:
        vocabulary: a pretrained model's vocabulary directory to encode with (its source side) instead of training
            a SentencePiece model on the texts.

    Raises:
        DataError: bad input (see the module docstring), or an ``out_dir`` that cannot be replaced safely.
    """
    splits = corpora(cfg)
    given = None
    if vocabulary is not None:
        from transduce.training.checkpoint import vocab_sha256

        given = GivenVocabulary(vocab_sha256(vocabulary), functools.partial(_given_vocabulary, vocabulary))
    return prepare_texts(cfg, out_dir, _TASK, splits, vocabulary=given, force=force)


def _given_vocabulary(vocabulary: str | Path, directory: Path) -> Vocabulary:
    """A pretrained model's vocabulary, put into ``directory`` and loaded."""
    from transduce.training.checkpoint import copy_vocab

    copy_vocab(vocabulary, directory)  # the very files: the run's vocabulary identity is the pretrained one's
    tok = load_vocabulary(directory)
    log.info("encoding with the source vocabulary of %s (%s)", vocabulary, tok)
    return tok


def _check(splits: dict[str, LabelledCorpus], sample_size: int) -> Checked:
    """Pass 1: read every corpus to the end; returns the training labels (sorted), each split's line count and a
    uniform sample of at most ``sample_size`` training texts (for the vocabulary; a pair's texts count as two).

    Raises:
        DataError: the first fault, naming its file and line; a validation or test label the training corpus lacks;
            a corpus without any line.
    """
    sample = Reservoir(sample_size)
    counts: Counter[str] = Counter()
    lines: dict[str, int] = {}
    for lineno, label, text, text2 in splits["train"].examples():
        counts[label] += 1
        lines["train"] = lineno
        for t in (text, text2) if text2 is not None else (text,):
            sample.offer(t)
    if not counts:
        raise DataError(f"{splits['train'].path}: no examples (the file is empty)")
    labels = sorted(counts)
    if len(labels) < 2:
        raise DataError(f"{splits['train'].path}: a classifier needs two labels at least, found only {labels[0]!r}")
    known = set(labels)
    for split, corpus in splits.items():
        if split == "train":
            continue
        lines[split] = 0
        for lineno, label, _, _ in corpus.examples():
            lines[split] = lineno
            if label not in known:
                raise DataError(f"{corpus.path}, line {lineno}: label {label!r} does not occur in the training data "
                                f"{splits['train'].path} (its labels: {', '.join(labels)})")  # fmt: skip
        if not lines[split]:  # nothing to validate or test on
            raise DataError(f"{corpus.path}: no examples (the file is empty)")
    log.info("%d labels in %s: %s", len(labels), splits["train"].path,
             ", ".join(f"{label} ({counts[label]})" for label in labels))  # fmt: skip
    return Checked(lines, sample.texts, labels)


def _encode(
    tok: Vocabulary, chunk: list[tuple[int, str, str, str | None]], max_len: int
) -> tuple[list[list[int]], list[str], int]:
    """Pass 2: the ids of a chunk of examples (``text <sep> text2`` for pairs) truncated to ``max_len`` as
    :func:`encode_texts` truncates them, their labels, and how many were truncated."""
    texts2 = [t2 for *_, t2 in chunk] if chunk[0][3] is not None else None
    sep = int(getattr(tok, "eos_id", EOS_ID))
    ids, truncated = _encoded(tok, [t for _, _, t, _ in chunk], texts2, max_len, sep)
    return ids, [label for _, label, _, _ in chunk], truncated


_TASK = TextTask("classify", record=LabelledCorpus.record, check=_check, lines=LabelledCorpus.examples,
                 encode=_encode)  # fmt: skip


def prepared_labels(prepared_dir: str | Path) -> list[str]:
    """The label set of a prepared classification directory.

    Raises:
        DataError: the directory was not prepared for classification.
    """
    from transduce.data.binary import read_manifest

    manifest = read_manifest(prepared_dir)
    if manifest.get("task") != "classify" or "labels" not in manifest:
        raise DataError(f"{prepared_dir}: not prepared for classification (data.task: classify)")
    return list(manifest["labels"])


def prepared_data_config(prepared_dir: str | Path, cfg: DataConfig) -> DataConfig:
    """``cfg`` describing the data of a prepared classification directory as it was prepared: its fields (``label``,
    ``text``, ``text2``: whether it holds sentence pairs) and ``max_len``, from the manifest. A run that trains on it
    (``data.prepared`` without ``data.train``) saves them, so that its classifier reads texts as they were prepared.

    Raises:
        DataError: a field or ``max_len`` that ``cfg`` sets (not its default) to another value than the preparation's;
            a directory not prepared for classification.
    """
    from transduce.data.binary import read_manifest

    prepared_labels(prepared_dir)  # (prepared for classification)
    manifest = read_manifest(prepared_dir)
    fields = manifest.get("inputs", {}).get("train", {}).get("fields")
    found: dict[str, Any] = {"max_len": manifest.get("options", {}).get("max_len", cfg.max_len)}
    if isinstance(fields, list) and len(fields) == 3:
        found.update(label_field=fields[0], text_field=fields[1], text2_field=fields[2])
    default = DataConfig()
    for name, value in found.items():
        given = getattr(cfg, name)
        if given != value and given != getattr(default, name):
            raise DataError(f"data.{name}: the config says {given!r}, the data in {prepared_dir} was prepared with "
                            f"{value!r}; leave data.{name} out (the prepared data sets it)")  # fmt: skip
    return cfg.replace(**found)


# ----------------------------------------------------------------------------------------------------------------------
# batches


@dataclass
class ClassBatch:
    """A classification batch: batch-first tensors, the texts right-padded with the pad id.

    Shape:
        src: ``(B, S)`` text ids + eos, S = longest text + 1.
        labels: ``(B,)`` class indices.
    """

    src: torch.Tensor
    labels: torch.Tensor
    n_src_tokens: int  # real text tokens (eos included, padding not)
    n_tgt_tokens: int  # examples: what the loss is normalised by (one label each)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ClassBatch:
        return ClassBatch(self.src.to(device, non_blocking=non_blocking),
                          self.labels.to(device, non_blocking=non_blocking), self.n_src_tokens,
                          self.n_tgt_tokens)  # fmt: skip

    def pin_memory(self) -> ClassBatch:
        return ClassBatch(self.src.pin_memory(), self.labels.pin_memory(), self.n_src_tokens, self.n_tgt_tokens)

    def __len__(self) -> int:
        return self.src.shape[0]


def collate_classes(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int = PAD_ID, eos_id: int = EOS_ID
) -> ClassBatch:
    """Pad ``(text ids, [class index])`` pairs (as :class:`~transduce.data.ParallelDataset` yields them for a
    classification split) into a :class:`ClassBatch`: text + eos, right-padded."""
    if not examples:
        raise ValueError("collate_classes: empty batch")
    src, n_src = _pad([np.asarray(s, dtype=np.int64) for s, _ in examples], pad_id, None, eos_id)
    labels = torch.tensor([int(t[0]) for _, t in examples], dtype=torch.long)
    return ClassBatch(torch.from_numpy(src), labels, n_src, len(examples))


def batch_sampler(
    dataset: ParallelDataset, max_tokens: int, *, cls: bool, seed: int, shuffle: bool = True, rank: int = 0,
    world_size: int = 1,
) -> TokenBatchSampler:  # fmt: skip
    """Length-grouped batches of a classification split under ``max_tokens`` (the ``<cls>`` position counted)."""
    return TokenBatchSampler(dataset.src_lengths + int(cls), dataset.tgt_lengths, max_tokens, seed=seed,
                             shuffle=shuffle, rank=rank, world_size=world_size)  # fmt: skip


__all__ = [
    "ClassBatch",
    "LabelledCorpus",
    "batch_sampler",
    "collate_classes",
    "corpora",
    "encode_texts",
    "fit_examples",
    "fit_pair",
    "prepare_classification",
    "prepared_data_config",
    "prepared_labels",
]
