"""Train a Transformer, or resume a run that stopped.

Examples:
  transduce train configs/example.yaml
  transduce train configs/toy.yaml train.max_steps=2000 model.dropout=0.2 train.precision=bf16
  transduce train --resume runs/toy                          # continue exactly where it stopped
  transduce train --resume runs/toy train.max_steps=50000    # ... with a later end

Data parallelism (DDP; the same command on every node, one process per GPU, or per CPU socket with gloo):
  torchrun --nproc_per_node 8 -m transduce.cli train configs/example.yaml
  torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_backend c10d \\
      --rdzv_endpoint HOST:29500 -m transduce.cli train configs/example.yaml    # node_rank 1 on the other node
  (every node reads the data and vocabulary rank 0 prepares under train.run_dir: put it on a shared file system,
  or run `transduce prepare` first and point data.prepared at a copy on each node; see docs/gpu.md)

The run directory (train.run_dir) receives config.yaml (the resolved config), vocab/, checkpoints/ (step_N/,
last, best), metrics.jsonl, train.log and, when tensorboard is installed, tensorboard/. SIGINT or SIGTERM writes a
checkpoint and exits with 130 / 143; resume with --resume RUN_DIR. Every config key is commented in
configs/example.yaml; the train.* keys are listed below.
"""

from __future__ import annotations

import argparse
import inspect
import re

from transduce.config import Config, TrainConfig


def _field_docs(cls: type) -> str:
    """``key (default): comment`` for every field of a config dataclass, read from its source."""
    lines = []
    for m in re.finditer(r"^    (\w+): [^=\n]+= ([^#\n]+?)\s*(?:#\s*(.*))?$", inspect.getsource(cls), re.M):
        lines.append(f"  {m.group(1)} = {m.group(2)}" + (f"  # {m.group(3)}" if m.group(3) else ""))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``transduce train CONFIG [KEY=VALUE ...]`` or ``transduce train --resume RUN_DIR [KEY=VALUE ...]``."""
    parser.add_argument("config", nargs="?", metavar="CONFIG.yaml", help="the run configuration")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides (train.max_steps=100)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    parser.add_argument("--device", help="train.device: auto, cpu, cuda, cuda:N or mps (default: the config's)")
    parser.add_argument("--precision", help="train.precision: fp32, bf16 or fp16 (default: the config's)")
    parser.epilog = "train.* keys (default  # meaning):\n" + _field_docs(TrainConfig)


def run(args: argparse.Namespace) -> int:
    from transduce.train import TrainingError, train

    overrides = list(args.overrides)
    for key in ("device", "precision"):  # shorthands of the dotted overrides, as translate/evaluate/serve spell them
        if getattr(args, key, None) is not None:
            overrides.append(f"train.{key}={getattr(args, key)}")
    if args.resume:
        if args.config:  # argparse puts the first KEY=VALUE into CONFIG when --resume is used
            if "=" not in args.config:
                raise TrainingError("give either CONFIG.yaml or --resume RUN_DIR, not both")
            overrides.insert(0, args.config)
        outcome = train(resume=args.resume, overrides=overrides)
    else:
        if not args.config:
            raise TrainingError("missing CONFIG.yaml (or --resume RUN_DIR)")
        outcome = train(Config.load(args.config, overrides=overrides))
    return outcome.exit_code
