"""Train a Transformer, or resume a run that stopped.

Examples:
  transduce train configs/example.yaml
  transduce train configs/toy.yaml train.max_steps=2000 model.dropout=0.2 train.precision=bf16
  transduce train --preset small --train corpus/train.tsv --valid corpus/valid.tsv -o runs/mine   # no YAML
  transduce train --preset tiny --src-file train.src --tgt-file train.tgt -o runs/two-files train.max_steps=5000
  transduce train --resume runs/toy                          # continue exactly where it stopped
  transduce train --resume runs/toy train.max_steps=50000    # ... with a later end
  transduce train my_domain.yaml --init-from models/opus-mt-en-de    # fine-tune a pretrained model on your data
  transduce train my_domain.yaml --init-from runs/multi30k_en_de train.extend_vocab=2000 \\
      train.freeze_embeddings=true data.mix=../shared/data/multi30k/train data.mix_share=0.2   # docs/finetune.md
  transduce train configs/movie_reviews_finetune.yaml   # a classifier on a translation encoder (docs/transfer.md)
  transduce train configs/multi30k_en_mlm.yaml          # masked-LM pretraining of an encoder (docs/transfer.md)

Without CONFIG.yaml every value is the built-in default (the config dataclasses, listed in configs/example.yaml),
with the model shape of --preset (base, big, small, tiny, test), the data options below and the KEY=VALUE overrides
on top. The corpus forms are those of `transduce prepare`: a path prefix, a .tsv or .jsonl file, or two files.

Data parallelism (DDP; the same command on every node, one process per GPU, or per CPU socket with gloo):
  torchrun --nproc_per_node 8 -m transduce.cli train configs/example.yaml
  torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_backend c10d \\
      --rdzv_endpoint HOST:29500 -m transduce.cli train configs/example.yaml    # node_rank 1 on the other node
  (every node reads the data and vocabulary rank 0 prepares under train.run_dir: put it on a shared file system,
  or run `transduce prepare` first and point data.prepared at a copy on each node; see docs/gpu.md)

The run directory (train.run_dir, or -o DIR) receives config.yaml (the resolved config), vocab/, checkpoints/
(step_N/, last, best), metrics.jsonl, train.log and, when tensorboard is installed, tensorboard/. A run that fails
before writing anything leaves no directory behind. SIGINT or SIGTERM writes a checkpoint and exits with 130 / 143;
resume with --resume RUN_DIR. Every config key is commented in configs/example.yaml; the train.* keys are listed
below.
"""

from __future__ import annotations

import argparse
import inspect
import re
from typing import Any

from transduce.commands.options import add_output_argument, check_directory_output
from transduce.commands.prepare import add_data_arguments, data_flags
from transduce.config import MODEL_PRESETS, Config, TrainConfig
from transduce.files import Files, directories_removed_on_failure


def _field_docs(cls: type) -> str:
    """``key (default): comment`` for every field of a config dataclass, read from its source."""
    lines = []
    for m in re.finditer(r"^    (\w+): [^=\n]+= ([^#\n]+?)\s*(?:#\s*(.*))?$", inspect.getsource(cls), re.M):
        lines.append(f"  {m.group(1)} = {m.group(2)}" + (f"  # {m.group(3)}" if m.group(3) else ""))
    return "\n".join(lines)


#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(
    inputs=("config", "resume", "init_from", "train", "valid", "test", "src_file", "tgt_file", "vocabulary"),
    outputs=("output",),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``transduce train [CONFIG] [options] [KEY=VALUE ...]`` or ``transduce train --resume RUN_DIR [KEY=VALUE]``."""
    parser.add_argument("config", nargs="?", metavar="CONFIG.yaml", help="the run configuration (optional)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides (train.max_steps=100)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    presets = ", ".join(MODEL_PRESETS)
    parser.add_argument("--preset", metavar="NAME", help=f"model shape (model.preset): {presets}; model keys on top")
    add_output_argument(parser, "the run directory (train.run_dir)", metavar="DIR")
    add_data_arguments(parser)
    parser.add_argument("--device", help="train.device: auto, cpu, cuda, cuda:N or mps (default: the config's)")
    parser.add_argument("--precision", help="train.precision: auto, fp32, bf16 or fp16 (default: the config's)")
    parser.add_argument(
        "--init-from", metavar="PATH",
        help="start from a pretrained model (run directory, checkpoint or Hugging Face Marian directory): its "
        "architecture, vocabulary and weights; the same as train.init_from=PATH (docs/finetune.md)",
    )  # fmt: skip
    parser.epilog = "train.* keys (default  # meaning):\n" + _field_docs(TrainConfig)


def run(args: argparse.Namespace) -> int:
    from transduce.training.train import TrainingError, train

    overrides = list(args.overrides)
    if args.config and "=" in args.config:  # argparse puts the first KEY=VALUE into CONFIG when there is no file
        overrides.insert(0, args.config)
        args.config = None
    options = _options(args)
    for key in ("device", "precision"):  # shorthands of the dotted overrides, as translate/evaluate/serve spell them
        if getattr(args, key, None) is not None:
            overrides.append(f"train.{key}={getattr(args, key)}")
    if args.init_from:
        if args.resume:
            raise TrainingError("--init-from starts a new run; --resume continues one (it keeps its train.init_from)")
        overrides.append(f"train.init_from={args.init_from}")
    if args.resume:
        if args.config:
            raise TrainingError("give either CONFIG.yaml or --resume RUN_DIR, not both")
        if options:
            raise TrainingError("--resume takes the run's own config; change it with KEY=VALUE overrides")
        return train(resume=args.resume, overrides=overrides).exit_code
    if args.config:
        config = Config.load(args.config, overrides, options=options)
    elif options or overrides:
        config = Config.resolve({}, overrides, options=options)
    else:
        raise TrainingError("missing CONFIG.yaml (or --resume RUN_DIR, or --preset NAME with the data: --train CORPUS)")
    check_directory_output(config.train.run_dir, "-o/--output" if args.output else "train.run_dir")
    with directories_removed_on_failure(config.train.run_dir):
        return train(config).exit_code


def _options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The config fields the command-line options set, by section."""
    options: dict[str, dict[str, Any]] = {}
    if args.preset is not None:
        options["model"] = {"preset": args.preset}
    if args.output is not None:
        options["train"] = {"run_dir": args.output}
    data = data_flags(args)
    if data:
        options["data"] = data
    return options
