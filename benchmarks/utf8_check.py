"""The UTF-8 check of `transduce prepare` (transduce.text.textio.scan_text: counts lines and finds those that are not
UTF-8, in 1 MiB blocks): seconds per file size, on Latin-1 text (every other line has a byte that is not UTF-8) and
on the same text in UTF-8 (no bad line), so that the cost of the bad lines shows beside the plain scan.

    python benchmarks/utf8_check.py --sizes 64K,1M,8M --reps 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness import add_common_args, apply_common_args, machine, median_seconds, table
from transduce.text.textio import scan_text

# two lines: one with accented letters (bytes >= 0x80 in Latin-1, multi-byte characters in UTF-8), one plain
LINES = "Ein Bär läuft über die Straße, café crème à la française.\nA man rides a bike down the street.\n"
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``64K``, ``8M``, ``1G`` or a number of bytes."""
    text = text.strip().upper()
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def write_text(path: Path, size: int, encoding: str) -> int:
    """Whole copies of :data:`LINES` in ``encoding`` up to ``size`` bytes; returns the bytes written."""
    unit = LINES.encode(encoding)
    data = unit * max(1, size // len(unit))
    path.write_bytes(data)
    return len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64K,1M,8M", help="comma-separated file sizes (K, M, G suffixes)")
    add_common_args(parser, threads=1, reps=3)  # (pure byte work: torch's threads play no part)
    args = parser.parse_args()
    apply_common_args(args)
    print(machine())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in map(parse_size, args.sizes.split(",")):
            for encoding in ("latin-1", "utf-8"):
                path = Path(tmp) / f"{encoding}.txt"
                written = write_text(path, size, encoding)
                scan = scan_text(path)
                seconds = median_seconds(lambda path=path: scan_text(path) and None, reps=args.reps)  # None: wall time
                mib = written / (1 << 20)
                rows.append((f"{mib:.2f} MiB", encoding, scan.lines, scan.invalid, f"{seconds:.4f}",
                             f"{mib / seconds:,.0f}"))  # fmt: skip
    print(table(("size", "text", "lines", "lines not UTF-8", "seconds", "MiB/s"), rows))


if __name__ == "__main__":
    main()
