"""The command line's contract, verb by verb: bad input of every kind is refused with exit status 2 and exactly one
line on standard error, ``transduce VERB: ...`` naming what was wrong, without a traceback, before any file is
created or changed; Ctrl-C exits with 130 and one line, leaving no partial output; and input that is unusual but
valid (Windows line ends, a 100,000-character line) is handled as documented.

The verbs come from the CLI's own parser, so a new verb without rows here fails
:func:`test_every_verb_has_contract_rows`. The CLI runs in-process through ``main(argv)``, with its log lines
written to standard error as ``transduce`` writes them, so they count; one real Ctrl-C runs in a subprocess.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from classifykit import make_classifier_checkpoint
from decodekit import one_thread
from transduce.cli import build_parser, main


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


@dataclass(frozen=True)
class Files:
    """The inputs of the rows: good ones and bad ones of every kind, in one directory (``root``)."""

    root: Path
    model: Path  # a standalone checkpoint (a random test-preset model with a real vocabulary)
    classifier: Path  # a random test-preset classifier over the same vocabulary (data.task: classify)

    @property
    def missing(self) -> Path:
        return self.root / "missing.txt"

    @property
    def empty(self) -> Path:
        return self.root / "empty.txt"

    @property
    def dir(self) -> Path:
        return self.root / "adir"

    @property
    def binary(self) -> Path:
        return self.root / "picture.txt"

    @property
    def crlf(self) -> Path:
        return self.root / "crlf.txt"

    @property
    def long(self) -> Path:
        return self.root / "long.txt"

    @property
    def good(self) -> Path:
        return self.root / "good.txt"

    @property
    def ref(self) -> Path:
        return self.root / "ref.txt"

    @property
    def tsv(self) -> Path:
        return self.root / "good.tsv"

    def texts(self, name: str) -> Path:
        """A classifier's input: ``blank.txt`` (an empty second line), ``nofield.jsonl`` (a line without "text"),
        ``notjson.jsonl`` (a line that is not JSON)."""
        return self.root / "classify" / name

    def out(self, name: str = "out.txt") -> Path:
        return self.root / "new" / name


LONG_LINE = "a " * 50_000  # 100,000 characters
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00" * 64


@pytest.fixture(scope="module")
def files(tmp_path_factory, checkpoint) -> Files:
    root = tmp_path_factory.mktemp("contract")
    f = Files(root, checkpoint, make_classifier_checkpoint(root / "classifier", checkpoint / "vocab"))
    f.texts("").mkdir()
    f.texts("blank.txt").write_text("a man rides\n\nthe dog\n", encoding="utf-8")
    f.texts("nofield.jsonl").write_text('{"text": "a man rides"}\n{"sentence": "the dog"}\n', encoding="utf-8")
    f.texts("notjson.jsonl").write_text('{"text": "a man rides"}\nthe dog\n', encoding="utf-8")
    f.empty.write_bytes(b"")
    f.dir.mkdir()
    f.binary.write_bytes(BINARY)
    f.crlf.write_bytes(b"a man rides\r\nthe dog\r\n")
    f.long.write_text(LONG_LINE + "\n", encoding="utf-8")
    f.good.write_text("a man rides\nthe dog\n", encoding="utf-8")
    f.ref.write_text("a man rides\nthe dog\n", encoding="utf-8")
    f.tsv.write_text("a man rides\tein Mann fährt\nthe dog\tder Hund\n", encoding="utf-8")
    (root / "langs.tsv").write_text("a man rides\tein Mann fährt\tde\nthe dog\tle chien\tfr\n", encoding="utf-8")
    (root / "half.tsv").write_text("a man rides\tein Mann fährt\tde\nthe dog\tder Hund\n", encoding="utf-8")
    (root / "empty.tsv").write_bytes(b"")
    (root / "v.pieces.json").write_text("a man rides\n", encoding="utf-8")  # a text input named as an npy sidecar
    (root / "picture.tsv").write_bytes(BINARY)
    (root / "run").mkdir()
    (root / "run" / "config.yaml").write_bytes(BINARY)
    (root / "crlf.yaml").write_bytes(b"train:\r\n  max_stpes: 3\r\n")
    (root / "long.yaml").write_text(f"# {LONG_LINE}\ntrain:\n  max_stpes: 3\n", encoding="utf-8")
    return f


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file and directory under ``roots``, with a digest of each file's bytes."""
    seen = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            seen[str(path)] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (capsys replaces it for each test)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


@pytest.fixture
def cli(capsys, files):
    """``cli(argv) -> (code, stdout, stderr lines)``: ``main(argv)`` with the CLI's log lines on standard error."""
    root = logging.getLogger()
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)

    def run(argv: list[str]) -> tuple[int, str, list[str]]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's errors
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err.splitlines()

    yield run
    root.removeHandler(handler)
    root.setLevel(level)


# ----------------------------------------------------------------------------------------------------------------------
# the rows: (verb, kind, argv, what the one line says after "transduce VERB: ")

Argv = Callable[[Files], list]


@dataclass(frozen=True)
class Row:
    verb: str
    kind: str
    argv: Argv  # the arguments after the verb
    message: Callable[[Files], str]  # the whole line after "transduce VERB: "

    def __str__(self) -> str:
        return f"{self.verb}-{self.kind}"


def refused(verb: str, kind: str, argv: Argv, message: Callable[[Files], str] | str) -> Row:
    return Row(verb, kind, argv, message if callable(message) else lambda f, m=message: m)


def unknown_flag(verb: str, argv: Argv) -> Row:
    return refused(
        verb, "unknown-flag", lambda f: [*argv(f), "--no-such-flag"], "unrecognized arguments: --no-such-flag"
    )


