"""Average the weights of the last checkpoints of a run (paper §6.1: the last 5 for base, 20 for big).

Examples:
  transduce average runs/base --last 5                      # writes runs/base/average_last5/
  transduce average runs/big --last 20 --out models/big-avg20
  transduce average runs/a/checkpoints/step_00010000 runs/a/checkpoints/step_00011000 --out models/avg2

The output is a standalone checkpoint directory (model.safetensors, manifest.json and a copy of the vocabulary):
``transduce translate --model OUT`` and ``transduce.checkpoint.load_model(OUT)`` read it.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from transduce.errors import CheckpointError

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``transduce average RUN_DIR --last N [--out DIR]`` or ``transduce average CKPT ... --out DIR``."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a run directory, or checkpoint directories")
    parser.add_argument("--last", type=int, metavar="N", help="average the N newest checkpoints of RUN_DIR")
    parser.add_argument("--out", metavar="DIR", help="output checkpoint directory (default: RUN_DIR/average_lastN)")


def run(args: argparse.Namespace) -> int:
    from transduce import checkpoint as ckpt

    if args.last is not None:
        if len(args.paths) != 1:
            raise CheckpointError("--last N takes exactly one run directory")
        if args.last < 1:
            raise CheckpointError(f"--last: must be >= 1, got {args.last}")
        run_dir = Path(args.paths[0])
        found = ckpt.list_checkpoints(run_dir)
        if not found:
            raise CheckpointError(f"{run_dir}: no checkpoints in {run_dir / ckpt.CHECKPOINTS_DIR}")
        if len(found) < args.last:
            log.warning("%s has %d checkpoints, fewer than --last %d; averaging them all", run_dir, len(found),
                        args.last)  # fmt: skip
        chosen = found[-args.last :]
        out = Path(args.out) if args.out else run_dir / f"average_last{args.last}"
    else:
        if not args.out:
            raise CheckpointError("--out DIR is needed when averaging listed checkpoints")
        chosen = [ckpt.resolve(p) for p in args.paths]
        out = Path(args.out)
    model, config, vocab_dir = ckpt.average_checkpoints(chosen)
    ckpt.save_model(out, model, config, vocab_dir)
    log.info("averaged %d checkpoints (%s) into %s", len(chosen), ", ".join(p.name for p in chosen), out)
    return 0
