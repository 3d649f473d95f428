"""Turn raw parallel text into a subword vocabulary and a cleaned, binarised corpus for training.

Examples:
  transduce prepare --src-lang en --tgt-lang de --train data/multi30k/train --valid data/multi30k/val \\
      --test data/multi30k/test_2016_flickr --out prepared/multi30k --vocab-size 8000
  transduce prepare --config configs/multi30k_en_de.yaml --out prepared/multi30k data.lowercase=true

A corpus is a path prefix: --train data/train with --src-lang en reads data/train.en or data/train.en.gz.
Options on the command line override the config file; dotted KEY=VALUE overrides are applied to the file.
"""

from __future__ import annotations

import argparse
import logging

from transduce.config import Config, ConfigError, DataConfig, apply_overrides
from transduce.data import prepare

log = logging.getLogger(__name__)

# command-line flag -> DataConfig field, for the flags that take a value
_VALUE_FLAGS = {
    "src_lang": "src_lang",
    "tgt_lang": "tgt_lang",
    "train": "train",
    "valid": "valid",
    "vocab_size": "vocab_size",
    "vocab_type": "vocab_type",
    "max_len": "max_len",
    "max_len_ratio": "max_len_ratio",
    "input_sentence_size": "input_sentence_size",
    "character_coverage": "character_coverage",
    "workers": "workers",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``transduce prepare``; every one defaults to the config (file or built-in defaults)."""
    parser.add_argument("--config", metavar="YAML", help="run configuration; its data section is used")
    parser.add_argument("--src-lang", metavar="LANG", help="source language suffix of the raw files")
    parser.add_argument("--tgt-lang", metavar="LANG", help="target language suffix of the raw files")
    parser.add_argument("--train", metavar="PREFIX", help="training corpus: PREFIX.SRC[.gz] and PREFIX.TGT[.gz]")
    parser.add_argument("--valid", metavar="PREFIX", help="validation corpus (every line kept)")
    parser.add_argument("--test", metavar="PREFIX", action="append", help="a test corpus (repeatable; every line kept)")
    parser.add_argument("--out", metavar="DIR", help="the prepared directory (default: data.prepared)")
    parser.add_argument("--vocab-size", type=int, metavar="N", help="subword vocabulary size")
    parser.add_argument("--vocab-type", choices=("bpe", "unigram"), help="SentencePiece model type")
    parser.add_argument("--separate-vocab", action="store_true", help="separate source and target vocabularies")
    parser.add_argument("--lowercase", action="store_true", help="lowercase both sides (also at translation)")
    parser.add_argument("--max-len", type=int, metavar="N", help="drop training pairs longer than N tokens")
    parser.add_argument("--max-len-ratio", type=float, metavar="R", help="drop training pairs with a length ratio > R")
    parser.add_argument("--input-sentence-size", type=int, metavar="N", help="sentences sampled for the vocabulary")
    parser.add_argument("--character-coverage", type=float, metavar="C", help="SentencePiece character coverage")
    parser.add_argument("--dedup", action="store_true", help="drop exact duplicate training pairs")
    parser.add_argument("--skip-invalid-utf8", action="store_true", help="skip (and count) pairs that are not UTF-8")
    parser.add_argument("--workers", type=int, metavar="N", help="encoding processes (0: all cores)")
    parser.add_argument("--force", action="store_true", help="rebuild even if DIR already holds this preparation")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides (data.max_len=100)")


def data_config(args: argparse.Namespace) -> DataConfig:
    """The :class:`DataConfig` described by the parsed arguments (config file, then overrides, then flags)."""
    if args.config:
        data = Config.load(args.config, args.overrides).data.to_dict()
    else:
        data = Config.from_dict(apply_overrides({}, args.overrides)).data.to_dict()
    for flag, key in _VALUE_FLAGS.items():
        if getattr(args, flag) is not None:
            data[key] = getattr(args, flag)
    if args.test:
        data["test"] = args.test
    for flag, key, value in (
        ("separate_vocab", "joint_vocab", False),
        ("lowercase", "lowercase", True),
        ("dedup", "dedup", True),
        ("skip_invalid_utf8", "skip_invalid_utf8", True),
    ):
        if getattr(args, flag):
            data[key] = value
    try:
        return DataConfig.from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"data.{e}") from None


def run(args: argparse.Namespace) -> int:
    cfg = data_config(args)
    out = args.out or cfg.prepared
    if not out:
        raise ConfigError("no output directory: pass --out DIR or set data.prepared")
    manifest = prepare(cfg, out, force=args.force)
    train = manifest["splits"]["train"]
    log.info("%s: %d training pairs, vocabulary %s", out, train["pairs"], manifest["tokenizer"]["src_vocab_size"])
    return 0