def not_utf8(path: Path, hint: str = "") -> str:
    return f"error: {path}, line 1: not valid UTF-8 (byte 0x89 at column 1)" + (f"; {hint}" if hint else "")


TRANSLATE = "use --replace-invalid to translate it with U+FFFD in place"
EMBED = "use --replace-invalid to embed it with U+FFFD in place"
SCORED = "every file scored or translated must be UTF-8"
PREPARED = "--skip-invalid-utf8 (data.skip_invalid_utf8) skips such pairs"
SAME = "refusing to overwrite an input"
NO_MODEL = "no such checkpoint or run directory"
NOT_MODEL = "neither a checkpoint (no model.safetensors) nor a run directory (no checkpoints/)"
NOT_MARIAN = "not a Hugging Face Marian model (no config.json with model_type 'marian')"
REPLACE_FILE = "exists and is not a directory; refusing to replace a file"
NOT_YAML = "not a UTF-8 text file (byte 1), so not a YAML config"
IS_DIR_CONFIG = "is a directory, not a config file (to continue a training run: transduce train --resume DIR)"
NO_CONFIG = "config file not found"
MISTYPED_KEY = "unknown key 'train.max_stpes'; did you mean 'train.max_steps'? ..."  # (valid keys: ...)


def translate(f: Files, *more) -> list:
    return ["--model", f.model, *more]


def embed(f: Files, *more) -> list:
    return ["--model", f.model, "-o", f.out("v.npz"), *more]


def classify(f: Files, *more) -> list:
    return ["--model", f.classifier, *more]


def evaluate(f: Files, *more) -> list:
    return ["--ref", f.ref, *more]


def parse(f: Files, *more) -> list:
    return ["--baseline", "right-branching", *more]


def prepare(f: Files, *more) -> list:
    return ["-o", f.out("prepared"), *more]


def train(f: Files, *more) -> list:
    return [*more, "-o", f.out("run")] if more and str(more[0]).startswith("-") else [*more]


