"""Turn raw parallel text into a subword vocabulary and a cleaned, binarised corpus for training.

Examples:
  transduce prepare --src-lang en --tgt-lang de --train data/multi30k/train --valid data/multi30k/val \\
      --test data/multi30k/test_2016_flickr --output prepared/multi30k --vocab-size 8000
  transduce prepare --train corpus/train.tsv --valid corpus/valid.tsv -o prepared/mine
  transduce prepare --train corpus/train.jsonl --src-field translation.en --tgt-field translation.de -o prepared/hf
  transduce prepare --src-file corpus/train.source --tgt-file corpus/train.target -o prepared/two-files
  transduce prepare --config configs/multi30k_en_de.yaml -o prepared/multi30k data.lowercase=true
  transduce prepare --task classify --train reviews/train.tsv --valid reviews/valid.tsv -o prepared/reviews
  transduce prepare --task mlm --train corpus/wiki.txt.gz --valid corpus/valid.txt -o prepared/mlm --vocab-size 8000
  transduce prepare --task mlm --train data/multi30k/train --src-lang en --vocabulary runs/multi30k_en_de -o prepared/m

A corpus (--train, --valid, --test) is a path prefix (--train data/train with --src-lang en reads data/train.en or
data/train.en.gz, and data/train.de[.gz]), a TSV file (NAME.tsv[.gz]: source<TAB>target), or a JSON Lines file
(NAME.jsonl[.gz]: {"src": ..., "tgt": ...} per line; --src-field/--tgt-field name other fields). --src-file and
--tgt-file give the training corpus as two files of any names. With --task classify a corpus is a TSV file of
label<TAB>text lines or a JSON Lines file (--text-field, --label-field; docs/transfer.md); with --task mlm it is raw
text, one text per line: a FILE.txt[.gz] or a prefix's --src-lang side, encoded with a learned vocabulary or that of
--vocabulary (docs/transfer.md). A --config whose train.init_from names a pretrained run or model is encoded with
that model's vocabulary (extended as train.extend_vocab says), as `transduce train` encodes it, so that train reuses the
directory. Options on the command line override the config file, and dotted KEY=VALUE overrides override both.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

from transduce.commands.options import (
    add_output_argument,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
)
from transduce.config import Config, ConfigError, DataConfig
from transduce.data import prepare
from transduce.files import Files
from transduce.training import finetune

log = logging.getLogger(__name__)

# command-line flag -> DataConfig field, for the flags that take a value
_VALUE_FLAGS = {
    "src_lang": "src_lang",
    "tgt_lang": "tgt_lang",
    "train": "train",
    "valid": "valid",
    "src_field": "src_field",
    "tgt_field": "tgt_field",
    "task": "task",
    "text_field": "text_field",
    "text2_field": "text2_field",
    "label_field": "label_field",
    "vocabulary": "vocabulary",
    "vocab_size": "vocab_size",
    "vocab_type": "vocab_type",
    "max_len": "max_len",
    "max_len_ratio": "max_len_ratio",
    "input_sentence_size": "input_sentence_size",
    "character_coverage": "character_coverage",
    "workers": "workers",
}
# command-line switch -> (DataConfig field, value when given)
_SWITCHES = {
    "separate_vocab": ("joint_vocab", False),
    "lowercase": ("lowercase", True),
    "dedup": ("dedup", True),
    "skip_invalid_utf8": ("skip_invalid_utf8", True),
}


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data options shared by ``prepare`` and ``train``; every one defaults to the config (file or built-in)."""
    g = parser.add_argument_group("data (default: the config's data section)")
    g.add_argument("--src-lang", metavar="LANG", help="source language suffix of a prefix's files")
    g.add_argument("--tgt-lang", metavar="LANG", help="target language suffix of a prefix's files")
    g.add_argument("--train", metavar="CORPUS", help="training corpus: PREFIX, FILE.tsv or FILE.jsonl (.gz too)")
    g.add_argument("--src-file", metavar="FILE", help="training corpus as two files: the source side ...")
    g.add_argument("--tgt-file", metavar="FILE", help="... and the target side, line by line")
    g.add_argument("--valid", metavar="CORPUS", help="validation corpus (every line kept)")
    g.add_argument("--test", metavar="CORPUS", action="append", help="a test corpus (repeatable; every line kept)")
    g.add_argument("--src-field", metavar="NAME", help="JSON Lines: field of the source (default: src; a.b nests)")
    g.add_argument("--tgt-field", metavar="NAME", help="JSON Lines: field of the target (default: tgt)")
    g.add_argument("--task", choices=("translate", "parse", "classify", "mlm"), help="data.task: what the corpora hold")
    g.add_argument("--text-field", metavar="NAME", help="classify, JSON Lines: field of the text (default: text)")
    g.add_argument("--text2-field", metavar="NAME", help="classify: field of a second text (sentence pairs)")
    g.add_argument("--label-field", metavar="NAME", help="classify, JSON Lines: field of the label (default: label)")
    g.add_argument("--vocab-size", type=positive_int, metavar="N", help="subword vocabulary size")
    g.add_argument("--vocabulary", metavar="PATH", help="mlm: encode with this run's, checkpoint's, prepared "
                   "directory's or SentencePiece .model file's vocabulary instead of learning one")  # fmt: skip
    g.add_argument("--vocab-type", choices=("bpe", "unigram"), help="SentencePiece model type")
    g.add_argument("--separate-vocab", action="store_true", help="separate source and target vocabularies")
    g.add_argument("--lowercase", action="store_true", help="lowercase both sides (also at translation)")
    g.add_argument("--max-len", type=positive_int, metavar="N", help="drop training pairs longer than N tokens")
    g.add_argument(
        "--max-len-ratio", type=positive_float, metavar="R", help="drop training pairs with a length ratio > R"
    )
    g.add_argument("--input-sentence-size", type=positive_int, metavar="N", help="sentences sampled for the vocabulary")
    g.add_argument("--character-coverage", type=probability, metavar="C", help="SentencePiece character coverage")
    g.add_argument("--dedup", action="store_true", help="drop exact duplicate training pairs")
    g.add_argument("--skip-invalid-utf8", action="store_true", help="skip (and count) pairs that are not UTF-8")
    g.add_argument("--workers", type=non_negative_int, metavar="N", help="encoding processes (0: all cores)")


