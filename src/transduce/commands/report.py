"""Score a run on its validation and test sets in both BLEU conventions and write RUN_DIR/report.html: config,
learning curves, the BLEU table with signatures, sample translations beside their references, attention maps.

  transduce average --model runs/multi30k_en_de --last 5     # optional: the report then uses the averaged weights
  transduce report runs/multi30k_en_de --evaluate"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transduce.commands.options import non_negative_float, positive_int
from transduce.commands.translate import add_device_arguments
from transduce.config import LENGTH_NORMS
from transduce.errors import TransduceError
from transduce.files import Files
from transduce.training.report import evaluate_run, write_report

#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("run_dir", "model"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run directory")
    p.add_argument("--evaluate", action="store_true", help="translate and score the sets first (else: reuse eval/)")
    p.add_argument(
        "--model", metavar="PATH", help="checkpoint to evaluate (default: the newest average_last*, else the best)"
    )
    p.add_argument("--beam", type=positive_int, metavar="K", help="beam size (default: the run's decode.beam)")
    p.add_argument(
        "--length-penalty",
        type=non_negative_float,
        metavar="ALPHA",
        help="penalty alpha (default: the run's decode.length_penalty)",
    )
    p.add_argument("--length-norm", choices=LENGTH_NORMS, help="gnmt or length (default: the run's decode.length_norm)")
    add_device_arguments(p)


def run(args: argparse.Namespace) -> int:
    if not (Path(args.run_dir) / "config.yaml").is_file():
        raise TransduceError(f"{args.run_dir}: not a run directory (no config.yaml)")
    if args.evaluate:
        given = {"beam": args.beam, "length_penalty": args.length_penalty, "length_norm": args.length_norm}
        decode = {k: v for k, v in given.items() if v is not None}
        result = evaluate_run(args.run_dir, model=args.model, device=args.device, precision=args.precision, **decode)
        print(json.dumps(result["sets"], indent=2, ensure_ascii=False))
    print(f"report: {write_report(args.run_dir, device=args.device, precision=args.precision)}")
    return 0
