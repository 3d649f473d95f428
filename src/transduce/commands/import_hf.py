"""Convert a Hugging Face Marian model directory (for example a downloaded Helsinki-NLP/opus-mt-* model) into a
standalone transduce checkpoint: weights, config and the Marian vocabulary.

Examples:
  transduce import-hf ~/models/opus-mt-en-de models/opus-en-de
  transduce translate --model models/opus-en-de < input.txt

``transduce translate``, ``evaluate``, ``attention`` and ``serve`` also read a Marian directory directly; importing
makes a checkpoint that loads without transformers' model code and is verified by checksums.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", help="a local Hugging Face Marian model directory (config.json, weights, vocab)")
    p.add_argument("out_dir", help="output checkpoint directory (created; must be empty unless --force)")
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")


def run(args: argparse.Namespace) -> int:
    from transduce.interop import quiet_transformers

    quiet_transformers()
    from transduce.interop.marian import import_hf

    print(f"imported: {import_hf(args.directory, args.out_dir, overwrite=args.force)}")
    return 0
