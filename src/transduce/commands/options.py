"""Options that mean the same thing in every verb, spelled the same way everywhere."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any


def add_output_argument(
    parser: argparse.ArgumentParser, help: str, *, metavar: str = "PATH", required: bool = False, **kwargs: Any
) -> None:
    """``-o/--output PATH``; the old spelling ``--out`` is still accepted (hidden from the help)."""
    group: Any = parser.add_mutually_exclusive_group(required=True) if required else parser
    group.add_argument("-o", "--output", dest="output", metavar=metavar, help=help, **kwargs)
    hidden_alias(group, "--out", "output")


def add_source_input_arguments(parser: argparse.ArgumentParser) -> None:
    """``-i/--input`` (source text, or the source side of a TSV / JSON Lines corpus) and ``--src-field``."""
    parser.add_argument(
        "-i", "--input", default="-", metavar="FILE",
        help="source text (default: stdin; .gz is read), or the source side of a corpus as prepare reads it: "
        "FILE.tsv (source<TAB>target) or FILE.jsonl (--src-field)",
    )  # fmt: skip
    parser.add_argument(
        "--src-field", metavar="NAME", help="JSON Lines input: the field of the source (default: src; a.b nests)"
    )


def hidden_alias(parser: Any, option: str, dest: str) -> None:
    """Accept ``option`` as another spelling of the option stored in ``dest``, without listing it in the help."""
    parser.add_argument(option, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a beam, a count of hypotheses, a token budget)."""
    return _bounded(int, text, 1, None)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (a length bonus, an n-gram size where 0 is off, a thread count)."""
    return _bounded(int, text, 0, None)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0-65535 (0: any free port)."""
    return _bounded(int, text, 0, 65535)


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (a length penalty, a length factor, a wait)."""
    return _bounded(float, text, 0, None)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (a temperature, a time budget)."""
    return _bounded(float, text, 0, None, open_low=True)


def probability(text: str) -> float:
    """An argparse type: a number in (0, 1] (nucleus sampling's mass)."""
    return _bounded(float, text, 0, 1, open_low=True)


def language_code(text: str) -> str:
    """An argparse type: a language code (``fr``, ``fra``, ``zho_Hans``; :func:`transduce.text.langs.check_code`), so
    that a malformed one is refused before the model is loaded: ``--tgt-lang must be a language code ... (got
    'French')``."""
    from transduce.text.langs import LanguageError, check_code

    try:
        return check_code(text)
    except LanguageError:
        raise argparse.ArgumentTypeError(
            f"must be a language code: ISO 639-1 or 639-3, 2 or 3 lowercase letters, optionally _Script, e.g. fr, "
            f"fra, zho_Hans (got {text!r})"
        ) from None


def _bounded(kind: type, text: str, low: float, high: float | None, *, open_low: bool = False) -> Any:
    """``kind(text)`` if it is finite and within ``[low, high]`` (``(low, high]`` with ``open_low``); else the
    one-line reason for argparse, which the CLI prints after the option's name: ``--beam must be >= 1 (got 0)``."""
    if high is None:
        bounds = f"> {low}" if open_low else f">= {low}"
    else:
        bounds = f"in ({low}, {high}]" if open_low else f"between {low} and {high}"
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"must be {noun} {bounds} (got {text!r})") from None
    below = value <= low if open_low else value < low
    if not math.isfinite(value) or below or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"must be {bounds} (got {text})")
    return value


def check_file_output(path: str | None, option: str) -> None:
    """Refuse, before any work, a file output that names an existing directory (``"-"``, standard output, passes).

    Raises:
        TransduceError: ``-o/--output runs/x: is a directory; give a file name``.
    """
    from transduce.errors import TransduceError

    if path and path != "-" and Path(path).is_dir():
        raise TransduceError(f"{option} {path}: is a directory; give a file name")


def check_directory_output(path: str | None, option: str) -> None:
    """Refuse, before any work, a directory output that names an existing file (which writing would replace).

    Raises:
        TransduceError: ``-o/--output notes.txt: exists and is not a directory; ...``.
    """
    from transduce.errors import TransduceError

    if path and Path(path).exists() and not Path(path).is_dir():
        raise TransduceError(f"{option} {path}: exists and is not a directory; refusing to replace a file")


def model_and_output(args: argparse.Namespace, what: str) -> tuple[str, str]:
    """``(--model, --output)``, or the two positional paths of the older spelling (``SOURCE OUT_DIR``).

    Raises:
        TransduceError: neither spelling is complete, or both are mixed; the output is the model (or holds it).
    """
    from transduce.errors import TransduceError
    from transduce.files import check_outputs

    if args.paths:
        if args.model or args.output or len(args.paths) != 2:
            raise TransduceError(f"unexpected arguments {' '.join(args.paths)}: give --model PATH and -o/--output DIR")
        # the older spelling: the command line's check saw two inputs, not a model and an output
        check_outputs([("--model", args.paths[0])], [], replaced=[("-o/--output", args.paths[1])])
        return args.paths[0], args.paths[1]
    if not args.model or not args.output:
        missing = " and ".join(name for name, v in (("--model", args.model), ("-o/--output", args.output)) if not v)
        raise TransduceError(f"{missing} needed: --model PATH ({what}) and -o/--output DIR")
    return args.model, args.output
