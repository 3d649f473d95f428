"""BPE-dropout's segmentation of one epoch (transduce.data.bpe_dropout): how long it takes and how many more pieces
it makes than the deterministic segmentation, for a prepared directory's training split, both sides.

    python benchmarks/bpe_dropout.py --prepared runs/multi30k_de_en/data --p 0.05,0.1,0.2
"""

from __future__ import annotations

import argparse
import time

from harness import add_common_args, apply_common_args, machine, table
from transduce.data import ParallelDataset
from transduce.data.bpe_dropout import BPEDropoutEpochs
from transduce.text.tokenizer import Tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepared", required=True, help="a directory written by transduce prepare")
    parser.add_argument("--p", default="0.1", help="comma-separated dropout probabilities")
    add_common_args(parser, threads=1, reps=None)  # (the segmenter is pure Python: one thread whatever is set)
    args = parser.parse_args()
    apply_common_args(args)
    print(machine())
    tok = Tokenizer.load(args.prepared)
    train = ParallelDataset(args.prepared, "train")
    rows = []
    for p in [float(x) for x in args.p.split(",")]:
        epochs = BPEDropoutEpochs(train, tok, p, max_tokens=4096, seed=1)
        start = time.perf_counter()
        src, tgt = epochs.segment(0)
        seconds = time.perf_counter() - start
        pieces = sum(map(len, src)) + sum(map(len, tgt))
        sentences = len(src) + len(tgt)
        more = f"{100 * (pieces / epochs.prepared_pieces - 1):.1f}"
        rows.append((p, sentences, f"{seconds:.2f}", f"{sentences / seconds:,.0f}", more))
    print(table(("p", "sentences", "seconds", "sentences/s", "% more pieces"), rows))


if __name__ == "__main__":
    main()
