"""Draw the attention of a trained model on one sentence: heatmaps per layer and head, and averaged, with the
subword pieces on the axes.

Examples:
  transduce attention --model runs/multi30k --src "A man rides a bike." -o attention.png
  transduce attention --model runs/multi30k --src "A dog." --tgt "Ein Hund." --output dog.png --self

Without --tgt the model's own translation is used; for a parsing model (data.task: parse) its parse, decoded as
`transduce parse` decodes (the constrained search, the paper's beam 21 unless --beam is given). The
encoder-decoder attention goes to --output (row: the target piece being predicted; column: the source piece);
--self also writes the encoder and decoder self-attention to OUTPUT.encoder.png and OUTPUT.decoder.png.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from transduce.commands.options import add_output_argument, check_file_output
from transduce.commands.translate import add_model_arguments, decode_config, load_translator
from transduce.errors import TransduceError
from transduce.files import Files

log = logging.getLogger(__name__)

MAX_CHARS = 1000  # the longest --src or --tgt: a picture's axes are legible for a sentence, not a document


#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model",), outputs=("output",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--src", required=True, metavar="TEXT", help="the source sentence")
    parser.add_argument("--tgt", metavar="TEXT", help="its translation (default: the model's)")
    add_output_argument(parser, "where to write the picture", metavar="FILE.png", required=True)
    parser.add_argument("--self", action="store_true", dest="self_attention", help="also the self-attention")


def run(args: argparse.Namespace) -> int:
    from transduce.search.plot import plot_attention_maps

    if len(args.model) > 1:
        raise TransduceError(f"attention draws one model's weights: give one --model, not {len(args.model)}")
    check_file_output(args.output, "-o/--output")
    if Path(args.output).suffix.lower() != ".png":
        raise TransduceError(f"-o/--output {args.output}: the pictures are PNG files; give a name ending in .png")
    for option, text in (("--src", args.src), ("--tgt", args.tgt)):
        if text is not None and not text.strip():
            raise TransduceError(f"{option} is empty; give the sentence to draw")
        if text is not None and len(text) > MAX_CHARS:
            raise TransduceError(f"{option}: {len(text):,} characters, more than {MAX_CHARS:,}: attention is drawn "
                                 "for one sentence")  # fmt: skip
    translator = load_translator(args)
    translator.decode = decode_config(args, translator.decode)  # the translation drawn is the one translate gives
    target = args.tgt
    if target is None:
        from transduce.parsing.parser import PAPER_DECODE, Parser, is_parsing_model

        if is_parsing_model(translator):  # the parse `transduce parse` gives: constrained, the paper's search
            parser = Parser(translator)
            target = parser.parse([args.src.split()], decode_config(args, PAPER_DECODE))[0].output
    maps = translator.attention(args.src, target)
    for path in plot_attention_maps(maps, args.output, self_attention=args.self_attention):
        log.info("wrote %s", path)
    print(" ".join(maps.tgt_out_pieces))
    return 0
