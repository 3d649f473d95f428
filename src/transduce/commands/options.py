"""Options that mean the same thing in every verb, spelled the same way everywhere."""

from __future__ import annotations

import argparse
from typing import Any


def add_output_argument(
    parser: argparse.ArgumentParser, help: str, *, metavar: str = "PATH", required: bool = False, **kwargs: Any
) -> None:
    """``-o/--output PATH``; the old spelling ``--out`` is still accepted (hidden from the help)."""
    group: Any = parser.add_mutually_exclusive_group(required=True) if required else parser
    group.add_argument("-o", "--output", dest="output", metavar=metavar, help=help, **kwargs)
    hidden_alias(group, "--out", "output")


def hidden_alias(parser: Any, option: str, dest: str) -> None:
    """Accept ``option`` as another spelling of the option stored in ``dest``, without listing it in the help."""
    parser.add_argument(option, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a beam, a count of hypotheses, a token budget)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def model_and_output(args: argparse.Namespace, what: str) -> tuple[str, str]:
    """``(--model, --output)``, or the two positional paths of the older spelling (``SOURCE OUT_DIR``).

    Raises:
        TransduceError: neither spelling is complete, or both are mixed.
    """
    from transduce.errors import TransduceError

    if args.paths:
        if args.model or args.output or len(args.paths) != 2:
            raise TransduceError(f"unexpected arguments {' '.join(args.paths)}: give --model PATH and -o/--output DIR")
        return args.paths[0], args.paths[1]
    if not args.model or not args.output:
        missing = " and ".join(name for name, v in (("--model", args.model), ("-o/--output", args.output)) if not v)
        raise TransduceError(f"{missing} needed: --model PATH ({what}) and -o/--output DIR")
    return args.model, args.output
