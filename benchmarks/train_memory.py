"""Peak memory and speed of training a config: ``transduce train`` for N updates, then its validation and its
checkpoint, run in this process and measured from inside it.

    python benchmarks/train_memory.py configs/multi30k_en_de.yaml --updates 300 --threads 1 \\
        data.prepared=/tmp/prepared/multi30k_en_de
    python benchmarks/train_memory.py configs/ptb_parse.yaml --updates 300 --threads 1 --unbounded \\
        data.prepared=/tmp/prepared/ptb_parse

Arguments after the options are the config's dotted overrides, as for ``transduce train``; ``data.prepared`` reuses
a directory made by ``transduce prepare --config CONFIG -o DIR``. The run goes to a temporary directory (removed
after it; ``--run-dir`` keeps it), validates and saves a checkpoint once, after update N (``train.valid_every=N``,
``train.save_every_minutes=0``), and where the config's warm-up is not shorter than N updates, warms up over N/10.

Prints the machine line, then a table row: updates/s (wall time) and CPU seconds per update over updates 21-N
(the first 20 fill oneDNN's caches and the allocator's), the peak RSS through the updates, the RSS held after them
(the median of the RSS measured after each update of the second half), and the peak RSS of the whole run,
validation and checkpoint included (``getrusage``'s ``ru_maxrss``, start-up included). CPU seconds per update
move less than wall time when other jobs share the machine.

``--unbounded`` measures training as it was before :mod:`transduce.training.memory`: oneDNN's and ideep's caches at
their default capacities (1,024 entries each) and the C library's allocator for every tensor (no block cache). The
environment is read when the process makes its first oneDNN primitive, so each setting needs its own process.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import add_common_args, machine, table

SKIP = 20  # updates left out of the speed figures (the caches fill meanwhile)


def rss_mib() -> float:
    """This process's resident memory now, in MiB (Linux: /proc/self/statm)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path, help="the training config (YAML)")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    ap.add_argument("--updates", type=int, default=300, help="updates to train (default 300)")
    add_common_args(ap, threads=1, reps=None)  # --threads: train.threads
    ap.add_argument(
        "--unbounded",
        action="store_true",
        help="default oneDNN cache capacities, no block cache (training before transduce.training.memory)",
    )
    ap.add_argument("--run-dir", type=Path, help="train into this directory and keep it (default: a temporary one)")
    args = ap.parse_intermixed_args()
    if args.updates <= SKIP:
        ap.error(f"--updates must be > {SKIP}")
    if args.unbounded:  # before torch makes its first oneDNN primitive
        os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = os.environ["LRU_CACHE_CAPACITY"] = "1024"

    from transduce import fastpaths
    from transduce.config import Config
    from transduce.training import memory
    from transduce.training.train import train
    from transduce.training.trainer import StepResult, Trainer

    if args.unbounded:
        fastpaths.settings.block_cache = False
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="train_memory_"))
    n = args.updates
    overrides = [*args.overrides, f"train.max_steps={n}", f"train.valid_every={n}", "train.save_every_minutes=0",
                 f"train.threads={args.threads}", f"train.run_dir={run_dir}"]  # fmt: skip
    if Config.load(args.config, overrides=args.overrides).train.warmup_steps >= n:
        overrides.append(f"train.warmup_steps={max(1, n // 10)}")
    config = Config.load(args.config, overrides=overrides)

    # after each update: wall time, CPU time, RSS, peak RSS
    marks: list[tuple[float, float, float, float]] = []
    train_step = Trainer.train_step

    caps: dict[str, str] = {}  # oneDNN's and ideep's capacities in the environment while training

    def measured_step(self: Trainer, *a: Any, **kw: Any) -> StepResult:
        result = train_step(self, *a, **kw)
        caps.update((v, os.environ.get(v, "1024 (default)")) for v in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                                                                         "LRU_CACHE_CAPACITY"))  # fmt: skip
        if not result.skipped:
            marks.append((time.perf_counter(), time.process_time(), rss_mib(), peak_rss_mib()))
        return result

    Trainer.train_step = measured_step  # type: ignore[method-assign]
    print(machine())
    bound = "unbounded (before transduce.training.memory)" if args.unbounded else "bounded (transduce.training.memory)"
    print(f"{args.config}: {n} updates, {args.threads} thread(s), {bound}")
    try:
        outcome = train(config)
    finally:
        Trainer.train_step = train_step  # type: ignore[method-assign]
        if args.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
    if outcome.exit_code != 0 or len(marks) < n:
        sys.exit(f"train_memory: the run ended after {len(marks)} of {n} updates ({outcome.reason})")
    (t0, c0, _, _), (t1, c1, _, peak_updates) = marks[SKIP - 1], marks[-1]
    held = statistics.median(m[2] for m in marks[n // 2 :])
    stats = memory.block_cache_stats()
    print(f"oneDNN caches: {', '.join(f'{k}={v}' for k, v in caps.items())}; block cache: " + (
        "off" if not stats or args.unbounded else
        f"peak in use {stats['peak_in_use_bytes'] / 2**20:,.0f} MiB, {stats['maps']:,} maps, {stats['reuses']:,} "
        f"reuses, {stats['unmaps']:,} unmaps"))  # fmt: skip
    row = {
        "config": args.config.name,
        "memory": "unbounded" if args.unbounded else "bounded",
        "updates/s": f"{(n - SKIP) / (t1 - t0):.3f}",
        "CPU s/update": f"{(c1 - c0) / (n - SKIP):.3f}",
        "peak RSS, updates (MiB)": f"{peak_updates:,.0f}",
        "RSS held (MiB)": f"{held:,.0f}",
        "peak RSS, run (MiB)": f"{peak_rss_mib():,.0f}",
    }
    print(table(list(row), [list(row.values())]))


if __name__ == "__main__":
    main()
