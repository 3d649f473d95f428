"""The texts ``transduce classify`` labels and the labelled examples ``transduce evaluate`` scores a classifier on.

An input is read in one of three forms, by ``--format`` or else by its name:

- ``text`` (any other name, and standard input): a text on every line; for a classifier of sentence pairs,
  ``text<TAB>text2`` (exactly one tab);
- ``tsv`` (``NAME.tsv[.gz]``): the classifier's training data form, ``label<TAB>text`` (``label<TAB>text<TAB>text2``
  for pairs); classify ignores the label column, evaluate scores against it;
- ``jsonl`` (``NAME.jsonl[.gz]``): an object per line, the text in ``text_field`` (and ``text2_field`` for pairs);
  the label in ``label_field`` for evaluate only. The fields default to the run's ``data.*_field``.

TSV and JSON Lines lines are read by :class:`transduce.transfer.classify.data.LabelledCorpus`, the rules ``prepare``
follows, so every fault is the same one-line :class:`~transduce.errors.DataError` naming the file and line: a missing
tab or field, bytes that are not UTF-8, an empty text; and for evaluate, an empty label or one the classifier does not
know.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from transduce.data.corpus import corpus_format
from transduce.errors import DataError
from transduce.text.textio import decode_line, iter_raw_lines
from transduce.transfer.classify.data import LabelledCorpus

FORMATS = ("text", "tsv", "jsonl")


@dataclass(frozen=True)
class Fields:
    """Where a classifier's inputs are in a line.

    Attributes:
        text, text2, label: JSON Lines field names (dotted names reach into nested objects).
        pairs: whether each example is a pair of texts (the classifier was trained with ``data.text2_field``).
    """

    text: str = "text"
    text2: str = ""
    label: str = "label"
    pairs: bool = False


def input_format(path: str, given: str | None = None) -> str:
    """The form to read ``path`` in: ``given`` (``--format``), else ``tsv`` / ``jsonl`` by the name's suffix (also
    before ``.gz``), else ``text``."""
    if given is not None:
        if given not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {given!r}")
        return given
    form = corpus_format(str(path))
    return form if form in ("tsv", "jsonl") else "text"


def read_texts(path: str | Path, form: str, fields: Fields) -> Iterator[tuple[int, str, str | None]]:
    """``(line number from 1, text, second text or None)`` for every line of ``path`` (``"-"``: standard input).

    Raises:
        DataError: naming the file and line (see the module docstring).
    """
    if form == "text":
        yield from _plain_texts(path, fields.pairs)
        return
    for lineno, _, text, text2 in _corpus(path, form, fields, labelled=False).examples():
        yield lineno, text, text2


def read_labelled(
    path: str | Path, form: str, fields: Fields, labels: list[str]
) -> Iterator[tuple[int, str, str, str | None]]:
    """``(line number from 1, label, text, second text or None)`` for every line of a TSV or JSON Lines file.

    Raises:
        DataError: naming the file and line (see the module docstring), a plain text file (it has no labels), or
            a label not in ``labels`` (the classifier's).
    """
    if form == "text":
        raise DataError(f"{path}: a classifier is evaluated on labelled examples: FILE.tsv (label<TAB>text) or "
                        "FILE.jsonl (or --format tsv / jsonl)")  # fmt: skip
    known = set(labels)
    for lineno, label, text, text2 in _corpus(path, form, fields, labelled=True).examples():
        assert label is not None
        if label not in known:
            raise DataError(f"{path}, line {lineno}: label {label!r} is not one of the classifier's labels "
                            f"({', '.join(labels)})")  # fmt: skip
        yield lineno, label, text, text2


def _corpus(path: str | Path, form: str, fields: Fields, *, labelled: bool) -> LabelledCorpus:
    text2 = (fields.text2 or "text2") if fields.pairs else ""  # (TSV: any name marks pairs)
    return LabelledCorpus(Path(path), form, fields.label, fields.text, text2, labelled=labelled)


def _plain_texts(path: str | Path, pairs: bool) -> Iterator[tuple[int, str, str | None]]:
    for lineno, raw in enumerate(iter_raw_lines(path), start=1):
        line = decode_line(raw, path, lineno) or ""
        where = f"{path}, line {lineno}"
        text, text2 = line, None
        if pairs:
            parts = line.split("\t")
            if len(parts) != 2:
                found = "no tab" if len(parts) == 1 else f"{len(parts) - 1} tabs"
                raise DataError(f"{where}: expected text<TAB>text2 (one tab: the classifier reads sentence pairs), "
                                f"found {found}")  # fmt: skip
            text, text2 = parts
        for what, value in (("text", text), ("second text", text2)):
            if value is not None and not value.strip():
                raise DataError(f"{where}: empty {what}")
        yield lineno, text, text2


__all__ = ["FORMATS", "Fields", "input_format", "read_labelled", "read_texts"]
