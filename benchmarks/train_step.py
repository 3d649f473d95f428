"""Training-step throughput of a transduce model on synthetic batches: source+target tokens per second for a full
update (forward, label-smoothed loss, backward, Adam), median of several repetitions, fp32 and/or bf16 autocast.

    python benchmarks/train_step.py --preset tiny --precision fp32 bf16
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python benchmarks/train_step.py --preset tiny
    # transduce's CPU dropout and fused Adam against PyTorch's F.dropout and default Adam, interleaved:
    python benchmarks/train_step.py --preset tiny --norm pre --dropout transduce torch --adam fused default

Batches: ``--sentences`` sentences of 15 source and 16 target tokens (256: about 4,000 tokens per side), vocabulary
8,000. With several ``--dropout`` or ``--adam`` choices, every combination runs on the same model, interleaved
(one timed block of ``--steps`` updates each per repetition, in rotating order), so their ratios are fair on a noisy
machine. ``--dropout transduce`` is ``transduce.model.layers.dropout`` (a mask from 16 random bits per element),
``torch`` is ``F.dropout``; ``--adam fused`` is what ``transduce train`` builds, ``default`` is
``torch.optim.Adam``'s own choice (the single-tensor loop on a CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time

import torch

import transduce.model.layers as layers
from transduce import ModelConfig, Transformer
from transduce.loss import label_smoothed_nll


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--norm", default=None, choices=["pre", "post"], help="default: the preset's")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    p.add_argument("--dropout", nargs="+", default=["transduce"], choices=["transduce", "torch"])
    p.add_argument("--adam", nargs="+", default=["fused"], choices=["fused", "default"])
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--steps", type=int, default=5, help="timed updates per repetition")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()

    torch.manual_seed(0)
    v, b, s, t = args.vocab, args.sentences, 15, 16
    cfg = ModelConfig.preset(args.preset, src_vocab_size=v, tgt_vocab_size=v)
    if args.norm:
        cfg = dataclasses.replace(cfg, norm=args.norm)
    model = Transformer(cfg).train()
    params = list(model.parameters())
    adams = {
        kind: torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=kind == "fused" or None)
        for kind in args.adam
    }
    src = torch.randint(4, v, (b, s))
    tgt = torch.randint(4, v, (b, t + 1))

    def update(bf16: bool, dropout: str, adam: str) -> None:
        layers.FAST_CPU_DROPOUT = dropout == "transduce"
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(src, tgt[:, :-1])
            loss_sum, _, n_tokens = label_smoothed_nll(logits, tgt[:, 1:], 0.1, model.config.pad_id)
        (loss_sum / n_tokens).backward()
        adams[adam].step()
        model.zero_grad(set_to_none=True)

    variants = list(itertools.product(args.dropout, args.adam))
    print(f"| preset | precision | dropout | Adam | ms/update | tokens/s (src+tgt) | vs first | threads "
          f"{torch.get_num_threads()} |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for precision in args.precision:
        bf16 = precision == "bf16"
        for variant in variants:
            update(bf16, *variant)  # warm-up
        times: dict[tuple[str, str], list[float]] = {variant: [] for variant in variants}
        for rep in range(args.reps):
            for variant in variants[rep % len(variants) :] + variants[: rep % len(variants)]:
                start = time.perf_counter()
                for _ in range(args.steps):
                    update(bf16, *variant)
                times[variant].append((time.perf_counter() - start) / args.steps)
        first = statistics.median(times[variants[0]])
        for (dropout, adam), ts in times.items():
            dt = statistics.median(ts)
            print(f"| {args.preset} | {precision} | {dropout} | {adam} | {1000 * dt:.0f} | {b * (s + t) / dt:,.0f} | "
                  f"{first / dt:.2f}x | |")  # fmt: skip
    layers.FAST_CPU_DROPOUT = True


if __name__ == "__main__":
    main()
