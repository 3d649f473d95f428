"""The decoding step as one function (``transduce.model.step``) against the decoder's modules, by model width: whole
beam searches on random-weight models of the given presets, the two ways interleaved in one process.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python benchmarks/step_function.py \\
        --presets tiny,small,base --threads 1

Each search decodes ``--sentences`` random sources of ``--length`` tokens with beam 4, early stopping and at most
``--length`` output tokens (random weights: the outputs are arbitrary, but the same both ways, which is checked).
The step function saves a fixed cost per decoding step (Python, module calls, dispatch), so its gain shrinks as the
products grow with the model's width; ``benchmarks/beam_variants.py`` measures it on a trained model.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import transduce.model.step as step_module
from transduce import ModelConfig, Transformer
from transduce.config import DecodeConfig
from transduce.search import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,small,base")
    ap.add_argument("--sentences", type=int, default=32)
    ap.add_argument("--length", type=int, default=27)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = DecodeConfig(beam=4, max_len_a=0.0, max_len_b=args.length, early_stopping=True)
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.sentences} random sentences of {args.length} "
          f"tokens, beam 4, early stopping; median of {args.reps}\n")  # fmt: skip
    print("| preset | d_model | modules, s | step function, s | speed-up | same outputs |")
    print("|---|---|---|---|---|---|")
    default = step_module.FAST_STEP
    try:
        for preset in args.presets.split(","):
            torch.manual_seed(0)
            model = Transformer(ModelConfig.preset(preset, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab))
            model.eval()
            src = torch.randint(4, args.vocab, (args.sentences, args.length))
            src[:, -1] = model.config.eos_id
            times: dict[bool, list[float]] = {False: [], True: []}
            outputs: dict[bool, list[list[int]]] = {}
            for fast in (False, True):  # warm-up
                step_module.FAST_STEP = fast
                generate(model, src[:4], cfg)
            for _ in range(args.reps):
                for fast in (False, True):
                    step_module.FAST_STEP = fast
                    t0 = time.perf_counter()
                    outputs[fast] = [hyps[0].tokens for hyps in generate(model, src, cfg)]
                    times[fast].append(time.perf_counter() - t0)
            modules, fast = statistics.median(times[False]), statistics.median(times[True])
            print(f"| {preset} | {model.config.d_model} | {modules:.3f} | {fast:.3f} | {modules / fast:.2f}x | "
                  f"{outputs[False] == outputs[True]} |")  # fmt: skip
    finally:
        step_module.FAST_STEP = default


if __name__ == "__main__":
    main()
