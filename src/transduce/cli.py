"""The ``transduce`` command line: subcommands only. Each lives in ``transduce.commands.<name>`` with two
functions, ``add_arguments(parser)`` and ``run(args) -> int``; all logic is in the library and tested there."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import re
import sys
from typing import NoReturn

from transduce import __version__
from transduce.errors import TransduceError
from transduce.files import Files, check_arguments

#: subcommand -> (module under transduce.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("quickstart", "the whole path in a few minutes on a CPU, no download"),
    "prepare": ("prepare", "raw parallel text -> vocabulary and binarised corpus"),
    "train": ("train", "train a model (or --resume a run); torchrun for data parallelism"),
    "average": ("average", "average the weights of the last N checkpoints of a run"),
    "download": ("download", "fetch a public dataset's raw files (Multi30k)"),
    "translate": ("translate", "translate raw text with a trained model (stdin to stdout by default)"),
    "classify": ("classify", "label texts with a trained classifier (data.task: classify)"),
    "evaluate": ("evaluate", "translate a test set and score it with sacreBLEU (BLEU, chrF); or score a classifier"),
    "parse": ("parse", "parse sentences into constituency trees (data.task: parse) and score them (EVALB)"),
    "attention": ("attention", "draw attention heatmaps of one sentence pair (PNG)"),
    "embed": ("embed", "contextual word vectors from the encoder (CoVe) into .npz, .npy or .safetensors"),
    "report": ("report", "score a run on its test sets (both BLEU conventions) and write report.html"),
    "export": ("export", "write a model as a Hugging Face Marian or a CTranslate2 model directory"),
    "import-hf": ("import_hf", "convert a Hugging Face Marian model (opus-mt, ...) into a transduce checkpoint"),
    "serve": ("serve", "serve a model over HTTP: JSON API with dynamic batching, and a page to explore attention"),
}


class CommandParser(argparse.ArgumentParser):
    """argparse's parser with one-line errors and no usage block: ``transduce translate: --beam must be >= 1 (got
    0)``, exit status 2. A verb's parser names the verb (its ``prog`` is ``transduce VERB``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {_one_line(message)}\n")


def _one_line(message: str) -> str:
    """argparse's ``argument --beam: must be >= 1 (got 0)`` as ``--beam must be >= 1 (got 0)``; other messages
    keep the option's name in front (``--length-norm: invalid choice: ...``)."""
    match = re.fullmatch(r"argument (\S+): (.*)", message, re.S)
    if match:
        name, reason = match.groups()
        message = f"{name} {reason}" if reason.startswith("must ") else f"{name}: {reason}"
    return " ".join(message.split())


def _add_logging_options(parser: argparse.ArgumentParser, default: object) -> None:
    """-v/--verbose and -q/--quiet, accepted before the verb (``default``: False) and after it (``SUPPRESS``, so
    that a verb's parser does not reset what was given before the verb)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="store_true", default=default, help="debug logging")
    group.add_argument("-q", "--quiet", action="store_true", default=default, help="warnings and errors only")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="transduce", description="Transformer sequence transduction toolkit")
    _add_logging_options(parser, False)
    parser.add_argument("--version", action="version", version=f"transduce {__version__}")
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
        _add_logging_options(p, argparse.SUPPRESS)
        p.set_defaults(_module=mod, _parser=p)
    return parser


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """``unrecognized arguments: --beams 3; did you mean --beam?`` (the hint for the first unknown option)."""
    message = f"unrecognized arguments: {' '.join(extra)}"
    options = [s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings]
    first = next((x.split("=")[0] for x in extra if x.startswith("--")), None)
    close = difflib.get_close_matches(first, options, n=1, cutoff=0.7) if first else []
    return f"{message}; did you mean {close[0]}?" if close else message


def _check_replaced_directories(args: argparse.Namespace, files: Files) -> None:
    """A directory the verb replaces as a whole (``average``, ``export``, ``import-hf`` -o DIR) must not be an
    existing file: refused before any model is loaded."""
    from transduce.commands.options import check_directory_output

    for dest in files.replaced:
        actions = [a for a in args._parser._actions if a.dest == dest and a.help != argparse.SUPPRESS]
        name = "/".join(actions[0].option_strings) if actions else dest
        value = getattr(args, dest, None)
        check_directory_output(value if isinstance(value, str) else None, name)


def main(argv: list[str] | None = None) -> int:
    """Run one ``transduce`` command; returns its exit status: 0, 2 (a refused input or option, one line on standard
    error) or 130 (Ctrl-C, at any moment: while the command runs, or while Python loads its modules around it)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # outside the command's own handling below: the line names no verb it may not know
        print("transduce: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # KEY=VALUE overrides after an option (train CONFIG --preset tiny train.seed=2): argparse takes the positional
    # arguments in one run, so later ones come back unparsed; they are overrides all the same
    if extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:  # left over by the verb's parser (argparse hands them up): the verb reports them
        args._parser.error(_unrecognized(args._parser, extra))
    if args.verbose and args.quiet:  # one before the verb, the other after it
        args._parser.error("-v/--verbose and -q/--quiet exclude each other")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        # an output that is one of the inputs is refused before anything is read or written
        check_arguments(args, args._parser, getattr(args._module, "FILES", Files()))
        _check_replaced_directories(args, getattr(args._module, "FILES", Files()))
        code = int(args._module.run(args) or 0)
    except TransduceError as e:
        print(f"transduce {args.command}: error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"transduce {args.command}: interrupted", file=sys.stderr)
        code = 130
    from transduce.training.distributed import launched_world_size, leave

    if launched_world_size() > 1:  # a torchrun worker, its process group destroyed: see leave()
        leave(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