ROWS = [
    # translate: -i FILE, the model, the options
    refused("translate", "missing-file", lambda f: translate(f, "-i", f.missing),
            lambda f: f"error: {f.missing}: file not found"),
    refused("translate", "empty-file", lambda f: translate(f, "-i", f.empty),
            lambda f: f"error: {f.empty}: the file is empty: no lines to translate"),
    refused("translate", "directory", lambda f: translate(f, "-i", f.dir),
            lambda f: f"error: {f.dir}: is a directory, not a text file"),
    refused("translate", "binary", lambda f: translate(f, "-i", f.binary), lambda f: not_utf8(f.binary, TRANSLATE)),
    refused("translate", "missing-model", lambda f: ["--model", f.missing, "-i", f.good],
            lambda f: f"error: {f.missing}: {NO_MODEL}"),
    refused("translate", "file-as-model", lambda f: ["--model", f.good, "-i", f.good],
            lambda f: f"error: {f.good}: {NOT_MODEL}"),
    refused("translate", "out-of-range", lambda f: translate(f, "--beam", "0"), "--beam must be >= 1 (got 0)"),
    refused("translate", "malformed-tgt-lang", lambda f: translate(f, "-i", f.good, "--tgt-lang", "French"),
            "--tgt-lang must be a language code: ISO 639-1 or 639-3, 2 or 3 lowercase letters, optionally _Script, "
            "e.g. fr, fra, zho_Hans (got 'French')"),
    refused("translate", "tgt-lang-of-one-language-model", lambda f: translate(f, "-i", f.good, "--tgt-lang", "fr"),
            "error: tgt_lang: 'fr': this model has no target-language tokens (it writes one language); leave the "
            "target language out"),
    refused("translate", "languages-for-one-language-model", lambda f: translate(f, "-i", f.root / "langs.tsv"),
            lambda f: f"error: {f.root / 'langs.tsv'}, line 1: 'de': this model has no target-language tokens (it "
            "writes one language); leave the target language out"),
    refused("translate", "line-without-its-language", lambda f: translate(f, "-i", f.root / "half.tsv"),
            lambda f: f"error: {f.root / 'half.tsv'}, line 2: no target language (a third column) where line 1 names "
            "one: name every line's target language or none"),
    refused("translate", "out-of-range-threads", lambda f: translate(f, "--threads", "-1"),
            "--threads must be >= 0 (got -1)"),
    refused("translate", "out-of-range-length", lambda f: translate(f, "--max-len-b", "-1"),
            "--max-len-b must be >= 0 (got -1)"),
    refused("translate", "output-is-input", lambda f: translate(f, "-i", f.good, "-o", f.good),
            lambda f: f"error: -o/--output {f.good} is the same file as -i/--input {f.good}: {SAME}"),
    refused("translate", "output-is-directory", lambda f: translate(f, "-i", f.good, "-o", f.dir),
            lambda f: f"error: -o/--output {f.dir}: is a directory; give a file name"),
    refused("translate", "classifier", lambda f: ["--model", f.classifier, "-i", f.good],
            lambda f: f"error: {f.classifier} is a classifier (data.task: classify): use transduce classify (in "
            "Python: transduce.Classifier.load); this command takes a translation model"),
    unknown_flag("translate", lambda f: translate(f, "-i", f.good)),
    # classify: --model, -i FILE (text, TSV, JSON Lines), -o
    refused("classify", "missing-file", lambda f: classify(f, "-i", f.missing),
            lambda f: f"error: {f.missing}: file not found"),
    refused("classify", "empty-file", lambda f: classify(f, "-i", f.empty),
            lambda f: f"error: {f.empty}: the file is empty: no lines to classify"),
    refused("classify", "directory", lambda f: classify(f, "-i", f.dir),
            lambda f: f"error: {f.dir}: is a directory, not a text file"),
    refused("classify", "binary", lambda f: classify(f, "-i", f.binary), lambda f: not_utf8(f.binary)),
    refused("classify", "missing-model", lambda f: ["--model", f.missing, "-i", f.good],
            lambda f: f"error: {f.missing}: {NO_MODEL}"),
    refused("classify", "translation-model", lambda f: ["--model", f.model, "-i", f.good],
            lambda f: f"error: {f.model} is not a classifier (data.task: translate): use transduce translate"),
    refused("classify", "empty-text", lambda f: classify(f, "-i", f.texts("blank.txt"), "-o", f.out()),
            lambda f: f"error: {f.texts('blank.txt')}, line 2: empty text"),
    refused("classify", "jsonl-without-field", lambda f: classify(f, "-i", f.texts("nofield.jsonl"), "-o", f.out()),
            lambda f: f"error: {f.texts('nofield.jsonl')}, line 2: no field 'text' (found: 'sentence'); --text-field "
            "names another"),
    refused("classify", "jsonl-not-json", lambda f: classify(f, "-i", f.texts("notjson.jsonl")),
            lambda f: f"error: {f.texts('notjson.jsonl')}, line 2: not valid JSON (Expecting value at column 1); "
            "JSON Lines needs one object per line"),
    refused("classify", "tsv-without-tab", lambda f: classify(f, "-i", f.good, "--format", "tsv"),
            lambda f: f"error: {f.good}, line 1: expected label<TAB>text (one tab), found no tab"),
    refused("classify", "field-of-text", lambda f: classify(f, "-i", f.good, "--text-field", "body"),
            lambda f: f"error: --text-field names a field of a JSON Lines input (FILE.jsonl or --format jsonl), not "
            f"of {f.good}"),
    refused("classify", "second-text-of-single", lambda f: classify(f, "-i", f.texts("nofield.jsonl"),
            "--text2-field", "b"),
            "error: --text2-field: this classifier reads single texts (it was trained without data.text2_field)"),
    refused("classify", "out-of-range", lambda f: classify(f, "-i", f.good, "--batch-size", "0"),
            "--batch-size must be >= 1 (got 0)"),
    refused("classify", "bad-choice", lambda f: classify(f, "-i", f.good, "--format", "csv"),
            "--format: invalid choice: 'csv' (choose from 'text', 'tsv', 'jsonl')"),
    refused("classify", "output-is-input", lambda f: classify(f, "-i", f.good, "-o", f.good),
            lambda f: f"error: -o/--output {f.good} is the same file as -i/--input {f.good}: {SAME}"),
    refused("classify", "output-is-directory", lambda f: classify(f, "-i", f.good, "-o", f.dir),
            lambda f: f"error: -o/--output {f.dir}: is a directory; give a file name"),
    unknown_flag("classify", lambda f: classify(f, "-i", f.good)),
    # evaluate: --hyp, --ref, --src
    refused("evaluate", "missing-file", lambda f: evaluate(f, "--hyp", f.missing),
            lambda f: f"error: {f.missing}: file not found"),
    refused("evaluate", "empty-file", lambda f: evaluate(f, "--hyp", f.empty),
            lambda f: f"error: {f.empty} vs {f.ref}: 0 hypotheses but 2 references; the files must have one line each "
            "per sentence, so nothing was scored"),
    refused("evaluate", "empty-references", lambda f: ["--hyp", f.good, "--ref", f.empty],
            lambda f: f"error: {f.good} vs {f.empty}: 2 hypotheses but 0 references; the files must have one line "
            "each per sentence, so nothing was scored"),
    refused("evaluate", "directory", lambda f: evaluate(f, "--hyp", f.dir),
            lambda f: f"error: {f.dir}: is a directory, not a text file"),
    refused("evaluate", "binary", lambda f: evaluate(f, "--hyp", f.binary), lambda f: not_utf8(f.binary, SCORED)),
    refused("evaluate", "binary-source", lambda f: evaluate(f, "--model", f.model, "--src", f.binary),
            lambda f: not_utf8(f.binary, SCORED)),
    refused("evaluate", "out-of-range", lambda f: evaluate(f, "--hyp", f.good, "--beam", "0"),
            "--beam must be >= 1 (got 0)"),
    refused("evaluate", "output-is-input", lambda f: evaluate(f, "--model", f.model, "--src", f.good, "-o", f.ref),
            lambda f: f"error: -o/--output {f.ref} is the same file as --ref {f.ref}: {SAME}"),
    refused("evaluate", "languages-for-one-language-model",
            lambda f: ["--model", f.model, "--src", f.root / "langs.tsv", "-o", f.out()],
            lambda f: f"error: {f.root / 'langs.tsv'}, line 1: 'de': this model has no target-language tokens (it "
            "writes one language); leave the target language out"),
    refused("evaluate", "search-option-without-translation", lambda f: evaluate(f, "--hyp", f.good, "--tgt-lang", "fr"),
            "error: --tgt-lang applies to translating --src; with --hyp nothing is translated"),
    refused("evaluate", "output-without-translation", lambda f: evaluate(f, "--hyp", f.good, "-o", f.out()),
            "error: -o/--output writes the translations of --src; with --hyp nothing is translated"),
    refused("evaluate", "classifier-without-src", lambda f: classify(f),
            lambda f: f"error: {f.classifier} is a classifier: give --src FILE.tsv (label<TAB>text) or FILE.jsonl, "
            "the labelled examples to score it on"),
    refused("evaluate", "classifier-on-text", lambda f: classify(f, "--src", f.good),
            lambda f: f"error: {f.good}: a classifier is evaluated on labelled examples: FILE.tsv (label<TAB>text) or "
            "FILE.jsonl (or --format tsv / jsonl)"),
    refused("evaluate", "classifier-unknown-label", lambda f: classify(f, "--src", f.tsv, "-o", f.out()),
            lambda f: f"error: {f.tsv}, line 1: label 'a man rides' is not one of the classifier's labels (neg, pos)"),
    refused("evaluate", "classifier-decoding", lambda f: classify(f, "--src", f.tsv, "--beam", "2"),
            lambda f: f"error: --beam applies to translation; {f.classifier} is a classifier, scored on the labels of "
            "--src"),
    refused("evaluate", "format-for-translation", lambda f: evaluate(f, "--model", f.model, "--src", f.good,
            "--format", "tsv"),
            "error: --format reads a classifier's examples; this evaluation translates"),
    unknown_flag("evaluate", lambda f: evaluate(f, "--hyp", f.good)),
    # parse: -i FILE, --treebank, -o, --scores (the right-branching baseline needs no model)
    refused("parse", "missing-file", lambda f: parse(f, "-i", f.missing),
            lambda f: f"error: {f.missing}: file not found"),
    refused("parse", "empty-file", lambda f: parse(f, "-i", f.empty),
            lambda f: f"error: {f.empty}: the file is empty: no lines to parse"),
    refused("parse", "directory", lambda f: parse(f, "-i", f.dir),
            lambda f: f"error: {f.dir}: is a directory, not a text file"),
    refused("parse", "binary", lambda f: parse(f, "-i", f.binary), lambda f: not_utf8(f.binary)),
    refused("parse", "long-line", lambda f: parse(f, "-i", f.long),
            lambda f: f"error: {f.long}, line 1: 50,000 words, more than --max-words 400"),
    refused("parse", "empty-treebank", lambda f: parse(f, "--treebank", f.empty),
            lambda f: f"error: {f.empty}: no trees to parse"),
    refused("parse", "translation-model", lambda f: ["--model", f.model, "-i", f.good],
            lambda f: f"error: {f.model}: the model was trained with data.task: translate: parsing needs a model "
            "trained with data.task: parse"),
    refused("parse", "out-of-range", lambda f: parse(f, "-i", f.good, "--max-words", "0"),
            "--max-words must be >= 1 (got 0)"),
    refused("parse", "output-is-input", lambda f: parse(f, "-i", f.good, "-o", f.good),
            lambda f: f"error: -o/--output {f.good} is the same file as -i/--input {f.good}: {SAME}"),
    refused("parse", "output-is-directory", lambda f: parse(f, "-i", f.good, "-o", f.dir),
            lambda f: f"error: -o/--output {f.dir}: is a directory; give a file name"),
    unknown_flag("parse", lambda f: parse(f, "-i", f.good)),
    # prepare: --train CORPUS, --config YAML, -o DIR
    refused("prepare", "missing-file", lambda f: prepare(f, "--train", f.root / "missing.tsv"),
            lambda f: f"error: {f.root / 'missing.tsv'}: file not found (data.train)"),
    refused("prepare", "empty-file", lambda f: prepare(f, "--train", f.root / "empty.tsv"),
            lambda f: f"error: {f.root / 'empty.tsv'}: no sentence pairs with text on both sides (0 lines)"),
    refused("prepare", "binary", lambda f: prepare(f, "--train", f.root / "picture.tsv"),
            lambda f: not_utf8(f.root / "picture.tsv", PREPARED)),
    refused("prepare", "missing-config", lambda f: prepare(f, "--config", f.missing),
            lambda f: f"error: {f.missing}: {NO_CONFIG}"),
    refused("prepare", "directory", lambda f: prepare(f, "--config", f.dir),
            lambda f: f"error: {f.dir}: {IS_DIR_CONFIG}"),
    refused("prepare", "binary-config", lambda f: prepare(f, "--config", f.binary),
            lambda f: f"error: {f.binary}: {NOT_YAML}"),
    refused("prepare", "out-of-range", lambda f: prepare(f, "--train", f.tsv, "--vocab-size", "0"),
            "--vocab-size must be >= 1 (got 0)"),
    refused("prepare", "output-is-input", lambda f: ["--train", f.tsv, "-o", f.tsv],
            lambda f: f"error: -o/--output {f.tsv} is the same file as --train {f.tsv}: {SAME}"),
    refused("prepare", "tsv-without-language", lambda f: prepare(f, "--train", f.tsv, "data.tgt_langs=[de,fr]"),
            lambda f: f"error: {f.tsv}, line 1: expected source<TAB>target<TAB>language (two tabs: data.tgt_langs is "
            "set), found 1 tab"),
    # prepare --task mlm: raw text, one text per line, and a vocabulary to take (--vocabulary)
    refused("prepare", "mlm-missing-file", lambda f: prepare(f, "--task", "mlm", "--train", f.missing),
            lambda f: f"error: {f.missing}: file not found (data.train)"),
    refused("prepare", "mlm-empty-file", lambda f: prepare(f, "--task", "mlm", "--train", f.empty),
            lambda f: f"error: {f.empty}: no texts (the file is empty)"),
    refused("prepare", "mlm-binary", lambda f: prepare(f, "--task", "mlm", "--train", f.binary),
            lambda f: not_utf8(f.binary)),
    refused("prepare", "mlm-missing-vocabulary",
            lambda f: prepare(f, "--task", "mlm", "--train", f.good, "--vocabulary", f.root / "missing"),
            lambda f: f"error: {f.root / 'missing'}: not found (data.vocabulary)"),
    unknown_flag("prepare", lambda f: prepare(f, "--train", f.tsv)),
    # train: CONFIG.yaml, --train CORPUS, -o DIR
    refused("train", "missing-file", lambda f: train(f, f.missing), lambda f: f"error: {f.missing}: {NO_CONFIG}"),
    refused("train", "empty-file", lambda f: train(f, f.empty),
            "error: no data: set data.train (raw text) or data.prepared (a prepared directory, runs/default/data has "
            "none)"),
    refused("train", "directory", lambda f: train(f, f.dir), lambda f: f"error: {f.dir}: {IS_DIR_CONFIG}"),
    refused("train", "binary", lambda f: train(f, f.binary), lambda f: f"error: {f.binary}: {NOT_YAML}"),
    refused("train", "crlf", lambda f: train(f, f.root / "crlf.yaml"),  # read as YAML: the key is found and named
            lambda f: f"error: {f.root / 'crlf.yaml'}: {MISTYPED_KEY}"),
    refused("train", "long-line", lambda f: train(f, f.root / "long.yaml"),
            lambda f: f"error: {f.root / 'long.yaml'}: {MISTYPED_KEY}"),
    refused("train", "missing-corpus", lambda f: train(f, "--preset", "test", "--train", f.root / "missing.tsv"),
            lambda f: f"error: {f.root / 'missing.tsv'}: file not found (data.train)"),
    refused("train", "out-of-range", lambda f: train(f, "--preset", "test", "--train", f.tsv, "--max-len", "0"),
            "--max-len must be >= 1 (got 0)"),
    refused("train", "output-is-input", lambda f: ["--preset", "test", "--train", f.tsv, "-o", f.tsv],
            lambda f: f"error: -o/--output {f.tsv} is the same file as --train {f.tsv}: {SAME}"),
    refused("train", "output-is-file", lambda f: ["--preset", "test", "--train", f.tsv, "-o", f.good],
            lambda f: f"error: -o/--output {f.good}: {REPLACE_FILE}"),
    refused("train", "resume-missing", lambda f: ["--resume", f.missing],
            lambda f: f"error: {f.missing}: not a run directory (no config.yaml)"),
    refused("train", "mlm-init-from",
            lambda f: train(f, "--preset", "test", "--task", "mlm", "--train", f.good, "--init-from", f.model),
            lambda f: f"error: command-line override 'train.init_from={f.model}': train.init_from: not available for "
            "data.task: mlm (a masked language model is pretrained from scratch; data.vocabulary takes a run's "
            "vocabulary)"),
    refused("train", "bad-choice", lambda f: train(f, "--preset", "test", "--train", f.tsv, "train.warmup_by=wall"),
            "error: command-line override 'train.warmup_by=wall': train.warmup_by: 'wall' is not one of 'steps', "
            "'time'"),
    refused("train", "inconsistent-schedule",
            lambda f: train(f, "--preset", "test", "--train", f.tsv, "train.warmup_by=time"),
            "error: command-line override 'train.warmup_by=time': train.warmup_by: time scales the warmup with the "
            "updates that fit into max_minutes, so it needs decay_by: time (got decay_by 'steps')"),
    unknown_flag("train", lambda f: train(f, "--preset", "test", "--train", f.tsv)),
    # average: --model RUN_DIR --last N, or checkpoints -o DIR
    refused("average", "missing-file", lambda f: ["--model", f.missing, "--last", "2"],
            lambda f: f"error: {f.missing}: no checkpoints in {f.missing / 'checkpoints'}"),
    refused("average", "directory", lambda f: ["--model", f.dir, "--last", "2"],
            lambda f: f"error: {f.dir}: no checkpoints in {f.dir / 'checkpoints'}"),
    refused("average", "file-as-model", lambda f: ["--model", f.good, "-o", f.out("avg")],
            lambda f: f"error: {f.good}: {NOT_MODEL}"),
    refused("average", "out-of-range", lambda f: ["--model", f.model, "--last", "0"], "--last must be >= 1 (got 0)"),
    refused("average", "output-is-input", lambda f: ["--model", f.model, "-o", f.model],
            lambda f: f"error: -o/--output {f.model} is the same file as --model {f.model}: {SAME}"),
    refused("average", "output-is-file", lambda f: ["--model", f.model, "-o", f.good],
            lambda f: f"error: -o/--output {f.good}: {REPLACE_FILE}"),
    unknown_flag("average", lambda f: ["--model", f.model, "-o", f.out("avg")]),
    # report: RUN_DIR
    refused("report", "missing-file", lambda f: [f.missing],
            lambda f: f"error: {f.missing}: not a run directory (no config.yaml)"),
    refused("report", "directory", lambda f: [f.dir],
            lambda f: f"error: {f.dir}: not a run directory (no config.yaml)"),
    refused("report", "file-as-run", lambda f: [f.good],
            lambda f: f"error: {f.good}: not a run directory (no config.yaml)"),
    refused("report", "binary", lambda f: [f.root / "run"],
            lambda f: f"error: {f.root / 'run' / 'config.yaml'}: {NOT_YAML}"),
    refused("report", "out-of-range", lambda f: [f.root / "run", "--beam", "0"], "--beam must be >= 1 (got 0)"),
    unknown_flag("report", lambda f: [f.root / "run"]),
    # export: --model PATH -o DIR --format
    refused("export", "missing-file", lambda f: ["--format", "hf", "--model", f.missing, "-o", f.out("hf")],
            lambda f: f"error: {f.missing}: {NO_MODEL}"),
    refused("export", "directory", lambda f: ["--format", "hf", "--model", f.dir, "-o", f.out("hf")],
            lambda f: f"error: {f.dir}: {NOT_MODEL}"),
    refused("export", "file-as-model", lambda f: ["--format", "hf", "--model", f.good, "-o", f.out("hf")],
            lambda f: f"error: {f.good}: {NOT_MODEL}"),
    refused("export", "bad-choice", lambda f: ["--format", "onnx", "--model", f.model, "-o", f.out("hf")],
            "--format: invalid choice: 'onnx' (choose from 'hf', 'ctranslate2')"),
    refused("export", "output-is-input", lambda f: ["--format", "hf", "--model", f.model, "-o", f.model],
            lambda f: f"error: -o/--output {f.model} is the same file as --model {f.model}: {SAME}"),
    refused("export", "output-is-file", lambda f: ["--format", "hf", "--model", f.model, "-o", f.good],
            lambda f: f"error: -o/--output {f.good}: {REPLACE_FILE}"),
    unknown_flag("export", lambda f: ["--format", "hf", "--model", f.model, "-o", f.out("hf")]),
    # import-hf: --model HF_DIR -o DIR
    refused("import-hf", "missing-file", lambda f: ["--model", f.missing, "-o", f.out("ck")],
            lambda f: f"error: {f.missing}: {NOT_MARIAN}"),
    refused("import-hf", "directory", lambda f: ["--model", f.dir, "-o", f.out("ck")],
            lambda f: f"error: {f.dir}: {NOT_MARIAN}"),
    refused("import-hf", "file-as-model", lambda f: ["--model", f.good, "-o", f.out("ck")],
            lambda f: f"error: {f.good}: {NOT_MARIAN}"),
    refused("import-hf", "output-is-input", lambda f: ["--model", f.dir, "-o", f.dir],
            lambda f: f"error: -o/--output {f.dir} is the same file as --model {f.dir}: {SAME}"),
    refused("import-hf", "output-is-file", lambda f: ["--model", f.dir, "-o", f.good],
            lambda f: f"error: -o/--output {f.good}: {REPLACE_FILE}"),
    unknown_flag("import-hf", lambda f: ["--model", f.dir, "-o", f.out("ck")]),
    # serve: --model, --port, the limits (never started: every row fails before listening)
    refused("serve", "missing-file", lambda f: ["--model", f.missing, "--port", "0"],
            lambda f: f"error: {f.missing}: {NO_MODEL}"),
    refused("serve", "directory", lambda f: ["--model", f.dir, "--port", "0"],
            lambda f: f"error: {f.dir}: {NOT_MODEL}"),
    refused("serve", "file-as-model", lambda f: ["--model", f.good, "--port", "0"],
            lambda f: f"error: {f.good}: {NOT_MODEL}"),
    refused("serve", "out-of-range", lambda f: ["--model", f.model, "--port", "70000"],
            "--port must be between 0 and 65535 (got 70000)"),
    refused("serve", "out-of-range-negative", lambda f: ["--model", f.model, "--port", "-1"],
            "--port must be between 0 and 65535 (got -1)"),
    refused("serve", "out-of-range-limit", lambda f: ["--model", f.model, "--max-sentences", "0"],
            "--max-sentences must be >= 1 (got 0)"),
    refused("serve", "classifier-decoding", lambda f: ["--model", f.classifier, "--port", "0", "--beam", "2"],
            lambda f: f"error: --beam applies to translation; {f.classifier} is a classifier"),
    unknown_flag("serve", lambda f: ["--model", f.model]),
    # attention: --model, --src TEXT, -o FILE.png
    refused("attention", "missing-file", lambda f: ["--model", f.missing, "--src", "a man", "-o", f.out("a.png")],
            lambda f: f"error: {f.missing}: {NO_MODEL}"),
    refused("attention", "empty-sentence", lambda f: ["--model", f.model, "--src", " ", "-o", f.out("a.png")],
            "error: --src is empty; give the sentence to draw"),
    refused("attention", "long-line", lambda f: ["--model", f.model, "--src", LONG_LINE, "-o", f.out("a.png")],
            "error: --src: 100,000 characters, more than 1,000: attention is drawn for one sentence"),
    refused("attention", "output-is-directory", lambda f: ["--model", f.model, "--src", "a man", "-o", f.dir],
            lambda f: f"error: -o/--output {f.dir}: is a directory; give a file name"),
    refused("attention", "output-not-png", lambda f: ["--model", f.model, "--src", "a man", "-o", f.out("a.txt")],
            lambda f: f"error: -o/--output {f.out('a.txt')}: the pictures are PNG files; give a name ending in .png"),
    refused("attention", "out-of-range", lambda f: ["--model", f.model, "--src", "a", "-o", f.out("a.png"),
            "--beam", "0"],
            "--beam must be >= 1 (got 0)"),
    unknown_flag("attention", lambda f: ["--model", f.model, "--src", "a", "-o", f.out("a.png")]),
    # embed: --model, -i FILE, -o FILE.npz|.npy|.safetensors, --format
    refused("embed", "missing-file", lambda f: embed(f, "-i", f.missing),
            lambda f: f"error: {f.missing}: file not found"),
    refused("embed", "empty-file", lambda f: embed(f, "-i", f.empty),
            lambda f: f"error: {f.empty}: the file is empty: no lines to embed"),
    refused("embed", "directory", lambda f: embed(f, "-i", f.dir),
            lambda f: f"error: {f.dir}: is a directory, not a text file"),
    refused("embed", "binary", lambda f: embed(f, "-i", f.binary), lambda f: not_utf8(f.binary, EMBED)),
    refused("embed", "missing-model", lambda f: ["--model", f.missing, "-i", f.good, "-o", f.out("v.npz")],
            lambda f: f"error: {f.missing}: {NO_MODEL}"),
    refused("embed", "ensemble", lambda f: embed(f, "--model", f.model, "-i", f.good),
            "error: embed reads one model's encoder: give one --model, not 2"),
    refused("embed", "out-of-range", lambda f: embed(f, "-i", f.good, "--max-tokens", "0"),
            "--max-tokens must be >= 1 (got 0)"),
    refused("embed", "output-is-input", lambda f: ["--model", f.model, "-i", f.good, "-o", f.good],
            lambda f: f"error: -o/--output {f.good} is the same file as -i/--input {f.good}: {SAME}"),
    refused("embed", "sidecar-is-input", lambda f: ["--model", f.model, "-i", f.root / "v.pieces.json", "-o",
            f.root / "v.npy"],
            lambda f: f"error: -o/--output {f.root / 'v.pieces.json'} is the same file as -i/--input "
            f"{f.root / 'v.pieces.json'}: {SAME}"),
    refused("embed", "output-is-directory", lambda f: ["--model", f.model, "-i", f.good, "-o", f.dir],
            lambda f: f"error: -o/--output {f.dir}: is a directory; give a file name"),
    refused("embed", "unknown-format", lambda f: ["--model", f.model, "-i", f.good, "-o", f.out("v.txt")],
            lambda f: f"error: -o/--output {f.out('v.txt')}: unknown format '.txt'; give a name ending in .npz, .npy "
            "or .safetensors, or --format"),
    refused("embed", "format-contradicts-name", lambda f: embed(f, "-i", f.good, "--format", "npy"),
            lambda f: f"error: -o/--output {f.out('v.npz')} is named as npz but --format is npy"),
    refused("embed", "bad-choice", lambda f: embed(f, "-i", f.good, "--format", "csv"),
            "--format: invalid choice: 'csv' (choose from 'npz', 'npy', 'safetensors')"),
    unknown_flag("embed", lambda f: embed(f, "-i", f.good)),
    # download: DATASET DIRECTORY (nothing is fetched: every row fails first)
    refused("download", "output-is-file", lambda f: ["multi30k", f.good],
            lambda f: f"error: directory {f.good}: {REPLACE_FILE}"),
    refused("download", "bad-choice", lambda f: ["wmt14", f.out("dl")],
            "dataset: invalid choice: 'wmt14' (choose from 'multi30k', 'ptb-sample')"),
    refused("download", "bad-language", lambda f: ["multi30k", f.out("dl"), "--langs", "en,xx"],
            "error: Multi30k has no language xx (valid: en, de, fr, cs)"),
    unknown_flag("download", lambda f: ["multi30k", f.out("dl")]),
    # quickstart: -o DIR and the sizes
    refused("quickstart", "output-is-file", lambda f: ["-o", f.good],
            lambda f: f"error: -o/--output {f.good}: {REPLACE_FILE}"),
    refused("quickstart", "out-of-range", lambda f: ["-o", f.out("qs"), "--minutes", "0"],
            "--minutes must be > 0 (got 0)"),
    refused("quickstart", "out-of-range-pairs", lambda f: ["-o", f.out("qs"), "--train-pairs", "0"],
            "--train-pairs must be >= 1 (got 0)"),
    unknown_flag("quickstart", lambda f: ["-o", f.out("qs")]),
]  # fmt: skip


