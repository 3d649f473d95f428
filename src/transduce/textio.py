"""Reading raw text: plain or gzipped files, one sentence per line, strict UTF-8 with line numbers.

Lines are split on ``b"\\n"`` only. :meth:`str.splitlines` also breaks at U+2028, U+2029, U+0085, form feed and
vertical tab; a sentence containing one of them would become two lines on one side of a parallel corpus and shift
every later pair. Reading bytes and splitting on ``b"\\n"`` keeps the two sides aligned. A trailing ``\\r`` (Windows
line ends) and a UTF-8 byte-order mark at the start of the file are removed.

Translation reads its input with the same helpers, so a bad byte is reported the same way everywhere::

    for lineno, line in read_lines("test.en.gz"):  # lineno counts from 1
        ...
"""

from __future__ import annotations

import gzip
import hashlib
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from transduce.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"


def resolve_corpus_file(prefix: str | Path, lang: str) -> Path:
    """The file of one side of a corpus: ``{prefix}.{lang}``, else ``{prefix}.{lang}.gz``.

    Raises:
        DataError: neither exists.
    """
    plain = Path(f"{prefix}.{lang}")
    gz = Path(f"{prefix}.{lang}.gz")
    for path in (plain, gz):
        if path.is_file():
            return path
    raise DataError(f"{plain}: file not found (nor {gz.name})")


def open_binary(path: str | Path) -> BinaryIO:
    """Open a file for reading bytes, decompressing it when it starts with the gzip magic number.

    ``"-"`` is standard input (never decompressed).

    Raises:
        DataError: the file does not exist or is not readable.
    """
    if str(path) == "-":
        return sys.stdin.buffer
    path = Path(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 (returned to the caller)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None
    if raw.peek(2)[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def decode_line(raw: bytes, path: str | Path, lineno: int) -> str:
    """Decode one line (without its ``\\n``) as strict UTF-8, dropping a trailing ``\\r``.

    Raises:
        DataError: ``path, line N: not valid UTF-8 (byte 0xff at column 7)``; the column counts bytes from 1.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}, line {lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
        ) from None
    if text.endswith("\r"):
        text = text[:-1]
    if lineno == 1 and text.startswith("\ufeff"):
        text = text[1:]
    return text


def iter_raw_lines(path: str | Path) -> Iterator[bytes]:
    """The lines of a plain or gzipped file as bytes, split on ``b"\\n"`` only, without the ``\\n``.

    A final line without a newline is yielded; an empty file yields nothing.

    Raises:
        DataError: the file is missing or is a corrupt or truncated gzip file.
    """
    with open_binary(path) as f:
        try:
            for raw in f:  # binary iteration splits on b"\n" and nothing else
                yield raw[:-1] if raw.endswith(b"\n") else raw
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt or truncated gzip file ({e})") from None


def read_lines(path: str | Path, *, errors: str = "strict") -> Iterator[tuple[int, str]]:
    """The lines of a plain or gzipped text file with their line numbers (from 1).

    Args:
        path: the file (``.gz`` or not, detected from its content) or ``"-"`` for standard input.
        errors: ``"strict"`` raises :class:`DataError` at the first line that is not UTF-8; ``"skip"`` leaves such
            lines out (their numbers are missing from the sequence).

    Returns:
        An iterator of ``(lineno, text)``; ``text`` has no line end.
    """
    if errors not in ("strict", "skip"):
        raise ValueError(f"errors must be 'strict' or 'skip', got {errors!r}")
    for lineno, raw in enumerate(iter_raw_lines(path), start=1):
        try:
            yield lineno, decode_line(raw, path, lineno)
        except DataError:
            if errors == "strict":
                raise


def count_lines(path: str | Path) -> int:
    """The number of lines :func:`iter_raw_lines` yields for ``path``, counted in 1 MiB blocks."""
    count, last = 0, b"\n"
    with open_binary(path) as f:
        try:
            while block := f.read(1 << 20):
                count += block.count(b"\n")
                last = block[-1:]
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt or truncated gzip file ({e})") from None
    return count + (last != b"\n")


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (compressed bytes for a ``.gz`` file), as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def iter_raw_pairs(src_path: str | Path, tgt_path: str | Path) -> Iterator[tuple[int, bytes, bytes]]:
    """Read two files in lockstep as bytes: ``(lineno, src_line, tgt_line)``, ``lineno`` from 1.

    Raises:
        DataError: the files have different numbers of lines; the message names both files and both counts
            (the longer file is counted to its end first). Never a silent zip.
    """
    src_it, tgt_it = iter_raw_lines(src_path), iter_raw_lines(tgt_path)
    lineno = 0
    while True:
        s = next(src_it, None)
        t = next(tgt_it, None)
        if s is None or t is None:
            if s is None and t is None:
                return
            extra = 1 + sum(1 for _ in (tgt_it if s is None else src_it))
            n_src, n_tgt = (lineno, lineno + extra) if s is None else (lineno + extra, lineno)
            raise DataError(
                f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: a parallel corpus needs one line "
                "per sentence on both sides"
            )
        lineno += 1
        yield lineno, s, t


def read_parallel(
    src_path: str | Path, tgt_path: str | Path, *, errors: str = "strict"
) -> Iterator[tuple[int, str | None, str | None]]:
    """Read two text files in lockstep: ``(lineno, src, tgt)`` for every line, ``lineno`` from 1.

    Args:
        src_path, tgt_path: the two sides of a parallel corpus.
        errors: ``"strict"``: a line that is not UTF-8 raises :class:`DataError` naming the file and line;
            ``"skip"``: the pair is yielded with ``None`` for the side(s) that failed to decode.

    Raises:
        DataError: invalid UTF-8 (strict), or the files have different numbers of lines (see
            :func:`iter_raw_pairs`).
    """
    for lineno, s, t in iter_raw_pairs(src_path, tgt_path):
        yield lineno, _decode(s, src_path, lineno, errors), _decode(t, tgt_path, lineno, errors)


def _decode(raw: bytes, path: str | Path, lineno: int, errors: str) -> str | None:
    if errors == "strict":
        return decode_line(raw, path, lineno)
    try:
        return decode_line(raw, path, lineno)
    except DataError:
        return None


def write_lines(lines: Iterator[str] | list[str], path: str | Path) -> None:
    """Write lines as UTF-8 with ``\\n`` ends; gzip-compressed when ``path`` ends in ``.gz`` (test helper too)."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


__all__ = [
    "count_lines",
    "decode_line",
    "iter_raw_lines",
    "iter_raw_pairs",
    "open_binary",
    "read_lines",
    "read_parallel",
    "resolve_corpus_file",
    "sha256_file",
    "write_lines",
]
