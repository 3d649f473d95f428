"""Where the decoding step's self-attention cache should live, by source length: stored by position (written once,
read through a row table) against copied into row order at every step, whole searches on a random-weight model,
the two ways interleaved in one process. It measures ``fastpaths.settings.by_position_min_source`` on the CPU at
hand (the source length from which the package stores the cache by position).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python benchmarks/kv_cache.py \\
        --preset small --lengths 25,50,100,200,400,800 --threads 1 --precision fp32,bf16

Each search decodes ``--sentences`` random sources of L tokens with beam 4 (early stopping) and greedily, the
output forced to L tokens (``min_len`` = ``max_len``), as ``benchmarks/scaling.py`` does. By position, each
position's keys and values are written once and read through a row table; copied, the attention kernel copies the
whole cache into the new step's rows (beam search: in the surviving hypotheses' order), O(L) per step. The outputs
are checked to be the same both ways. ``--precision bf16`` decodes with bf16 products (``transduce.model.bf16``;
the CPU's AMX kernel where it has one), the attention float32 either way.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from harness import add_common_args, apply_common_args, interleaved, machine, table
from transduce import ModelConfig, Transformer, fastpaths
from transduce.config import DecodeConfig
from transduce.model import kernels
from transduce.model.bf16 import bf16_products
from transduce.search import generate

COPIED, BY_POSITION = {"by_position_min_source": 1 << 30}, {"by_position_min_source": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--lengths", default="25,50,100,200,400,800")
    ap.add_argument("--sentences", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--precision", default="fp32", help="fp32, bf16 or both (comma-separated)")
    add_common_args(ap, threads=1)
    args = ap.parse_args()
    apply_common_args(args)
    if kernels.compiled() is None:
        raise SystemExit("transduce's kernels are not available: the cache is only stored by position with them")
    torch.manual_seed(0)
    fp32 = Transformer(ModelConfig.preset(args.preset, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab)).eval()
    models = {"fp32": fp32, "bf16": bf16_products(fp32)}
    print(machine())
    print(f"{args.preset} (random weights), {args.sentences} sentences of L tokens, output forced to L tokens; "
          f"median of {args.reps} after a warm-up; by_position_min_source is "
          f"{fastpaths.settings.by_position_min_source} by default\n")  # fmt: skip
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        src = torch.randint(4, args.vocab, (args.sentences, length))
        src[:, -1] = fp32.config.eos_id
        for precision in args.precision.split(","):
            model = models[precision]
            for beam in (4, 1):
                cfg = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=length, min_len=length, early_stopping=True)
                outputs: dict[str, list[list[int]]] = {}

                def search(name: str, paths: dict, cfg=cfg, model=model, src=src, outputs=outputs) -> None:
                    with fastpaths.override(**paths):
                        outputs[name] = [hyps[0].tokens for hyps in generate(model, src, cfg)]

                times = interleaved(
                    {
                        "copied": lambda: search("copied", COPIED),
                        "by position": lambda: search("by position", BY_POSITION),
                    },
                    args.reps,
                )
                copied, stored = (1e3 * statistics.median(times[k]) / args.sentences for k in times)
                rows.append((length, precision, "beam 4" if beam == 4 else "greedy", f"{copied:.1f}", f"{stored:.1f}",
                             f"{copied / stored:.2f}x", outputs["copied"] == outputs["by position"]))  # fmt: skip
                print(f"L {length}, {precision}, beam {beam}: done", file=sys.stderr, flush=True)
    header = ("L", "precision", "search", "copied, ms/sentence", "by position, ms/sentence", "by position's speed-up",
              "same outputs")  # fmt: skip
    print(table(header, rows))


if __name__ == "__main__":
    main()
