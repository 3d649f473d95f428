"""Label texts with a trained classifier (data.task: classify): one label per input line, in input order.

Examples:
  transduce classify --model runs/movie_reviews_finetune < reviews.txt > labels.txt
  transduce classify --model runs/movie_reviews_finetune -i reviews.txt -o labels.txt --json
  transduce classify --model runs/movie_reviews_finetune -i test.tsv         # the text column of label<TAB>text
  transduce classify --model runs/nli -i pairs.jsonl --text-field premise --text2-field hypothesis

The input is a text on every line (standard input by default; a classifier of sentence pairs reads
text<TAB>text2), or by its name or --format a corpus as prepare reads it: FILE.tsv (label<TAB>text; the label
column is ignored) or FILE.jsonl (the run's text fields unless --text-field / --text2-field). --json writes an
object per line: {"label": ..., "probabilities": {label: p, ...}}. An empty text, a line without its tab or field, or
bytes that are not UTF-8 are an error naming the file and line, found before the model is loaded; nothing is written
then. The output file appears only when complete.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transduce.commands.options import add_output_argument, check_file_output, non_negative_int, positive_int
from transduce.errors import TransduceError
from transduce.files import STDIO, Files, open_output

if TYPE_CHECKING:
    from transduce.config import Config
    from transduce.transfer.classify import Classification, Classifier
    from transduce.transfer.classify.inputs import Fields

log = logging.getLogger(__name__)

#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model", "input"), outputs=("output",))

CHUNK = 4096  # texts read, classified and written at a time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from transduce.device import DEVICE_FORMS
    from transduce.transfer.classify.inputs import FORMATS

    parser.add_argument("--model", required=True, metavar="PATH", help="a classifier's run directory or checkpoint")
    parser.add_argument(
        "-i", "--input", default=STDIO, metavar="FILE",
        help="texts, one a line (default: stdin; .gz is read), or FILE.tsv (label<TAB>text) or FILE.jsonl",
    )  # fmt: skip
    add_output_argument(parser, "labels, one a line (default: stdout)", metavar="FILE", default=STDIO)
    parser.add_argument("--json", action="store_true", help="an object per line: the label and every probability")
    add_input_form_arguments(parser, FORMATS)
    parser.add_argument("--device", default="auto", help=f"{DEVICE_FORMS} (default: auto, a GPU when there is one)")
    parser.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="texts a batch (default: 64)")
    parser.add_argument(
        "--threads", type=non_negative_int, default=0, help="torch intra-op threads; 0: torch's default"
    )


def add_input_form_arguments(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    """--format and the JSON Lines fields of a classifier's input (shared with evaluate)."""
    parser.add_argument(
        "--format", choices=formats,
        help="the input's form (default: by its name: .tsv, .jsonl, also .gz; else text, one a line)",
    )  # fmt: skip
    parser.add_argument(
        "--text-field", metavar="NAME", help="JSON Lines: the text (default: the run's data.text_field)"
    )
    parser.add_argument(
        "--text2-field", metavar="NAME", help="JSON Lines: the second text of a pair (default: the run's)"
    )


def run(args: argparse.Namespace) -> int:
    from transduce.commands.translate import check_input
    from transduce.transfer.classify.inputs import input_format, read_texts

    check_input(args.input, what="classify", hint="")  # missing, a directory, empty, not UTF-8
    check_file_output(args.output, "-o/--output")
    config = classifier_config(args.model)
    form = input_format(args.input, args.format)
    fields = input_fields(args, config, args.input, form)
    examples: Iterable[tuple[int, str, str | None]]
    if args.input == STDIO or not Path(args.input).is_file():  # stdin, a pipe, a device: read once and kept, every
        examples = list(read_texts(args.input, form, fields))  # line checked before the model is loaded
    else:  # a regular file: a first pass checks every line; the second classifies a chunk at a time
        for _ in read_texts(args.input, form, fields):
            pass
        examples = read_texts(args.input, form, fields)
    classifier = load(args)
    write = format_json if args.json else format_label
    count = 0
    with open_output(args.output) as out:  # a file appears only when complete
        for chunk in chunks(examples, CHUNK):
            texts2 = [t2 for _, _, t2 in chunk] if fields.pairs else None
            for result in classifier.classify([t for _, t, _ in chunk], texts2):
                out.write(write(result))
            count += len(chunk)
    log.info("classified %d texts", count)
    return 0


def classifier_config(path: str) -> Config:
    """The config of the classifier at ``path``, read without its weights.

    Raises:
        CheckpointError: no checkpoint there, or a model that is not a classifier (naming the verb that takes it).
    """
    from transduce.errors import CheckpointError
    from transduce.training import checkpoint as ckpt
    from transduce.transfer.classify.classifier import not_a_classifier

    config = ckpt.read_info(ckpt.resolve(path)).config
    if config.data.task != "classify":
        raise CheckpointError(not_a_classifier(path, config.data.task))
    return config


def input_fields(args: argparse.Namespace, config: Config, path: str, form: str) -> Fields:
    """The :class:`~transduce.transfer.classify.inputs.Fields` of the input ``path`` (read as ``form``): the run's, with
    --text-field / --text2-field (and --label-field, for evaluate).

    Raises:
        TransduceError: a field option for an input that is not JSON Lines, or --text2-field for a classifier of
            single texts.
    """
    from transduce.transfer.classify.inputs import Fields

    given = [(o, getattr(args, o.replace("-", "_"), None)) for o in ("text-field", "text2-field", "label-field")]
    given = [(option, value) for option, value in given if value is not None]
    pairs = bool(config.data.text2_field)
    if given and form != "jsonl":
        where = "standard input" if path == STDIO else path
        raise TransduceError(f"--{given[0][0]} names a field of a JSON Lines input (FILE.jsonl or --format jsonl), "
                             f"not of {where}")  # fmt: skip
    if args.text2_field is not None and not pairs:
        raise TransduceError("--text2-field: this classifier reads single texts (it was trained without "
                             "data.text2_field)")  # fmt: skip
    data = config.data
    return Fields(text=args.text_field or data.text_field, text2=args.text2_field or data.text2_field,
                  label=getattr(args, "label_field", None) or data.label_field, pairs=pairs)  # fmt: skip


def load(args: argparse.Namespace) -> Classifier:
    """The :class:`~transduce.transfer.classify.Classifier` of --model on --device, with --batch-size and --threads."""
    import torch

    from transduce.transfer.classify import Classifier

    if args.threads:
        torch.set_num_threads(args.threads)
    return Classifier.load(args.model, args.device, batch_size=args.batch_size)


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def format_label(result: Classification) -> str:
    """The label, one line."""
    return result.label + "\n"


def format_json(result: Classification) -> str:
    """``{"label": ..., "probabilities": {label: p, ...}}`` on one line."""
    return json.dumps(result.to_dict(), ensure_ascii=False) + "\n"
