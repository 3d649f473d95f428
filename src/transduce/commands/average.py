"""Average the weights of the last checkpoints of a run (paper §6.1: the last 5 for base, 20 for big).

Examples:
  transduce average --model runs/base --last 5               # writes runs/base/average_last5/
  transduce average --model runs/big --last 20 -o models/big-avg20
  transduce average --model runs/a/checkpoints/step_00010000 runs/a/checkpoints/step_00011000 -o models/avg2

``--last N`` needs N checkpoints: with fewer the command says how many there are and writes nothing.

The output is a standalone checkpoint directory (model.safetensors, manifest.json and a copy of the vocabulary):
``transduce translate --model OUTPUT`` and ``transduce.training.checkpoint.load_model(OUTPUT)`` read it.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from transduce.commands.options import add_output_argument, positive_int
from transduce.errors import CheckpointError
from transduce.files import Files

log = logging.getLogger(__name__)


#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model", "paths"), replaced=("output",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``transduce average --model RUN_DIR --last N [-o DIR]`` or ``transduce average --model CKPT ... -o DIR``."""
    parser.add_argument(
        "--model", nargs="+", metavar="PATH", help="a run directory (with --last), or checkpoint directories"
    )
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)  # the older spelling: the paths without --model
    parser.add_argument("--last", type=positive_int, metavar="N", help="average the N newest checkpoints of RUN_DIR")
    add_output_argument(parser, "output checkpoint directory (default: RUN_DIR/average_lastN)", metavar="DIR")


def run(args: argparse.Namespace) -> int:
    from transduce.training import checkpoint as ckpt

    if args.model and args.paths:
        raise CheckpointError(f"unexpected arguments {' '.join(args.paths)}: list every path after --model")
    paths = args.model or args.paths
    if not paths:
        raise CheckpointError("--model PATH is needed: a run directory (with --last N) or checkpoint directories")
    if args.last is not None:
        if len(paths) != 1:
            raise CheckpointError("--last N takes exactly one run directory")
        run_dir = Path(paths[0])
        found = ckpt.list_checkpoints(run_dir)
        if not found:
            raise CheckpointError(f"{run_dir}: no checkpoints in {run_dir / ckpt.CHECKPOINTS_DIR}")
        if len(found) < args.last:  # averaging fewer under the name average_lastN would mislead what reads it
            names = ", ".join(p.name for p in found)
            raise CheckpointError(f"{run_dir} has {len(found)} checkpoints ({names}), fewer than --last {args.last}; "
                                  f"nothing written (--last {len(found)} averages them all)")  # fmt: skip
        chosen = found[-args.last :]
        out = Path(args.output) if args.output else run_dir / f"average_last{args.last}"
    else:
        if not args.output:
            raise CheckpointError("-o/--output DIR is needed when averaging listed checkpoints")
        chosen = [ckpt.resolve(p) for p in paths]
        out = Path(args.output)
    model, config, vocab_dir = ckpt.average_checkpoints(chosen)
    ckpt.save_model(out, model, config, vocab_dir)
    log.info("averaged %d checkpoints (%s) into %s", len(chosen), ", ".join(p.name for p in chosen), out)
    return 0
