"""The files a verb writes: never one of its inputs, and whole or not at all.

Every verb declares which of its options name what it reads and what it writes (:class:`Files`, a module-level
``FILES`` in ``transduce.commands.<verb>``); the command line calls :func:`check_outputs` before the verb runs, so an
output that is one of the inputs (the same path once links are resolved, or the same file under another name: a hard
link, or standard input or output redirected to it) is refused before anything is read or written.

Output files are written through :func:`open_output` (a text stream) or :func:`replaced_on_success` (a path, for
writers that take one): under a temporary name beside the target, renamed over it only when the writing ends without
an exception. A failure half-way (bad input at line 2,101, Ctrl-C) leaves the old file as it was, or no file where
there was none. ``"-"`` is standard output, written as it comes::

    with open_output(args.output) as out:  # "-": sys.stdout
        for line in lines:
            out.write(line + "\\n")
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from transduce.errors import TransduceError

STDIO = "-"  # the name of standard input (for an input) and standard output (for an output)


@dataclass(frozen=True)
class Files:
    """The options (argparse ``dest`` names) of a verb that name files or directories, for :func:`check_outputs`.

    Attributes:
        inputs: what the verb reads (a file, a directory, a list of them; ``"-"`` is standard input).
        outputs: files it writes, or directories it writes into (``"-"`` is standard output).
        replaced: directories it replaces as a whole: no input may lie inside them either.
    """

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()


class SameFileError(TransduceError):
    """An output that is one of the inputs (or another output)."""


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file or directory: equal once links are resolved, or the same inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def check_outputs(inputs: Iterable[tuple[str, Any]], outputs: Iterable[tuple[str, Any]], *,
                  replaced: Iterable[tuple[str, Any]] = ()) -> None:  # fmt: skip
    """Refuse outputs that would destroy an input, before anything is read or written.

    Args:
        inputs, outputs, replaced: ``(name, value)`` pairs; ``name`` is what the message calls the option
            (``-o/--output``), ``value`` a path, a list of paths or None (not given). ``"-"`` is standard input
            among the inputs and standard output among the outputs: they count when redirected to a file. A
            ``PATH:RANGE`` treebank spec counts as ``PATH``. ``replaced``: output directories replaced as a whole.

    Raises:
        SameFileError: an output (or a replaced directory) is an input or another output, or a replaced directory
            holds an input; one line naming both options and paths.
    """
    read = [(name, path) for name, value in inputs for path in _paths(value)]
    whole = [(name, path) for name, value in replaced for path in _paths(value)]
    written = [(name, path) for name, value in outputs for path in _paths(value)] + whole
    for i, (out_name, out) in enumerate(written):
        for in_name, inp in read:
            if _same((out, True), (inp, False)):
                what = f"{_named(out_name, out, True)} is the same file as {_named(in_name, inp, False)}"
                raise SameFileError(f"{what}: refusing to overwrite an input")
        for other_name, other in written[:i]:
            if _same((out, True), (other, True)):
                what = f"{_named(out_name, out, True)} is the same file as {_named(other_name, other, True)}"
                raise SameFileError(f"{what}: each output needs a file of its own")
    for out_name, out in whole:
        for in_name, inp in read:
            if inp != STDIO and _inside(inp, out):
                raise SameFileError(f"{out_name} {out} holds {in_name} {inp}: refusing to replace a directory "
                                    "that holds an input")  # fmt: skip


def check_arguments(args: Any, parser: Any, files: Files) -> None:
    """:func:`check_outputs` for a verb's parsed arguments: the options ``files`` names, called as the verb's
    ``parser`` (an ``argparse.ArgumentParser``) lists them (``-o/--output``; a positional argument by its metavar)."""

    def named(dests: tuple[str, ...]) -> list[tuple[str, Any]]:
        return [(_option_name(parser, dest), getattr(args, dest, None)) for dest in dests]

    check_outputs(named(files.inputs), named(files.outputs), replaced=named(files.replaced))


def _option_name(parser: Any, dest: str) -> str:
    actions = [a for a in parser._actions if a.dest == dest]
    shown = [a for a in actions if a.help != "==SUPPRESS=="] or actions  # the listed spelling, not a hidden alias
    if not shown:
        return dest
    return "/".join(shown[0].option_strings) or str(shown[0].metavar or dest)


def _paths(value: Any) -> list[str]:
    if value is None or value is False:
        return []
    if isinstance(value, str | os.PathLike):
        value = [value]
    paths = []
    for item in value:
        path = os.fspath(item)
        if path != STDIO and not os.path.exists(path) and ":" in path:  # a treebank spec: PATH:FIRST-LAST
            path = path.rpartition(":")[0] or path
        paths.append(path)
    return paths


def _named(name: str, path: str, output: bool) -> str:
    if path == STDIO:
        return "standard output" if output else "standard input"
    return f"{name} {path}"


def _identity(path: str, output: bool) -> tuple[int, int] | None:
    """(device, inode) of a file; for ``"-"``, of standard output (``output``) or input when it is a regular file."""
    try:
        if path != STDIO:
            info = os.stat(path)
            return info.st_dev, info.st_ino
        info = os.fstat((sys.stdout if output else sys.stdin).fileno())
    except (AttributeError, OSError, ValueError):  # missing; or a replaced (a test's capture) or closed stream
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) else None


def is_special(path: str | Path) -> bool:
    """Whether ``path`` (links followed) is a device, a named pipe or a socket: written in place, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _same(a: tuple[str, bool], b: tuple[str, bool]) -> bool:
    """Whether two ``(path, is an output)`` name one file; ``"-"`` is standard output or input. Writing to a
    device (``/dev/null``) destroys no input, so a device output is nothing's same file."""
    if any(output and path != STDIO and is_special(path) for path, output in (a, b)):
        return False
    if STDIO not in (a[0], b[0]):
        return same_file(a[0], b[0])
    if a == b:  # standard output twice: the verb writes one stream to it, not two files
        return False
    ia, ib = _identity(*a), _identity(*b)
    return ia is not None and ia == ib


