"""Reading raw text: plain or gzipped files, one sentence per line, strict UTF-8 with line numbers.

Lines are split on ``b"\\n"`` only. :meth:`str.splitlines` also breaks at U+2028, U+2029, U+0085, form feed and
vertical tab; a sentence containing one of them would become two lines on one side of a parallel corpus and shift
every later pair. Reading bytes and splitting on ``b"\\n"`` keeps the two sides aligned. A trailing ``\\r`` (Windows
line ends) and a UTF-8 byte-order mark at the start of the file are removed.

A line that is not UTF-8 is handled by one rule, :func:`decode_line`: raise (naming file, line and byte), skip it,
or keep it with U+FFFD for each bad byte. Preparation, validation references and translation all read through it,
so a bad byte is reported and replaced the same way everywhere::

    for lineno, line in read_lines("test.en.gz"):  # lineno counts from 1
        ...
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from transduce.errors import DataError

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"
ERRORS = ("strict", "skip", "replace")  # what readers may do with a line that is not UTF-8
UTF8_BOM = b"\xef\xbb\xbf"


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
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a text file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None
    if raw.peek(2)[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def decode_line(raw: bytes, path: str | Path, lineno: int, errors: str = "strict", *, hint: str = "") -> str | None:
    """Decode one line (as :func:`iter_raw_lines` yields it) as UTF-8: the one rule every reader of text follows.

    Args:
        raw, path, lineno: the line's bytes, its file and its number (from 1), for the message.
        errors: what to do when the line is not UTF-8. ``"strict"``: raise :class:`DataError`; ``"skip"``: return
            None; ``"replace"``: return the text with U+FFFD for each bad byte and log a warning naming the line.
        hint: appended to the strict error message after ``"; "`` (how to get past it).

    Raises:
        DataError: ``path, line N: not valid UTF-8 (byte 0xff at column 7)``; the column counts bytes from 1.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        message = f"{path}, line {lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
    if errors == "skip":
        return None
    if errors == "replace":
        log.warning("%s: replaced the invalid bytes with U+FFFD", message)
        return raw.decode("utf-8", errors="replace")
    raise DataError(f"{message}; {hint}" if hint else message)


def iter_raw_lines(path: str | Path) -> Iterator[bytes]:
    """The lines of a plain or gzipped file as bytes, split on ``b"\\n"`` only, without ``\\n`` or ``\\r\\n``.

    A UTF-8 byte-order mark at the start of the file is removed. A final line without a newline is yielded; an
    empty file yields nothing.

    Raises:
        DataError: the file is missing or is a corrupt or truncated gzip file.
    """
    f = open_binary(path)
    with f if f is not sys.stdin.buffer else contextlib.nullcontext(f):  # never close standard input
        try:
            first = f.readline()
            if first:
                yield (first[3:] if first.startswith(UTF8_BOM) else first).rstrip(b"\r\n")
            for raw in f:  # binary iteration splits on b"\n" and nothing else
                yield raw.rstrip(b"\r\n")  # one \n; \r of Windows line ends
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt or truncated gzip file ({e})") from None


def read_lines(path: str | Path, *, errors: str = "strict", hint: str = "") -> Iterator[tuple[int, str]]:
    """The lines of a plain or gzipped text file with their line numbers (from 1).

    Args:
        path: the file (``.gz`` or not, detected from its content) or ``"-"`` for standard input.
        errors: for lines that are not UTF-8 (see :func:`decode_line`): ``"strict"`` raises :class:`DataError` at
            the first; ``"skip"`` leaves them out (their numbers are missing from the sequence); ``"replace"`` keeps
            them with U+FFFD for each bad byte (and a warning), so every line is there.
        hint: appended to the strict error message.

    Returns:
        An iterator of ``(lineno, text)``; ``text`` has no line end.
    """
    if errors not in ERRORS:
        raise ValueError(f"errors must be one of {', '.join(map(repr, ERRORS))}, got {errors!r}")
    for lineno, raw in enumerate(iter_raw_lines(path), start=1):
        text = decode_line(raw, path, lineno, errors, hint=hint)
        if text is not None:
            yield lineno, text


def count_lines(path: str | Path) -> int:
    """The number of lines :func:`iter_raw_lines` yields for ``path``, counted in 1 MiB blocks."""
    return scan_text(path).lines


