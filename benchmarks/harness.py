"""The harness every benchmark script uses: common arguments, the machine line, timing and markdown tables.

Not a benchmark itself; the scripts import it (``python benchmarks/X.py`` puts ``benchmarks/`` on ``sys.path``).

- :func:`add_common_args` / :func:`apply_common_args`: ``--threads`` (torch's intra-op threads) and ``--reps``;
- :func:`machine`: one line saying what ran: the date, torch, threads, the CPU and its vector extensions, the
  allocator, the load average and transduce's fast paths (:mod:`transduce.fastpaths`), printed first by every
  script so that a table never travels without it;
- :func:`median_seconds`, :func:`interleaved` and :func:`interleaved_pieces`: medians of repeated runs, contenders
  interleaved in rotating order (whole runs, or part by part) so that a noisy machine slows them alike;
- :func:`table`: a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from transduce import fastpaths

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def add_common_args(ap: argparse.ArgumentParser, *, threads: int = 0, reps: int | None = 3) -> None:
    """``--threads`` (default ``threads``; 0: torch's default) and, unless ``reps`` is None, ``--reps``."""
    ap.add_argument("--threads", type=int, default=threads, help="torch intra-op threads; 0: torch's default")
    if reps is not None:
        ap.add_argument("--reps", type=int, default=reps, help="timed repetitions (the median is reported)")


def apply_common_args(args: argparse.Namespace) -> None:
    """Set torch's threads from ``--threads`` (0 leaves torch's default)."""
    if args.threads:
        torch.set_num_threads(args.threads)


# ----------------------------------------------------------------------------------------------------------------------
# the machine


def tcmalloc_loaded() -> bool:
    """True when tcmalloc is mapped into this process (``LD_PRELOAD``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            return "tcmalloc" in f.read()
    except OSError:
        return "tcmalloc" in os.environ.get("LD_PRELOAD", "")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_native_bf16() -> bool:
    """Whether the CPU has bf16 matrix instructions (AVX512-BF16 or AMX), so that bf16 autocast can be fast."""
    from transduce.training.trainer import cpu_has_native_bf16 as has_bf16

    return has_bf16()


def cpu_features() -> str:
    """PyTorch's vector extension (``AVX512``, ``AVX2``, ...) and the CPU's int8 and bf16 extensions that transduce's
    choices read (:func:`transduce.fastpaths.cpu_features`): VNNI, AVX512-BF16, AMX."""
    cpu = fastpaths.cpu_features()
    extras = [name for name, present in (("VNNI", cpu.vnni), ("AVX512-BF16", cpu.avx512_bf16), ("AMX", cpu.amx_bf16))
              if present]  # fmt: skip
    return cpu.capability + "".join(f", {x}" for x in extras)


def machine() -> str:
    """One line: date, torch, threads, CPU, vector extensions, allocator, load average, transduce's fast paths."""
    alloc = "tcmalloc (LD_PRELOAD)" if tcmalloc_loaded() else f"glibc malloc (tcmalloc: LD_PRELOAD={TCMALLOC})"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    return (
        f"{today}; torch {torch.__version__}, {torch.get_num_threads()} threads; {cpu_name()} ({os.cpu_count()} "
        f"cores; {cpu_features()}); allocator: {alloc}; load average {load}; fast paths: "
        f"{fastpaths.settings.describe()}"
    )


# ----------------------------------------------------------------------------------------------------------------------
# timing


def _run(fn: Callable[[], float | None]) -> float:
    start = time.perf_counter()
    took = fn()
    return took if took is not None else time.perf_counter() - start


def median_seconds(fn: Callable[[], float | None], reps: int, warmup: int = 1) -> float:
    """Median over ``reps`` calls of ``fn`` after ``warmup`` untimed ones: its return value when it returns seconds
    (it timed itself), else the call's wall time."""
    for _ in range(warmup):
        fn()
    return statistics.median(_run(fn) for _ in range(reps))


def interleaved(fns: dict[str, Callable[[], float | None]], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Each of ``fns`` run ``reps`` times (after ``warmup`` untimed runs each), interleaved: repetition r starts
    with the r-th contender, so that none always runs first (or right after the same one). Returns each one's
    seconds per repetition (its return value when it returns seconds, else its wall time)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for rep in range(reps):
        for name in order[rep % len(order) :] + order[: rep % len(order)]:
            times[name].append(_run(fns[name]))
    return times


def interleaved_pieces(fns: dict[str, Callable[[int], object]], pieces: int, reps: int) -> dict[str, list[float]]:
    """Like :func:`interleaved` for work that comes in ``pieces`` parts (the batches of a test set): every
    contender does part i before any goes on to part i + 1, in an order that rotates with the part and the
    repetition, so that a slow moment of the machine (seconds long on a shared host) falls on all of them rather
    than on the one whose whole run it meets. ``fns[name](i)`` does part i. Returns each one's seconds per
    repetition (the sum over its parts), no untimed warm-up."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for rep in range(reps):
        total = dict.fromkeys(fns, 0.0)
        for i in range(pieces):
            turn = (rep + i) % len(order)
            for name in order[turn:] + order[:turn]:
                start = time.perf_counter()
                fns[name](i)
                total[name] += time.perf_counter() - start
        for name in fns:
            times[name].append(total[name])
    return times


# ----------------------------------------------------------------------------------------------------------------------
# tables


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table: ``header`` and one line per row (cells as ``str`` gives them)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
