"""Contextual word vectors (CoVe) from a translation model's encoder: a vector per source piece of every input line,
and a mean vector per line, in a file that numpy, safetensors or any library reading them can load.

Examples:
  transduce embed --model runs/multi30k -i train.en -o train.en.npz
  transduce embed --model runs/multi30k -i train.en -o train.en.safetensors --with-embeddings
  transduce embed --model runs/multi30k -i test.tsv -o sentences.npy --pooled-only
  transduce embed --model runs/hf -i test.jsonl --src-field translation.en --format npz > test.npz

Each line is prepared as translate prepares it (the run's decode.input_case, the model's tokenizer, EOS appended)
and encoded in eval mode, batched by length; the vectors are float32, in input order. The format is the output's
suffix (.npz, .npy, .safetensors) or --format; standard output (npz by default) only when it is not a terminal.
The layout of each format is in docs/cli.md. The output appears only when complete.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from transduce.commands.options import (
    add_output_argument,
    add_source_input_arguments,
    check_file_output,
    positive_int,
)
from transduce.commands.translate import (
    _is_terminal,
    add_loading_arguments,
    check_corpus_side,
    check_input,
    load_translator,
)
from transduce.errors import TransduceError
from transduce.files import STDIO, Files, check_outputs
from transduce.text.casing import INPUT_CASES

log = logging.getLogger(__name__)

#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model", "input"), outputs=("output",))

#: how to get past a line that is not UTF-8
INVALID_HINT = "use --replace-invalid to embed it with U+FFFD in place"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from transduce.transfer.embed import FORMATS

    # fp32 by default: the vectors are the product, the same as the API's (Translator.embed) bit for bit
    add_loading_arguments(parser, "run directory, checkpoint or Hugging Face Marian directory (one model)", "fp32")
    add_source_input_arguments(parser)
    add_output_argument(
        parser, "FILE.npz, FILE.npy or FILE.safetensors (default: stdout, when it is not a terminal)",
        metavar="FILE", default=STDIO,
    )  # fmt: skip
    parser.add_argument("--format", choices=FORMATS, help="the output's format (default: the -o suffix's; stdout: npz)")
    parser.add_argument("--pooled-only", action="store_true", help="write only the mean vector of each line")
    parser.add_argument(
        "--with-embeddings", action="store_true",
        help="each row [embedding; state] (2 x d_model): the piece's scaled source embedding before the encoder",
    )  # fmt: skip
    parser.add_argument(
        "--include-eos", action="store_true", help="keep the EOS position's row (and count it in the mean)"
    )
    parser.add_argument(
        "--input-case", choices=INPUT_CASES, help="case normalisation of the source (default: the run's decode config)"
    )
    parser.add_argument(
        "--max-tokens", type=positive_int, metavar="N", help="token budget of a batch (default: decode.max_tokens)"
    )
    parser.add_argument(
        "--replace-invalid", action="store_true", help="replace bytes that are not UTF-8 instead of failing"
    )


def run(args: argparse.Namespace) -> int:
    from transduce.data.corpus import read_side
    from transduce.transfer.embed import Embeddings, embed_lines, embedding_dim, write_embeddings

    if len(args.model) > 1:
        raise TransduceError(f"embed reads one model's encoder: give one --model, not {len(args.model)}")
    check_input(args.input, replace_invalid=args.replace_invalid, what="embed", hint=INVALID_HINT)
    check_corpus_side(args.input, "source", args.src_field)
    fmt = output_format(args)
    translator = load_translator(args, language_required=False)  # the encoder reads sources without a token
    case = args.input_case or translator.decode.input_case
    errors = "replace" if args.replace_invalid else "strict"
    lines = read_side(args.input, "source", args.src_field, errors=errors, hint=INVALID_HINT)
    vectors = list(embed_lines(translator, lines, pooled_only=args.pooled_only, with_embeddings=args.with_embeddings,
                               include_eos=args.include_eos, input_case=case, max_tokens=args.max_tokens))  # fmt: skip
    meta = {
        "model": str(args.model[0]),
        "d_model": translator.model.config.d_model,
        "with_embeddings": args.with_embeddings,
        "include_eos": args.include_eos,
        "input_case": case,
        "pooling": "mean",
    }
    dim = embedding_dim(translator, with_embeddings=args.with_embeddings)
    embeddings = Embeddings.of(vectors, dim=dim, meta=meta)  # adds layout, dim and pooled_only
    files = write_embeddings(args.output, embeddings, fmt)
    rows = "" if embeddings.vectors is None else f", {len(embeddings.vectors)} piece vectors"
    log.info("embedded %d lines (%d dimensions%s) into %s", len(embeddings), dim, rows,
             "standard output" if args.output == STDIO else ", ".join(files))  # fmt: skip
    return 0


def output_format(args: argparse.Namespace) -> str:
    """The format to write, checked before the model is loaded: ``--format``, else the ``-o`` suffix's, else npz for
    standard output; binary output is not written to a terminal, and each file the format writes is checked as -o
    is (not a directory, not an input).

    Raises:
        TransduceError: one line naming the option.
    """
    from transduce.transfer.embed import SUFFIXES, output_files

    path = args.output
    if path == STDIO:
        if _is_terminal(sys.stdout):
            raise TransduceError("standard output is a terminal and the vectors are binary: give -o FILE.npz (or "
                                 ".npy, .safetensors), or redirect standard output")  # fmt: skip
        fmt = args.format or "npz"
        if fmt == "npy" and not args.pooled_only:
            raise TransduceError("--format npy writes three files (vectors, pooled vectors, pieces), not standard "
                                 "output: give -o FILE.npy, or --format npz or safetensors")  # fmt: skip
        return fmt
    check_file_output(path, "-o/--output")
    suffix = Path(path).suffix.lower()
    named = SUFFIXES.get(suffix)
    if args.format and named and args.format != named:
        raise TransduceError(f"-o/--output {path} is named as {named} but --format is {args.format}")
    fmt = args.format or named
    if fmt is None:
        what = f"unknown format {suffix!r}" if suffix else "no suffix to tell the format"
        raise TransduceError(f"-o/--output {path}: {what}; give a name ending in .npz, .npy or .safetensors, or "
                             "--format")  # fmt: skip
    sidecars = output_files(path, fmt, pooled_only=args.pooled_only)[1:]  # npy: OUT.pooled.npy, OUT.pieces.json
    for name in sidecars:
        check_file_output(name, "-o/--output")
    if sidecars:  # -o itself was checked with the command line
        inputs = [("--model", args.model), ("-i/--input", args.input)]
        check_outputs(inputs, [("-o/--output", path), *(("-o/--output", name) for name in sidecars)])
    return fmt