@dataclass
class TextScan:
    """What :func:`scan_text` found in a file."""

    lines: int  # lines as iter_raw_lines counts them
    invalid: int  # lines that are not valid UTF-8
    first_invalid: str  # the DataError message for the first of them ("" if none)


def scan_text(path: str | Path) -> TextScan:
    """Count the lines of a file and check that they are UTF-8, fast: 1 MiB blocks, no per-line Python work.

    Raises:
        DataError: the file is missing or is a corrupt or truncated gzip file.
    """
    lines = invalid = 0
    first_invalid, tail = "", b""
    with open_binary(path) as f:
        try:
            while block := f.read(1 << 20):
                cut = block.rfind(b"\n") + 1
                if not cut:
                    tail += block
                    continue
                text, tail = tail + block[:cut], block[cut:]
                bad = _invalid_lines(text)
                if bad and not first_invalid:
                    first_invalid = _utf8_message(text, bad[0], path, lines)
                invalid += len(bad)
                lines += text.count(b"\n")
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt or truncated gzip file ({e})") from None
    if tail:
        text = tail + b"\n"
        bad = _invalid_lines(text)
        if bad and not first_invalid:
            first_invalid = _utf8_message(text, bad[0], path, lines)
        invalid += len(bad)
        lines += 1
    return TextScan(lines, invalid, first_invalid)


# the first character of a line that stands for a byte that is not UTF-8, and the rest of that line
_ESCAPED_LINE = re.compile("[\udc80-\udcff][^\n]*")


def _invalid_lines(text: bytes) -> list[int]:
    """Byte offsets of the first bad byte of every line of ``text`` (whole lines) that is not UTF-8.

    Linear in ``len(text)``, however many lines are bad: one decoding pass that turns each bad byte into a lone
    surrogate (``surrogateescape``; valid UTF-8 never decodes to one), one regular-expression pass that finds the
    first of them on each line, and the byte offsets counted forward from one match to the next.
    """
    try:
        text.decode("utf-8")
        return []  # the common case, at the decoder's full speed
    except UnicodeDecodeError:
        pass
    decoded = text.decode("utf-8", "surrogateescape")
    bad, offset, char = [], 0, 0
    for match in _ESCAPED_LINE.finditer(decoded):
        offset += len(decoded[char : match.start()].encode("utf-8", "surrogateescape"))
        char = match.start()
        bad.append(offset)
    return bad


def _utf8_message(text: bytes, offset: int, path: str | Path, lines_before: int) -> str:
    line_start = text.rfind(b"\n", 0, offset) + 1
    lineno = lines_before + text.count(b"\n", 0, offset) + 1
    column = offset - line_start + 1 - (3 if lineno == 1 and text.startswith(UTF8_BOM) else 0)
    return f"{path}, line {lineno}: not valid UTF-8 (byte 0x{text[offset]:02x} at column {column})"


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
            raise DataError(line_count_error(src_path, n_src, tgt_path, n_tgt))
        lineno += 1
        yield lineno, s, t


def line_count_error(src_path: str | Path, n_src: int, tgt_path: str | Path, n_tgt: int) -> str:
    """The message for two sides of a corpus with different numbers of lines."""
    return (
        f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: a parallel corpus needs one line per sentence "
        "on both sides"
    )


def read_parallel(
    src_path: str | Path, tgt_path: str | Path, *, errors: str = "strict"
) -> Iterator[tuple[int, str | None, str | None]]:
    """Read two text files in lockstep: ``(lineno, src, tgt)`` for every line, ``lineno`` from 1.

    Args:
        src_path, tgt_path: the two sides of a parallel corpus.
        errors: ``"strict"``: a line that is not UTF-8 raises :class:`DataError` naming the file and line;
            ``"skip"``: the pair is yielded with ``None`` for the side(s) that failed to decode; ``"replace"``: with
            U+FFFD for each bad byte (see :func:`decode_line`).

    Raises:
        DataError: invalid UTF-8 (strict), or the files have different numbers of lines (see
            :func:`iter_raw_pairs`).
    """
    for lineno, s, t in iter_raw_pairs(src_path, tgt_path):
        yield lineno, decode_line(s, src_path, lineno, errors), decode_line(t, tgt_path, lineno, errors)


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
    "line_count_error",
    "open_binary",
    "read_lines",
    "read_parallel",
    "resolve_corpus_file",
    "scan_text",
    "sha256_file",
    "write_lines",
]
