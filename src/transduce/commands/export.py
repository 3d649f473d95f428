"""Write a trained model in another toolkit's format.

Examples:
  transduce export --format hf runs/multi30k_en_de models/en-de-hf          # MarianMTModel + MarianTokenizer
  transduce export --format ctranslate2 runs/multi30k_en_de models/en-de-ct2
  transduce export --format ctranslate2 --quantization int8 runs/multi30k_en_de models/en-de-ct2-int8

SOURCE is a run directory (its best checkpoint), a checkpoint directory, or a Hugging Face Marian directory.
--format hf writes post-norm models as MarianMTModel and pre-norm ones as PegasusForConditionalGeneration, with the
tokenizer files (MarianTokenizer; AutoTokenizer loads them). Both need sinusoidal positions, and Pegasus one
vocabulary for both sides: other models are refused with the reason (CTranslate2 takes them all). Needs the
interop extra: pip install "transduce[interop]".
"""

from __future__ import annotations

import argparse

from transduce.errors import InteropError
from transduce.interop.ctranslate2 import QUANTIZATIONS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="run directory, checkpoint, or Hugging Face Marian directory")
    p.add_argument("out_dir", help="output directory (created; must be empty unless --force)")
    p.add_argument(
        "--format", required=True, choices=("hf", "ctranslate2"), help="hf: Hugging Face (Marian or Pegasus)"
    )
    p.add_argument("--quantization", choices=QUANTIZATIONS, help="CTranslate2 weight type (default: float32)")
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")


def run(args: argparse.Namespace) -> int:
    from transduce.interop import quiet_transformers

    quiet_transformers()
    if args.format == "hf":
        if args.quantization:
            raise InteropError("--quantization applies to --format ctranslate2 only")
        from transduce.interop.marian import export_hf

        out = export_hf(args.source, args.out_dir, overwrite=args.force)
    else:
        from transduce.interop.ctranslate2 import export_ctranslate2

        out = export_ctranslate2(args.source, args.out_dir, quantization=args.quantization, overwrite=args.force)
    print(f"exported: {out}")
    return 0
