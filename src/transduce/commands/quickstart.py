"""The whole path in a few minutes, no download: generate a corpus of English dates and their ISO forms, prepare
it, train a small Transformer on the CPU, evaluate on held-out pairs, translate examples, and draw the attention
and the training curves into the output directory."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from transduce.commands.options import add_output_argument, check_directory_output, positive_float, positive_int
from transduce.files import Files
from transduce.training.quickstart import run_quickstart

#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(outputs=("output",))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_output_argument(p, "output directory (default: %(default)s)", metavar="DIR", default="quickstart")
    p.add_argument("--minutes", type=positive_float, default=2.5, help="training time budget (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--train-pairs", type=positive_int, default=30000, help="generated training pairs (default: %(default)s)"
    )
    p.add_argument("--test-pairs", type=positive_int, default=1000, help="held-out test pairs (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from transduce.files import first_missing

    check_directory_output(args.output, "-o/--output")
    created = first_missing(Path(args.output))
    try:
        r = run_quickstart(
            args.output, minutes=args.minutes, seed=args.seed, train_pairs=args.train_pairs, test_pairs=args.test_pairs
        )
    except BaseException:  # interrupted or failed: nothing of what this run made is left (there is no resuming)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    print(f"\ntrained {r.steps} updates; test set of {r.test_sentences} held-out dates:")
    print(f"  BLEU {r.bleu:.2f}  ({r.bleu_signature})")
    print(f"  exact match {100 * r.exact_match:.1f}%\n")
    width = max(len(s) for s, _, _ in r.examples)
    for source, reference, translation in r.examples:
        mark = "ok" if translation == reference else f"expected {reference}"
        print(f"  {source:<{width}}  ->  {translation}   {mark}")
    print(f"\nattention: {r.attention_png}\ntraining curves: {r.curves_png}\nrun: {r.run_dir}")
    print(f"translate more: transduce translate --model {r.run_dir} <<< 'June 5, 2021'")
    return 0
