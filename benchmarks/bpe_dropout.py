"""BPE-dropout's segmentation of one epoch (transduce.data.bpe_dropout): how long it takes and how many more pieces
it makes than the deterministic segmentation, for a prepared directory's training split, both sides.

    python benchmarks/bpe_dropout.py --prepared runs/multi30k_de_en/data --p 0.05,0.1,0.2
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from harness import add_common_args, apply_common_args, machine, table
from transduce.data import ParallelDataset
from transduce.data.bpe_dropout import BPEDropout
from transduce.tokenizer import Tokenizer


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
    pairs = [train[i] for i in range(len(train))]
    texts = [[tok.decode_src(s) for s, _ in pairs], [tok.decode_tgt(t) for _, t in pairs]]
    plain = int(train.src_lengths.sum() + train.tgt_lengths.sum())
    segmenters = [BPEDropout(proto) for proto in tok.model_protos()]
    rows = []
    for p in [float(x) for x in args.p.split(",")]:
        rng = np.random.default_rng([1, 0])
        start = time.perf_counter()
        pieces = sum(len(ids) for bpe, side in zip(segmenters, texts) for ids in bpe.encode(side, p, rng))
        seconds = time.perf_counter() - start
        sentences = 2 * len(pairs)
        rows.append(
            (p, sentences, f"{seconds:.2f}", f"{sentences / seconds:,.0f}", f"{100 * (pieces / plain - 1):.1f}")
        )
    print(table(("p", "sentences", "seconds", "sentences/s", "% more pieces"), rows))


if __name__ == "__main__":
    main()
