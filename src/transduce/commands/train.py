"""Train a Transformer, or resume a run that stopped.

Examples:
  transduce train configs/example.yaml
  transduce train configs/toy.yaml train.max_steps=2000 model.dropout=0.2 train.precision=bf16
  transduce train --resume runs/toy                          # continue exactly where it stopped
  transduce train --resume runs/toy train.max_steps=50000    # ... with a later end
  transduce train configs/finetune.yaml --init-from models/opus-mt-en-de    # fine-tune a pretrained model
  transduce train configs/finetune.yaml --init-from runs/multi30k_en_de train.extend_vocab=2000 \
      train.freeze_embeddings=true data.mix=../shared/data/multi30k/train data.mix_share=0.2

Data parallelism (DDP; the same command on every node, one process per GPU, or per CPU socket with gloo):
  torchrun --nproc_per_node 8 -m transduce.cli train configs/example.yaml
  torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_backend c10d \\
      --rdzv_endpoint HOST:29500 -m transduce.cli train configs/example.yaml    # node_rank 1 on the other node

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
    parser.add_argument(
        "--init-from", metavar="PATH",
        help="start from a pretrained model (run directory, checkpoint or Hugging Face Marian directory): its "
        "architecture, vocabulary and weights; the same as train.init_from=PATH (docs/finetune.md)",
    )  # fmt: skip
    parser.epilog = "train.* keys (default  # meaning):\n" + _field_docs(TrainConfig)


def run(args: argparse.Namespace) -> int:
    from transduce.train import TrainingError, train

    overrides = list(args.overrides)
    if args.init_from:
        if args.resume:
            raise TrainingError("--init-from starts a new run; --resume continues one (it keeps its train.init_from)")
        overrides.append(f"train.init_from={args.init_from}")
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
