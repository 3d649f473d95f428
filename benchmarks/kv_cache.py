"""The self-attention cache stored by position (``transduce.model.step.BY_POSITION``) against the cache gathered
at every step, by source length: whole searches on a random-weight model, the two ways interleaved in one process.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python benchmarks/kv_cache.py \\
        --preset small --lengths 25,50,100,200,400 --threads 1

Each search decodes ``--sentences`` random sources of L tokens with beam 4 (early stopping) and greedily, the
output forced to L tokens (``min_len`` = ``max_len``), as ``benchmarks/scaling.py`` does. Stored by position, each
position's keys and values are written once and read through a row table; gathered, the whole cache is copied
(beam search: re-ordered between beams) at every step, O(L) per step. The threshold that decides between the two in
the package (``BY_POSITION_MIN_SOURCE``) is set to 0 here, so that every length uses the form asked for. The
outputs are checked to be the same both ways.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import transduce.model.step as step_module
from transduce import ModelConfig, Transformer
from transduce.config import DecodeConfig
from transduce.model import kernels
from transduce.search import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--lengths", default="25,50,100,200,400")
    ap.add_argument("--sentences", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if kernels.compiled() is None:
        raise SystemExit("transduce's kernels are not available: the cache is only stored by position with them")
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset(args.preset, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab)).eval()
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.preset} (random weights), {args.sentences} "
          f"sentences of L tokens, output forced to L tokens; median of {args.reps} after a warm-up\n")  # fmt: skip
    print("| L | search | gathered, ms/sentence | by position, ms/sentence | speed-up | same outputs |")
    print("|---|---|---|---|---|---|")
    defaults = step_module.BY_POSITION, step_module.BY_POSITION_MIN_SOURCE
    step_module.BY_POSITION_MIN_SOURCE = 0
    try:
        for length in (int(x) for x in args.lengths.split(",")):
            src = torch.randint(4, args.vocab, (args.sentences, length))
            src[:, -1] = model.config.eos_id
            for beam in (4, 1):
                cfg = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=length, min_len=length, early_stopping=True)
                times: dict[bool, list[float]] = {False: [], True: []}
                outputs: dict[bool, list[list[int]]] = {}
                for by_position in (False, True):  # warm-up
                    step_module.BY_POSITION = by_position
                    generate(model, src[:2], cfg.replace(max_len_b=8, min_len=0))
                for _ in range(args.reps):
                    for by_position in (False, True):
                        step_module.BY_POSITION = by_position
                        t0 = time.perf_counter()
                        outputs[by_position] = [hyps[0].tokens for hyps in generate(model, src, cfg)]
                        times[by_position].append(time.perf_counter() - t0)
                gathered, stored = (1e3 * statistics.median(times[k]) / args.sentences for k in (False, True))
                print(f"| {length} | {'beam 4' if beam == 4 else 'greedy'} | {gathered:.1f} | {stored:.1f} | "
                      f"{gathered / stored:.2f}x | {outputs[False] == outputs[True]} |")  # fmt: skip
    finally:
        step_module.BY_POSITION, step_module.BY_POSITION_MIN_SOURCE = defaults


if __name__ == "__main__":
    main()
