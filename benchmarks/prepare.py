"""Speed and memory of ``transduce prepare`` and of the token-budget sampler; prints Markdown tables.

    python benchmarks/prepare.py                       # Multi30k + synthetic 0.5M and 2M pairs
    python benchmarks/prepare.py --sizes 100000        # quicker
    python benchmarks/prepare.py --skip-synthetic      # Multi30k only

Each preparation runs in a fresh child process so that its peak resident memory (``ru_maxrss``) is its own: the
parent process (reading, writing, the vocabulary sample, SentencePiece training) and the largest encoding worker
are reported separately. The vocabulary is trained on a sample of ``--sample`` sentences, smaller than every
corpus, so the two sizes differ only in the amount of text streamed through: peak memory should not move.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import add_common_args, apply_common_args, machine, table

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


# ----------------------------------------------------------------------------------------------------------------------
# synthetic corpus


def make_corpus(prefix: Path, pairs: int, seed: int = 0) -> None:
    """Write ``pairs`` synthetic sentence pairs: Zipf-distributed made-up words, 3-40 words, target = a word-wise
    mapping with some reordering, so lengths, vocabulary growth and subword splits look like real text."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ten", "sar", "vu", "dre", "po", "nix", "al", "be", "sch", "ü", "ö", "qua", "r"]
    n_words = 50_000
    parts = rng.integers(0, len(syllables), size=(n_words, 4))
    word_len = rng.integers(1, 5, size=n_words)
    src_words = ["".join(syllables[p] for p in row[:k]) for row, k in zip(parts, word_len)]
    tgt_words = [w[::-1] + "en" for w in src_words]
    ranks = np.arange(1, n_words + 1)
    probs = 1 / ranks**1.1
    probs /= probs.sum()
    block = 100_000
    with open(f"{prefix}.src", "w", encoding="utf-8") as fs, open(f"{prefix}.tgt", "w", encoding="utf-8") as ft:
        for start in range(0, pairs, block):
            n = min(block, pairs - start)
            lengths = np.clip(rng.gamma(4.0, 3.5, size=n).astype(int), 3, 40)
            ids = rng.choice(n_words, size=int(lengths.sum()), p=probs)
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            src_lines, tgt_lines = [], []
            for i in range(n):
                sent = ids[bounds[i] : bounds[i + 1]]
                src_lines.append(" ".join(src_words[j] for j in sent) + " .")
                tgt = [tgt_words[j] for j in sent]
                if len(tgt) > 3:
                    tgt[1], tgt[2] = tgt[2], tgt[1]
                tgt_lines.append(" ".join(tgt) + " .")
            fs.write("\n".join(src_lines) + "\n")
            ft.write("\n".join(tgt_lines) + "\n")


# ----------------------------------------------------------------------------------------------------------------------
# one preparation in a child process


def child(args: argparse.Namespace) -> None:
    """Runs in the child: prepare, then print a JSON line with time and peak memory."""
    from transduce.config import DataConfig
    from transduce.data import prepare

    cfg = DataConfig(**json.loads(args.child))
    started = time.perf_counter()
    manifest = prepare(cfg, args.out)
    seconds = time.perf_counter() - started
    kib = 1024 if sys.platform != "darwin" else 1
    result = {
        "seconds": seconds,
        "pairs": manifest["inputs"]["train"]["src"]["lines"],
        "kept": manifest["splits"]["train"]["pairs"],
        "main_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib / 2**20,
        "worker_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib / 2**20,
    }
    print("RESULT " + json.dumps(result), flush=True)


