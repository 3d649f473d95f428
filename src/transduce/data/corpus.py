"""A parallel corpus in the forms users have it: two files, a TSV file, or a JSON Lines file.

A corpus is named in the config (``data.train``, ``data.valid``, each entry of ``data.test``) by:

- a path prefix, ``data/train``: ``data/train.{src_lang}[.gz]`` and ``data/train.{tgt_lang}[.gz]``;
- two files, ``[train.src.txt, train.tgt.txt]`` (YAML list; ``--src-file``/``--tgt-file`` on the command line);
- one TSV file, ``train.tsv[.gz]``: ``source<TAB>target`` on every line, exactly one tab;
- one JSON Lines file, ``train.jsonl[.gz]``: an object per line with the source and target strings in the fields
  ``data.src_field`` and ``data.tgt_field`` (``src`` and ``tgt`` by default; ``translation.en`` reaches into a
  nested object, as in Hugging Face exports). Line breaks inside a value become spaces (one sentence, one line).

Whatever the form, :meth:`Corpus.pairs` yields ``(line number, source bytes, target bytes)`` and every structural
fault is a :class:`DataError` naming the file and line: a line without a tab, a line that is not JSON, a missing
field. Bytes that are not UTF-8 are left in place, for :func:`transduce.text.textio.decode_line`'s one rule.

With several target languages (``data.tgt_langs``, :mod:`transduce.text.langs`) every line also has a target language
(:meth:`Corpus.entries`): a prefix names one corpus per language (``PREFIX.en`` against ``PREFIX.de``,
``PREFIX.fr``, ...), two files take the language of the target file's suffix, a TSV line has it in a third column and
a JSON Lines line in ``data.lang_field``. :func:`resolve_corpora` gives a split's corpora, read one after the other
(:func:`split_entries`); a language that is missing, malformed or not one of ``data.tgt_langs`` is an error naming
the file and line.

:func:`read_side` reads one side of a test set in the same forms, for ``translate -i`` and ``evaluate --src/--ref``:
the file ``prepare`` reads serves them too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transduce.errors import DataError
from transduce.text.langs import LanguageError, check_code, forms, same_language
from transduce.text.textio import iter_raw_lines, iter_raw_pairs, resolve_corpus_file

FORMATS = ("files", "tsv", "jsonl")
SUFFIXES = {".tsv": "tsv", ".jsonl": "jsonl"}  # of single-file corpora, also with .gz after them
_LINE_BREAKS = str.maketrans({"\n": " ", "\r": " "})


@dataclass(frozen=True)
class Corpus:
    """One parallel corpus: its form, its file(s), and for JSON Lines the two fields.

    Attributes:
        format: ``"files"`` (two files, line by line), ``"tsv"`` or ``"jsonl"``.
        src, tgt: the files of the two sides; the same file for ``tsv`` and ``jsonl``.
        fields: (source field, target field) of ``jsonl``; dotted names reach into nested objects.
    """

    format: str
    src: Path
    tgt: Path
    fields: tuple[str, str] = ("src", "tgt")
    lang: str = ""  # the target language of every line (a prefix's or two files' corpus of a multilingual run)
    lang_field: str = ""  # each line names its target language: the JSON Lines field (TSV: the third column)

    @property
    def single_file(self) -> bool:
        return self.format != "files"

    def __str__(self) -> str:
        return str(self.src) if self.single_file else f"{self.src} and {self.tgt}"

    def name(self) -> str:
        """A split name for a test set: the file name without its corpus suffixes (``test2016.tsv.gz`` -> ``test2016``;
        two files: the source file's name without its last suffix)."""
        name = self.src.name.removesuffix(".gz")
        return name.rsplit(".", 1)[0] if "." in name else name

    def pairs(self) -> Iterator[tuple[int, bytes, bytes]]:
        """``(line number from 1, source bytes, target bytes)`` for every line.

        Raises:
            DataError: two files with different numbers of lines; a TSV line without exactly one tab (two with a
                language column); a JSON Lines line that is not an object with the string fields. The message names
                the file and line.
        """
        for lineno, src, tgt, _ in self.entries():
            yield lineno, src, tgt

    def entries(self) -> Iterator[tuple[int, bytes, bytes, str]]:
        """:meth:`pairs` with each line's target language (``""`` for a corpus of one target language), as it is
        written (checked by :func:`line_language`)."""
        if self.format == "files":
            for lineno, src, tgt in iter_raw_pairs(self.src, self.tgt):
                yield lineno, src, tgt, self.lang
        elif self.format == "tsv":
            for lineno, raw in enumerate(iter_raw_lines(self.src), start=1):
                if self.lang_field:
                    yield lineno, *split_tsv3(raw, self.src, lineno)
                else:
                    yield lineno, *split_tsv(raw, self.src, lineno), self.lang
        else:
            for lineno, raw in enumerate(iter_raw_lines(self.src), start=1):
                if self.lang_field:
                    yield lineno, *parse_jsonl3(raw, self.src, lineno, (*self.fields, self.lang_field))
                else:
                    yield lineno, *parse_jsonl(raw, self.src, lineno, self.fields), self.lang

    def record(self) -> dict[str, Any]:
        """How the corpus is read, for the prepared manifest (beside the files' descriptions)."""
        out: dict[str, Any] = {"format": self.format}
        if self.format == "jsonl":
            out["fields"] = list(self.fields)
        if self.lang:
            out["lang"] = self.lang
        if self.lang_field:
            out["lang_field"] = self.lang_field
        return out


def split_tsv(raw: bytes, path: str | Path, lineno: int) -> tuple[bytes, bytes]:
    """The two sides of a TSV line. Raises :class:`DataError` unless it holds exactly one tab."""
    tabs = raw.count(b"\t")
    if tabs != 1:
        found = "no tab" if tabs == 0 else f"{tabs} tabs"
        raise DataError(f"{path}, line {lineno}: expected source<TAB>target (one tab), found {found}")
    src, tgt = raw.split(b"\t")
    return src, tgt


def split_tsv3(raw: bytes, path: str | Path, lineno: int) -> tuple[bytes, bytes, str]:
    """The two sides and the target language of a TSV line ``source<TAB>target<TAB>language``."""
    tabs = raw.count(b"\t")
    if tabs != 2:
        found = "no tab" if tabs == 0 else f"{tabs} tab" + "s" * (tabs > 1)
        raise DataError(f"{path}, line {lineno}: expected source<TAB>target<TAB>language (two tabs: data.tgt_langs "
                        f"is set), found {found}")  # fmt: skip
    src, tgt, lang = raw.split(b"\t")
    return src, tgt, lang.decode("utf-8", "replace").strip()


def parse_jsonl3(raw: bytes, path: str | Path, lineno: int, fields: Sequence[str]) -> tuple[bytes, bytes, str]:
    """The two sides and the target language (the third field) of a JSON Lines line."""
    where = f"{path}, line {lineno}"
    obj = _json_object(raw, where)
    lang = _json_side(obj, fields[2], "target language", where)
    src, tgt = _json_side(obj, fields[0], "source", where), _json_side(obj, fields[1], "target", where)
    return src, tgt, lang.decode("utf-8", "replace").strip()  # (a bad byte: then not a code, refused naming the line)


def line_language(code: str, declared: Sequence[str], where: str) -> str:
    """The entry of ``declared`` (``data.tgt_langs``) that a line's language ``code`` names (``fr`` and ``fra`` are
    one language). Raises :class:`DataError` naming ``where`` (file and line) for a missing, malformed or
    undeclared language."""
    if not code:
        raise DataError(f"{where}: no target language (data.tgt_langs is set: each line names one of "
                        f"{', '.join(declared)})")  # fmt: skip
    try:
        bare = check_code(code, where)
    except LanguageError as e:
        raise DataError(str(e)) from None
    for lang in declared:
        if same_language(bare, lang):
            return lang
    raise DataError(f"{where}: target language {code!r} is not one of data.tgt_langs ({', '.join(declared)})")


def parse_jsonl(raw: bytes, path: str | Path, lineno: int, fields: Sequence[str]) -> tuple[bytes, bytes]:
    """The two sides of a JSON Lines line, as UTF-8 bytes (bad bytes kept as they were, see the module docstring).

    Raises:
        DataError: the line is not a JSON object, or a field is missing or not a string.
    """
    where = f"{path}, line {lineno}"
    obj = _json_object(raw, where)
    return _json_side(obj, fields[0], "source", where), _json_side(obj, fields[1], "target", where)


def jsonl_field(raw: bytes, path: str | Path, lineno: int, name: str, side: str) -> bytes:
    """One side (``"source"`` or ``"target"``) of a JSON Lines line: the field ``name``, as :func:`parse_jsonl`
    reads it (the other side's field need not be there)."""
    where = f"{path}, line {lineno}"
    return _json_side(_json_object(raw, where), name, side, where)


def _json_object(raw: bytes, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(raw.decode("utf-8", "surrogateescape"))  # a bad byte survives as a lone surrogate
    except json.JSONDecodeError as e:
        what = "an empty line" if not raw.strip() else f"{e.msg} at column {e.colno}"
        raise DataError(f"{where}: not valid JSON ({what}); JSON Lines needs one object per line") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {_json_type(obj)}")
    return obj


def _json_side(obj: dict[str, Any], name: str, side: str, where: str) -> bytes:
    value: Any = obj
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            keys = ", ".join(map(repr, value)) if isinstance(value, dict) else _json_type(value)
            option = {"source": "--src-field", "target": "--tgt-field"}.get(side, "data.lang_field")
            raise DataError(f"{where}: no field {name!r} for the {side} (found: {keys}); {option} names another")
        value = value[part]
    if not isinstance(value, str):
        raise DataError(f"{where}: field {name!r} must be a string, got {_json_type(value)}")
    try:
        return value.translate(_LINE_BREAKS).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise DataError(f"{where}: field {name!r} holds a lone surrogate escape (\\ud800-\\udfff)") from None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def corpus_format(spec: str | Sequence[str]) -> str:
    """The form a corpus entry names: ``"files"`` for a prefix or a pair of files, else ``"tsv"`` / ``"jsonl"``."""
    if not isinstance(spec, str):
        return "files"
    return SUFFIXES.get(Path(spec.removesuffix(".gz")).suffix, "files")


def resolve_corpus(spec: str | Sequence[str], src_lang: str, tgt_lang: str, fields: tuple[str, str]) -> Corpus:
    """The :class:`Corpus` a config entry names (see the module docstring).

    Raises:
        DataError: a file is missing, or a list does not hold exactly two files.
    """
    if not isinstance(spec, str):
        if len(spec) != 2:
            raise DataError(f"{list(spec)!r}: a corpus given as a list needs exactly two files (source, target)")
        paths = [Path(p) for p in spec]
        for path in paths:
            if not path.is_file():
                raise DataError(f"{path}: file not found")
        return Corpus("files", paths[0], paths[1])
    form = corpus_format(spec)
    if form == "files":
        return Corpus("files", resolve_corpus_file(spec, src_lang), resolve_corpus_file(spec, tgt_lang))
    path = Path(spec)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    return Corpus(form, path, path, fields if form == "jsonl" else ("src", "tgt"))


def resolve_corpora(
    spec: str | Sequence[str], src_lang: str, tgt_lang: str, fields: tuple[str, str], *,
    tgt_langs: Sequence[str] = (), lang_field: str = "tgt_lang",
) -> list[Corpus]:  # fmt: skip
    """The corpora of one split: :func:`resolve_corpus`'s one, or with several target languages (``tgt_langs``) a
    prefix's corpus for each language, two files with the target file's language, or a TSV or JSON Lines file whose
    lines name theirs (see the module docstring).

    Raises:
        DataError: a file is missing; two files whose target file's suffix names no language of ``tgt_langs``.
    """
    if not tgt_langs:
        return [resolve_corpus(spec, src_lang, tgt_lang, fields)]
    form = corpus_format(spec)
    if form != "files":
        return [dataclasses.replace(resolve_corpus(spec, src_lang, tgt_lang, fields), lang_field=lang_field)]
    if isinstance(spec, str):
        return [Corpus("files", resolve_corpus_file(spec, src_lang), language_file(spec, lang), lang=lang)
                for lang in tgt_langs]  # fmt: skip
    corpus = resolve_corpus(spec, src_lang, tgt_lang, fields)
    suffix = corpus.tgt.name.removesuffix(".gz").rpartition(".")[2]
    for lang in tgt_langs:
        if same_language(suffix, lang):
            return [dataclasses.replace(corpus, lang=lang)]
    raise DataError(f"{corpus.tgt}: the target file's suffix {suffix!r} names no language of data.tgt_langs "
                    f"({', '.join(tgt_langs)}); name the file after its language (train.{tgt_langs[0]})")  # fmt: skip


def language_file(prefix: str, lang: str) -> Path:
    """A prefix's target file for ``lang`` under either form of its code (``train.fr`` or ``train.fra``, each
    plain or gzipped).

    Raises:
        DataError: no form's file exists, or two do.
    """
    files = []
    for form in forms(lang):
        try:
            files.append(resolve_corpus_file(prefix, form))  # (the plain file before the gzipped one)
        except DataError:
            continue
    if not files:
        names = " or ".join(f"{prefix}.{form}" for form in forms(lang))
        raise DataError(f"{names}: file not found (nor with .gz), the target side for data.tgt_langs' {lang!r}")
    if len(files) > 1:
        raise DataError(f"{files[0]} and {files[1]} both hold the target side for {lang!r}: keep one")
    return files[0]


def split_entries(parts: Sequence[Corpus]) -> Iterator[tuple[int, bytes, bytes, str]]:
    """:meth:`Corpus.entries` of a split's corpora one after the other, numbered on (``line number``: 1 + the lines
    of the corpora before)."""
    offset = 0
    for part in parts:
        last = 0
        for lineno, src, tgt, lang in part.entries():
            yield offset + lineno, src, tgt, lang
            last = lineno
        offset += last


def split_name(spec: str | Sequence[str], corpus: Corpus) -> str:
    """The split name of a test corpus: a prefix's last component (``data/test_2016_flickr``), else the file's name
    without its corpus suffixes (see :meth:`Corpus.name`)."""
    return Path(spec).name if isinstance(spec, str) and not corpus.single_file else corpus.name()


def read_corpus(corpus: Corpus, *, errors: str = "strict") -> tuple[list[str], list[str]]:
    """Both sides of a corpus as text (for evaluation), every line kept.

    Args:
        errors: for bytes that are not UTF-8 (see :func:`transduce.text.textio.decode_line`; ``"skip"`` is not
            accepted here, as the sides must stay aligned).
    """
    from transduce.text.textio import decode_line

    if errors not in ("strict", "replace"):
        raise ValueError(f"errors must be 'strict' or 'replace', got {errors!r}")
    sources, targets = [], []
    for lineno, s, t in corpus.pairs():
        sources.append(decode_line(s, corpus.src, lineno, errors) or "")
        targets.append(decode_line(t, corpus.tgt, lineno, errors) or "")
    return sources, targets


def read_side(
    path: str | Path, side: str, field: str | None = None, *, errors: str = "strict", hint: str = ""
) -> Iterator[tuple[int, str]]:
    """One side of a test set as ``(line number, text)``, in whichever form :func:`corpus_format` tells by the name:
    every line of a plain text file (``"-"``: standard input); the source or target column of ``NAME.tsv[.gz]``; the
    field ``field`` of ``NAME.jsonl[.gz]`` (default ``src`` or ``tgt``). ``translate`` and ``evaluate`` read their
    inputs through it, so that the file ``prepare`` reads serves them too.

    Args:
        side: ``"source"`` or ``"target"``.
        errors, hint: for bytes that are not UTF-8 (see :func:`transduce.text.textio.read_lines`).

    Raises:
        DataError: naming the file and line: a TSV line without exactly one tab, a JSON Lines line that is not an
            object with the field, bytes that are not UTF-8 (strict).
    """
    from transduce.text.textio import decode_line, read_lines

    if side not in ("source", "target"):
        raise ValueError(f"side must be 'source' or 'target', got {side!r}")
    form = corpus_format(str(path))
    if form == "files":
        yield from read_lines(path, errors=errors, hint=hint)
        return
    name = field or ("src" if side == "source" else "tgt")
    for lineno, raw in enumerate(iter_raw_lines(path), start=1):
        if form == "tsv":
            raw = _test_tsv(raw, path, lineno)[0 if side == "source" else 1]
        else:
            raw = jsonl_field(raw, path, lineno, name, side)
        text = decode_line(raw, path, lineno, errors, hint=hint)
        if text is not None:
            yield lineno, text


def _test_tsv(raw: bytes, path: str | Path, lineno: int) -> list[bytes]:
    """The columns of a test file's TSV line: source<TAB>target, or source<TAB>target<TAB>language."""
    tabs = raw.count(b"\t")
    if tabs not in (1, 2):
        found = "no tab" if tabs == 0 else f"{tabs} tabs"
        raise DataError(f"{path}, line {lineno}: expected source<TAB>target (one tab), or source<TAB>target<TAB>"
                        f"language (two), found {found}")  # fmt: skip
    return raw.split(b"\t")


def read_languages(path: str | Path, field: str = "tgt_lang") -> dict[int, str]:
    """Each line's target language where a TSV or JSON Lines test file names one, by line number: the third column
    of ``NAME.tsv[.gz]`` (source<TAB>target<TAB>language, as ``prepare`` reads a multilingual corpus), the field
    ``field`` of ``NAME.jsonl[.gz]``. Empty when the file's first line names none (two columns; no such field);
    then no line may.

    Raises:
        DataError: naming the file and line: a line without the language when the first has one, or the reverse.
    """
    form = corpus_format(str(path))
    if form == "files" or str(path) == "-":
        return {}
    out: dict[int, str] = {}
    named = None
    for lineno, raw in enumerate(iter_raw_lines(path), start=1):
        where = f"{path}, line {lineno}"
        if form == "tsv":
            columns = _test_tsv(raw, path, lineno)
            lang = columns[2] if len(columns) == 3 else None
        else:
            obj = _json_object(raw, where)
            lang = _json_side(obj, field, "target language", where) if field in obj else None
        if named is None:
            named = lang is not None
        if named != (lang is not None):
            what = "a third column" if form == "tsv" else f"the field {field!r}"
            state = "no target language" if named else "a target language"
            raise DataError(f"{where}: {state} ({what}) where line 1 names {'one' if named else 'none'}: name every "
                            "line's target language or none")  # fmt: skip
        if lang is not None:
            out[lineno] = lang.decode("utf-8", "replace").strip()
    return out


def corpus_of_record(record: dict[str, Any]) -> Corpus:
    """The :class:`Corpus` a prepared manifest's ``inputs[split]`` entry describes (older manifests: two files)."""
    fields = tuple(record.get("fields", ("src", "tgt")))
    return Corpus(record.get("format", "files"), Path(record["src"]["path"]), Path(record["tgt"]["path"]), fields,
                  lang=record.get("lang", ""), lang_field=record.get("lang_field", ""))  # fmt: skip


def corpora_of_record(record: dict[str, Any]) -> list[Corpus]:
    """The corpora of a split as the manifest describes them: ``parts`` (several target languages' files) or one."""
    return [corpus_of_record(part) for part in record.get("parts", [record])]


__all__ = [
    "FORMATS",
    "Corpus",
    "corpora_of_record",
    "corpus_format",
    "corpus_of_record",
    "jsonl_field",
    "line_language",
    "parse_jsonl",
    "read_corpus",
    "read_side",
    "resolve_corpora",
    "resolve_corpus",
    "split_entries",
    "split_name",
    "split_tsv",
]