def _inside(path: str, directory: str) -> bool:
    """Whether ``path`` lies inside ``directory`` (links resolved)."""
    parent, child = os.path.realpath(directory), os.path.realpath(path)
    return child != parent and child.startswith(parent.rstrip(os.sep) + os.sep)


# ----------------------------------------------------------------------------------------------------------------------
# writing


@contextlib.contextmanager
def replaced_on_success(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends without an exception.

    The writer makes a file or a directory there. On any exception (``KeyboardInterrupt`` included) it is deleted
    and ``path`` is left as it was, or absent; the directories created for it are removed again. A symbolic link
    ``path`` keeps pointing at its file, which is the one replaced. A new file gets the old one's permissions (else
    the usual ones); an old directory is moved aside, the new one renamed into place, then the old one deleted. The
    temporary name keeps the suffix (``.out.tmp-PID-XXXXXXXX.png``), for writers that choose a format by it.

    A ``path`` that is a device, a named pipe or a socket (``/dev/null``, ``/dev/stdout``, a FIFO) cannot be
    replaced: it is yielded itself and written in place, and the node stays what it was.
    """
    if is_special(path):
        yield Path(path)
        return
    target = Path(os.path.realpath(path))
    created = first_missing(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.stem}.tmp-{os.getpid()}-{secrets.token_hex(4)}{target.suffix}")
    try:
        yield tmp
        if tmp.is_dir() and not tmp.is_symlink() and target.is_dir():
            old = target.with_name(f".{target.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
            return
        if target.is_file():
            shutil.copymode(target, tmp)
        os.replace(tmp, target)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        if created is not None:
            _remove_empty_dirs(created, target.parent)
        raise


@contextlib.contextmanager
def open_output(path: str | Path, *, encoding: str = "utf-8") -> Iterator[TextIO]:
    """A text stream (``\\n`` line ends) that replaces ``path`` only when the block ends without an exception (see
    :func:`replaced_on_success`). ``"-"`` is standard output, reconfigured to ``encoding`` and written as it comes."""
    if str(path) == STDIO:
        sys.stdout.reconfigure(encoding=encoding, newline="\n")  # type: ignore[union-attr]
        yield sys.stdout
        sys.stdout.flush()
        return
    with replaced_on_success(path) as tmp, open(tmp, "w" if is_special(tmp) else "x", encoding=encoding,
                                                newline="\n") as f:  # fmt: skip
        yield f


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` by ``text`` (UTF-8) whole, or leave it as it was (see :func:`open_output`)."""
    with open_output(path) as f:
        f.write(text)


def first_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist yet (what creating ``path`` creates)."""
    missing = None
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def remove_empty_tree(directory: Path) -> None:
    """Remove ``directory`` if it holds only empty directories (what a command that failed early leaves)."""
    if not directory.is_dir():
        return
    for sub, _, files in sorted(os.walk(directory), key=lambda entry: -len(entry[0])):  # deepest first
        if files:
            return
        try:
            os.rmdir(sub)
        except OSError:  # not empty after all (a file appeared, or another process's): keep it
            return


@contextlib.contextmanager
def directories_removed_on_failure(directory: str | Path) -> Iterator[None]:
    """If the ``with`` block raises, remove the directories that making ``directory`` created (those missing when
    the block began) where they hold only empty directories; a directory that was there before is left alone."""
    created = first_missing(Path(directory))
    try:
        yield
    except BaseException:
        if created is not None:
            remove_empty_tree(created)
        raise


def _remove_empty_dirs(top: Path, deepest: Path) -> None:
    """Remove ``deepest`` and its parents up to ``top`` while they are empty."""
    for directory in (deepest, *deepest.parents):
        try:
            directory.rmdir()
        except OSError:  # not empty (another process wrote there) or gone
            return
        if directory == top:
            return


__all__ = [
    "STDIO",
    "Files",
    "SameFileError",
    "check_arguments",
    "check_outputs",
    "open_output",
    "replaced_on_success",
    "same_file",
    "write_text",
]
