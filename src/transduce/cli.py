"""The ``transduce`` command line: subcommands only. Each lives in ``transduce.commands.<name>`` with two
functions, ``add_arguments(parser)`` and ``run(args) -> int``; all logic is in the library and tested there."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from transduce.errors import TransduceError

#: subcommand -> (module under transduce.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("quickstart", "the whole path in a few minutes on a CPU, no download"),
    "prepare": ("prepare", "raw parallel text -> vocabulary and binarised corpus"),
    "train": ("train", "train a model (or --resume a run); torchrun for data parallelism"),
    "average": ("average", "average the weights of the last N checkpoints of a run"),
    "download": ("download", "fetch a public dataset's raw files (Multi30k)"),
    "translate": ("translate", "translate raw text with a trained model (stdin to stdout by default)"),
    "evaluate": ("evaluate", "translate a test set and score it with sacreBLEU (BLEU, chrF)"),
    "attention": ("attention", "draw attention heatmaps of one sentence pair (PNG)"),
    "report": ("report", "score a run on its test sets (both BLEU conventions) and write report.html"),
    "export": ("export", "write a model as a Hugging Face Marian or a CTranslate2 model directory"),
    "import-hf": ("import_hf", "convert a Hugging Face Marian model (opus-mt, ...) into a transduce checkpoint"),
    "serve": ("serve", "serve a model over HTTP: JSON API with dynamic batching, and a page to explore attention"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transduce", description="Transformer sequence transduction toolkit")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(f"transduce.commands.{module}")
        p = sub.add_parser(
            name,
            help=help_text,
            description=(mod.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse takes a subcommand's positional KEY=VALUE overrides only before its first option
    # ("train CONFIG --init-from PATH train.lr=1e-4"): those after one come back as extras
    if extra and (not hasattr(args, "overrides") or any("=" not in e or e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        code = int(args._module.run(args) or 0)
    except TransduceError as e:
        print(f"transduce {args.command}: error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"transduce {args.command}: interrupted", file=sys.stderr)
        code = 130
    from transduce.distributed import launched_world_size, leave

    if launched_world_size() > 1:  # a torchrun worker, its process group destroyed: see leave()
        leave(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