def run_prepare(cfg: dict, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # else prepare would reuse it and measure nothing
    argv = [sys.executable, __file__, "--child", json.dumps(cfg), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"prepare failed:\n{done.stderr}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


# ----------------------------------------------------------------------------------------------------------------------
# the sampler


def sampler_speed(prepared: Path, max_tokens: int) -> dict:
    from transduce.data import ParallelDataset, TokenBatchSampler, collate

    ds = ParallelDataset(prepared, "train")
    started = time.perf_counter()
    sampler = TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, max_tokens, seed=1)
    build = time.perf_counter() - started
    started = time.perf_counter()
    n = sum(1 for _ in sampler.iter_from(1))
    iterate = time.perf_counter() - started
    started = time.perf_counter()
    k = 0
    for indices in sampler.iter_from(2):
        collate([ds[i] for i in indices])
        k += 1
        if time.perf_counter() - started > 10:
            break
    with_collate = time.perf_counter() - started
    return {"pairs": len(ds), "batches": n, "build_s": build, "batches_per_s": n / iterate,
            "collate_batches_per_s": k / with_collate}  # fmt: skip


def padding_table(prepared: Path) -> str:
    from transduce.data import ParallelDataset, TokenBatchSampler, padding_stats

    ds = ParallelDataset(prepared, "train")
    rows = []
    for max_tokens in (2048, 4096, 8192, 25000):
        s = padding_stats(TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, max_tokens, seed=1))
        rows.append((max_tokens, s["batches"], f"{s['sentences'] / s['batches']:.0f}", f"{s['src_padding_share']:.1%}",
                     f"{s['tgt_padding_share']:.1%}", f"{s['padding_share']:.1%}"))  # fmt: skip
    header = ("max_tokens", "batches", "sentences/batch", "padding src", "padding tgt", "padding both")
    return table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[500_000, 2_000_000], help="synthetic corpus sizes")
    parser.add_argument("--sample", type=int, default=200_000, help="input_sentence_size for the synthetic runs")
    parser.add_argument("--workers", type=int, default=0, help="encoding processes (0: all cores)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="sampler budget for the speed measurement")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--workdir", help="where corpora and outputs go (default: a temporary directory)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    add_common_args(parser, reps=None)
    args = parser.parse_args()
    apply_common_args(args)
    if args.child:
        return child(args)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="transduce-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(machine())
    print(f"Python {platform.python_version()}, encoding workers: {args.workers or os.cpu_count()}\n")

    if (MULTI30K / "train.en.gz").is_file():
        cfg = {"train": str(MULTI30K / "train"), "valid": str(MULTI30K / "val"),
               "test": [str(MULTI30K / "test_2016_flickr")], "vocab_size": 8000, "workers": args.workers}  # fmt: skip
        r = run_prepare(cfg, work / "multi30k")
        print("### Multi30k En-De (train 29k + val 1,014 + test 1,000; joint BPE 8k)\n")
        cells = [(f"{r['pairs']:,}", f"{r['seconds']:.1f} s", f"{r['pairs'] / r['seconds']:,.0f}",
                  f"{r['main_peak_mib']:.0f} MiB", f"{r['worker_peak_mib']:.0f} MiB")]  # fmt: skip
        print(table(("pairs", "prepare time", "pairs/s", "peak RSS main", "peak RSS worker"), cells) + "\n")
        print("Padding share of training batches (token budget per side, padding and eos/bos counted):\n")
        print(padding_table(work / "multi30k") + "\n")
    else:
        print(f"(Multi30k not found at {MULTI30K}; skipped)\n")

    if args.skip_synthetic:
        return None
    rows = []
    for size in args.sizes:
        prefix = work / f"synth{size}"
        if not Path(f"{prefix}.tgt").is_file():
            started = time.perf_counter()
            make_corpus(prefix, size)
            print(f"(generated {size:,} synthetic pairs in {time.perf_counter() - started:.0f} s)", file=sys.stderr)
        cfg = {"src_lang": "src", "tgt_lang": "tgt", "train": str(prefix), "vocab_size": 8000,
               "input_sentence_size": args.sample, "workers": args.workers}  # fmt: skip
        r = run_prepare(cfg, work / f"prepared{size}")
        r["size"] = size
        r["mib"] = (Path(f"{prefix}.src").stat().st_size + Path(f"{prefix}.tgt").stat().st_size) / 2**20
        rows.append(r)
    print(f"### Synthetic corpora (vocabulary sample {args.sample:,} sentences, joint BPE 8k)\n")
    cells = [(f"{r['size']:,}", f"{r['mib']:.0f} MiB", f"{r['seconds']:.1f} s", f"{r['pairs'] / r['seconds']:,.0f}",
              f"{r['main_peak_mib']:.0f} MiB", f"{r['worker_peak_mib']:.0f} MiB") for r in rows]  # fmt: skip
    print(table(("pairs", "raw text", "prepare time", "pairs/s", "peak RSS main", "peak RSS worker"), cells))
    s = sampler_speed(work / f"prepared{args.sizes[-1]}", args.max_tokens)
    print(f"\n### Sampler on {s['pairs']:,} pairs, max_tokens={args.max_tokens}\n")
    header = ("batches/epoch", "build (sort + cut)", "batches/s (indices)", "batches/s (indices + collate)")
    cells = [(f"{s['batches']:,}", f"{s['build_s']:.2f} s", f"{s['batches_per_s']:,.0f}",
              f"{s['collate_batches_per_s']:,.0f}")]  # fmt: skip
    print(table(header, cells))
    print(f"\n(corpora and outputs in {work})", file=sys.stderr)
    return None


if __name__ == "__main__":
    main()