def parser_verbs() -> set[str]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_every_verb_has_contract_rows():
    """A verb added to the CLI needs its rows here: at least an unknown option, and bad input of its kind."""
    kinds: dict[str, set[str]] = {}
    for row in ROWS:
        kinds.setdefault(row.verb, set()).add(row.kind.split("-")[0] if row.kind.startswith("out-of") else row.kind)
    assert set(kinds) == parser_verbs()
    for verb, seen in kinds.items():
        assert "unknown-flag" in seen and len(seen) >= 3, verb
    assert len({str(row) for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_bad_input_is_refused_in_one_line_and_changes_nothing(row, files, cli):
    argv = [row.verb, *row.argv(files)]
    before = snapshot(files.root, files.model)
    code, out, err = cli(argv)
    assert code == 2, (argv, err)
    expected = f"transduce {row.verb}: {row.message(files)}"
    if expected.endswith(" ..."):  # a message that goes on (a list of valid keys)
        assert len(err) == 1 and err[0].startswith(expected[:-4]), err
    else:
        assert err == [expected]
    assert snapshot(files.root, files.model) == before  # nothing created, nothing changed
    assert "Traceback" not in out


def test_a_port_in_use_is_refused_in_one_line(files, cli):
    pytest.importorskip("uvicorn")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = cli(["serve", "--model", files.model, "--port", port])
    assert code == 2
    assert err == [f"transduce serve: error: cannot listen on 127.0.0.1:{port}: the port is in use (another "
                   "server?); choose another with --port"]  # fmt: skip


def test_a_port_taken_after_the_check_is_still_one_error_line_not_an_exit_from_uvicorn(files, cli, monkeypatch):
    pytest.importorskip("uvicorn")
    import transduce.commands.serve

    monkeypatch.setattr(transduce.commands.serve, "check_address", lambda host, port: None)  # taken meanwhile
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = cli(["serve", "--model", files.model, "--port", port, "-q"])
    assert code == 2
    assert err[-1] == (f"transduce serve: error: cannot listen on 127.0.0.1:{port}: the server did not start (the log "
                       "above says why)")  # fmt: skip
    assert not any("Traceback" in line for line in err)


# ----------------------------------------------------------------------------------------------------------------------
# unusual but valid input


def test_windows_line_ends_are_read_as_line_ends(files, cli):
    out = files.root / "crlf.out"
    try:
        code, _, err = cli(["translate", "--model", files.model, "-i", files.crlf, "-o", out, "--beam", "1"])
        err = [line for line in err if "transduce.model.kernels" not in line]  # a first use builds the kernels
        assert code == 0 and len(err) == 2  # "loaded ..." and "translated 2 lines"
        assert out.read_bytes().count(b"\n") == 2 and b"\r" not in out.read_bytes()
        code, stdout, _ = cli(["evaluate", "--hyp", files.crlf, "--ref", files.ref, "--json"])
        assert code == 0 and '"chrf": 100.0' in stdout  # equal to the references (too short for BLEU's 4-grams)
        trees = files.root / "crlf.trees"
        code, _, _ = cli(["parse", "--baseline", "right-branching", "-i", files.crlf, "-o", trees])
        assert code == 0
        assert trees.read_text(encoding="utf-8") == "(S (XX a) (VP (XX man) (XX rides)))\n(S (XX the) (XX dog))\n"
    finally:
        out.unlink(missing_ok=True)
        (files.root / "crlf.trees").unlink(missing_ok=True)


def test_a_100000_character_line_is_translated_in_pieces_with_a_warning(files, cli):
    out = files.root / "long.out"
    try:
        argv = ["translate", "--model", files.model, "-i", files.long, "-o", out, "--beam", "1", "--max-len-a", "0",
                "--max-len-b", "1"]  # fmt: skip
        code, _, err = cli(argv)
        assert code == 0
        assert any(
            "line 1: 50000 source tokens exceed max_input_tokens=1024; translated in 49 pieces" in e for e in err
        )
        assert out.read_text(encoding="utf-8").count("\n") == 1
        code, stdout, _ = cli(["evaluate", "--hyp", files.long, "--ref", files.long, "--json"])
        assert code == 0 and '"bleu": 100.0' in stdout
    finally:
        out.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------------------------
# Ctrl-C: exit status 130, one line, no partial output


def interrupt_when(monkeypatch, target: str) -> None:
    """Deliver a real SIGINT to this process when ``target`` (``module:attribute``) is called, mid-way."""
    module, _, name = target.partition(":")
    owner = __import__(module, fromlist=["_"])
    for part in name.split(".")[:-1]:
        owner = getattr(owner, part)
    original = getattr(owner, name.split(".")[-1])

    def interrupted(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # Python's handler raises KeyboardInterrupt here
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name.split(".")[-1], interrupted)


@pytest.mark.parametrize(
    ("target", "argv"),
    [
        ("transduce.search.translator:Translator.translate_lines",
         lambda f: ["evaluate", "--model", f.model, "--src", f.good, "--ref", f.ref, "-o", f.out()]),
        ("transduce.parsing.pcfg:right_branching",
         lambda f: ["parse", "--baseline", "right-branching", "-i", f.good, "-o", f.out()]),
        ("transduce.text.tokenizer:Tokenizer.train", lambda f: ["prepare", "--train", f.tsv, "-o", f.out("prepared")]),
        ("transduce.training.quickstart:write_corpus", lambda f: ["quickstart", "-o", f.out("qs")]),
        # embed: while the file is written (under its temporary name, in a directory made for it)
        ("transduce.transfer.embed:_write_npz",
         lambda f: ["embed", "--model", f.model, "-i", f.good, "-o", f.out("v.npz")]),
    ],
    ids=["evaluate", "parse", "prepare", "quickstart", "embed"],
)  # fmt: skip
def test_ctrl_c_mid_way_exits_130_in_one_line_leaving_nothing(files, cli, monkeypatch, target, argv):
    interrupt_when(monkeypatch, target)
    before = snapshot(files.root, files.model)
    args = argv(files)
    code, _, err = cli(args)
    assert code == 130
    assert err[-1] == f"transduce {args[0]}: interrupted"
    assert snapshot(files.root, files.model) == before


def test_ctrl_c_before_the_verb_runs_exits_130_in_one_line(cli, monkeypatch):
    """Ctrl-C while the command line is still being read (the parser built, modules loaded): the same exit status
    and one line, which names no verb."""
    interrupt_when(monkeypatch, "transduce.cli:build_parser")
    code, _, err = cli(["translate", "--model", "m"])
    assert code == 130 and err == ["transduce: interrupted"]


def test_ctrl_c_during_quickstart_training_stops_it(files, cli, monkeypatch):
    """Training takes Ctrl-C itself (a checkpoint, then exit 130): the quickstart stops there instead of going on to
    evaluate a model it did not finish, and removes the directory it made."""
    import transduce.training.train

    original = transduce.training.train._Signals.__enter__

    def enter(self):
        entered = original(self)
        signal.raise_signal(signal.SIGINT)  # the loop stops after its first update
        return entered

    monkeypatch.setattr(transduce.training.train._Signals, "__enter__", enter)
    before = snapshot(files.root, files.model)
    code, _, err = cli(["quickstart", "-o", files.out("qs"), "--train-pairs", "200", "--test-pairs", "20"])
    assert code == 130 and err[-1] == "transduce quickstart: interrupted"
    assert snapshot(files.root, files.model) == before


def test_a_real_ctrl_c_ends_translate_with_one_line(files, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("a man rides the bike\n" * 3000, encoding="utf-8")
    argv = [sys.executable, "-m", "transduce.cli", "translate", "-q", "--model", str(files.model), "-i", str(big),
            "--threads", "1", "--max-len-a", "0", "--max-len-b", "100", "--interactive"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSDUCE_KERNELS": "0"}  # no kernel build to wait for or report
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not proc.stdout.read1(1):  # the first translation: the model is translating
            assert time.monotonic() < deadline and proc.poll() is None
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert err.decode() == "transduce translate: interrupted\n"
