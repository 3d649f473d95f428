"""Training-step throughput of a transduce model on synthetic batches: source+target tokens per second for a full
update (forward, label-smoothed loss, backward, Adam), median of several repetitions, fp32 and/or bf16 autocast.

    python benchmarks/train_step.py --preset tiny --precision fp32 bf16
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python benchmarks/train_step.py --preset tiny

Batches: 256 sentences of 15 source and 16 target tokens (about 4,000 tokens per side), vocabulary 8,000.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from transduce import ModelConfig, Transformer
from transduce.loss import label_smoothed_nll


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--steps", type=int, default=5, help="timed updates per repetition")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()

    torch.manual_seed(0)
    v, b, s, t = args.vocab, args.sentences, 15, 16
    model = Transformer(ModelConfig.preset(args.preset, src_vocab_size=v, tgt_vocab_size=v)).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    src = torch.randint(4, v, (b, s))
    tgt = torch.randint(4, v, (b, t + 1))

    def update(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(src, tgt[:, :-1])
            loss_sum, _, n_tokens = label_smoothed_nll(logits, tgt[:, 1:], 0.1, model.config.pad_id)
        (loss_sum / n_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    print(f"| preset | precision | ms/update | tokens/s (src+tgt) | threads {torch.get_num_threads()} |")
    print("|---|---|---|---|---|")
    for precision in args.precision:
        bf16 = precision == "bf16"
        update(bf16)  # warm-up
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            for _ in range(args.steps):
                update(bf16)
            times.append((time.perf_counter() - start) / args.steps)
        dt = statistics.median(times)
        print(f"| {args.preset} | {precision} | {1000 * dt:.0f} | {b * (s + t) / dt:,.0f} | |")


if __name__ == "__main__":
    main()
