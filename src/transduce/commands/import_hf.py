"""Convert a Hugging Face Marian model directory (for example a downloaded Helsinki-NLP/opus-mt-* model) into a
standalone transduce checkpoint: weights, config and the Marian vocabulary.

Examples:
  transduce import-hf --model ~/models/opus-mt-en-de -o models/opus-en-de
  transduce translate --model models/opus-en-de < input.txt

``transduce translate``, ``evaluate``, ``attention`` and ``serve`` also read a Marian directory directly; importing
makes a checkpoint that loads without transformers' model code and is verified by checksums.
"""

from __future__ import annotations

import argparse

from transduce.commands.options import add_output_argument, model_and_output
from transduce.files import Files

#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model", "paths"), replaced=("output",))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", metavar="DIR", help="a local Hugging Face Marian model directory (config.json, weights, vocab)"
    )
    add_output_argument(p, "output checkpoint directory (created; must be empty unless --force)", metavar="DIR")
    p.add_argument("paths", nargs="*", help=argparse.SUPPRESS)  # the older spelling: DIRECTORY OUT_DIR
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")


def run(args: argparse.Namespace) -> int:
    from transduce.interop import quiet_transformers

    source, out_dir = model_and_output(args, "the Hugging Face Marian directory")
    quiet_transformers()
    from transduce.interop.marian import import_hf

    print(f"imported: {import_hf(source, out_dir, overwrite=args.force)}")
    return 0