def data_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The data fields the command line sets (``{}`` when no data option was given)."""
    data: dict[str, Any] = {key: getattr(args, flag) for flag, key in _VALUE_FLAGS.items()}
    data = {key: value for key, value in data.items() if value is not None}
    if (args.src_file is None) != (args.tgt_file is None):
        raise ConfigError("--src-file and --tgt-file go together (the two sides of the training corpus)")
    if args.src_file is not None:
        if args.train is not None:
            raise ConfigError("give the training corpus once: --train CORPUS or --src-file and --tgt-file")
        data["train"] = [args.src_file, args.tgt_file]
    if args.test:
        data["test"] = args.test
    for flag, (key, value) in _SWITCHES.items():
        if getattr(args, flag):
            data[key] = value
    return data


#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("config", "train", "valid", "test", "src_file", "tgt_file", "vocabulary"), replaced=("output",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``transduce prepare``."""
    parser.add_argument("--config", metavar="YAML", help="run configuration; its data section is used")
    add_output_argument(parser, "the prepared directory (default: data.prepared)", metavar="DIR")
    parser.add_argument("--force", action="store_true", help="rebuild even if DIR already holds this preparation")
    add_data_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides (data.max_len=100)")


def run_config(args: argparse.Namespace) -> Config:
    """The :class:`Config` described by the parsed arguments (config file, then flags, then overrides)."""
    options = {"data": data_flags(args)}
    if args.config:
        return Config.load(args.config, args.overrides, options=options)
    return Config.resolve({}, args.overrides, options=options)


def data_config(args: argparse.Namespace) -> DataConfig:
    """The :class:`DataConfig` described by the parsed arguments (config file, then flags, then overrides)."""
    return run_config(args).data


def run(args: argparse.Namespace) -> int:
    config = run_config(args)
    cfg = config.data
    out = args.output or cfg.prepared
    if not out:
        raise ConfigError("no output directory: pass --output DIR or set data.prepared")
    from transduce.files import directories_removed_on_failure

    with directories_removed_on_failure(out), tempfile.TemporaryDirectory(prefix="transduce-vocab-") as tmp:
        # a config that starts from another run (train.init_from) is encoded with that run's vocabulary, extended
        # as train.extend_vocab says, exactly as `transduce train` encodes it: train then reuses this directory
        vocabulary = finetune.vocabulary(config, Path(tmp), resume=False) if config.train.init_from else None
        manifest = prepare(cfg, out, force=args.force, vocabulary=vocabulary)
    train = manifest["splits"]["train"]
    log.info("%s: %d training pairs, vocabulary %s", out, train["pairs"], manifest["tokenizer"]["src_vocab_size"])
    return 0
