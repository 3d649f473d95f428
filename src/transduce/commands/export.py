"""Write a trained model in another toolkit's format.

Examples:
  transduce export --format hf --model runs/multi30k_en_de -o models/en-de-hf      # MarianMTModel + MarianTokenizer
  transduce export --format ctranslate2 --model runs/multi30k_en_de -o models/en-de-ct2
  transduce export --format ctranslate2 --quantization int8 --model runs/multi30k_en_de -o models/en-de-ct2-int8

--model is a run directory (its best checkpoint), a checkpoint directory, or a Hugging Face Marian directory.
--format hf writes post-norm models as MarianMTModel and pre-norm ones as PegasusForConditionalGeneration, with the
tokenizer files (MarianTokenizer; AutoTokenizer loads them). Both need sinusoidal positions, and Pegasus one
vocabulary for both sides: other models are refused with the reason (CTranslate2 takes them all). Needs the
interop extra: pip install "transduce[interop]".
"""

from __future__ import annotations

import argparse

from transduce.commands.options import add_output_argument, model_and_output
from transduce.errors import InteropError
from transduce.files import Files
from transduce.interop.ctranslate2 import QUANTIZATIONS

#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model", "paths"), replaced=("output",))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="run directory, checkpoint, or Hugging Face Marian directory")
    add_output_argument(p, "output directory (created; must be empty unless --force)", metavar="DIR")
    p.add_argument("paths", nargs="*", help=argparse.SUPPRESS)  # the older spelling: SOURCE OUT_DIR
    formats = ("hf", "ctranslate2")
    p.add_argument("--format", required=True, choices=formats, help="hf: Hugging Face (Marian or Pegasus)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, help="CTranslate2 weight type (default: float32)")
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")


def run(args: argparse.Namespace) -> int:
    from transduce.interop import quiet_transformers

    source, out_dir = model_and_output(args, "the model to export")

    quiet_transformers()
    if args.format == "hf":
        if args.quantization:
            raise InteropError("--quantization applies to --format ctranslate2 only")
        from transduce.interop.marian import export_hf

        out = export_hf(source, out_dir, overwrite=args.force)
    else:
        from transduce.interop.ctranslate2 import export_ctranslate2

        out = export_ctranslate2(source, out_dir, quantization=args.quantization, overwrite=args.force)
    print(f"exported: {out}")
    return 0
