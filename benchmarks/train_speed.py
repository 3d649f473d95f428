"""Training throughput: transduce against ``torch.nn.Transformer`` and Hugging Face ``MarianMTModel`` with the same
dimensions, weights, batches, loss and optimizer, measured side by side (interleaved) in one process.

    python benchmarks/train_speed.py                                   # small and base, fp32, median of 3
    python benchmarks/train_speed.py --configs small --precision fp32,bf16
    python benchmarks/train_speed.py --configs small --profile         # + where the time goes
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python benchmarks/train_speed.py

The contenders (all post-norm, ReLU, one embedding matrix shared by encoder, decoder and output projection and
scaled by sqrt(d_model), sinusoidal positions, dropout 0.1 on the embeddings and every residual branch, none on
attention weights or the FFN activation, which is what the presets say):

- ``transduce``: :class:`transduce.model.Transformer`.
- ``torch.nn.Transformer``: ``train_common.TorchTransformer``, the same function on ``nn.Transformer`` (without the
  final encoder/decoder LayerNorms ``nn.Transformer`` adds by default, which a post-norm model does not have).
- ``MarianMTModel``: built with ``transduce.interop.marian.marian_config`` and our weights copied in with
  ``copy_to_marian``; called with ``use_cache=False`` (no KV cache in training); transformers' default attention
  (``sdpa``). ``--models ...,marian-eager`` adds a second copy with ``attn_implementation="eager"`` (explicit
  ``softmax(QK^T)V`` products, which on the CPU are faster than SDPA's flash kernel at these lengths, see below); it
  counts as a peer.
- ``--models ...,sdpa`` adds a row for our model with its explicit training attention off
  (``fastpaths.override(explicit_attention_max_keys=0)``): attention through ``scaled_dot_product_attention``'s CPU
  (flash) kernel in training as well.

Before timing, the copies must reproduce our logits in eval mode (max |diff| < 1e-4, asserted).

Each step is ``logits = model(src, tgt_in)`` (under bf16 autocast for ``bf16``), a label-smoothed loss (eps 0.1,
mean over target tokens) as each toolkit's users compute it (transduce: ``transduce.training.loss``, with its
closed-form gradient; the peers: PyTorch's ``F.cross_entropy(label_smoothing=0.1, ignore_index=pad)``), ``backward()``,
``Adam.step()`` (lr 1e-4, betas (0.9, 0.98), eps 1e-9,
``--adam`` implementation: foreach by default) and ``zero_grad(set_to_none=True)``. Batches: ``--steps`` batches
made by transduce's own ``TokenBatchSampler`` (``--max-tokens`` 4096 per side, padding included) from 20,000
sentence pairs whose lengths follow a log-normal fit to Multi30k (``--lengths wmt``: longer, WMT-like sentences).
One repetition runs every batch once for each model, models in rotating order; the table shows medians over
``--reps`` repetitions after ``--warmup`` steps per model.

tokens/s counts real source + target tokens (EOS/BOS included, padding not). Achieved FLOP/s counts matrix-product
FLOPs analytically (``train_common.forward_flops``), over each sentence's real lengths s and t:

    forward = 2 (P_src * sum s + P_tgt * sum t) + 4 d * sum (L_enc s^2 + L_dec (t s + t (t + 1) / 2))
    P_src   = L_enc (4 d^2 + 2 d d_ff) + L_dec 2 d^2            (encoder; cross-attention K, V of the memory)
    P_tgt   = L_dec (6 d^2 + 2 d d_ff) + d V                    (decoder; output projection)
    step    = 3 x forward                                       (backward: input and weight gradients)

It is shown as a share of the measured matmul peak: the best FLOP/s of a 2048^3 fp32 (1024^3 bf16) ``torch.mm``
measured at the start, right operand contiguous or transposed (``nn.Linear``'s layout), whichever is faster. On
CPUs without bf16 instructions (x86 without avx512_bf16 / AMX) bf16 products are emulated and far slower than fp32:
bf16 is then measured but not worth using; the script says so.

``--models transduce,torch,marian,trainer`` adds a row for ``transduce.training.trainer.Trainer.train_step`` on a copy
of our model: the update ``transduce train`` makes (Adam as ``transduce.training.optim.build_optimizer`` builds it, the
fused implementation; the learning-rate schedule; the gradient-norm check of every update).

The contenders' dropout is each one's own (the same probabilities): transduce's CPU dropout
(``transduce.model.fused.dropout``, a mask from 16 random bits per element) against PyTorch's ``F.dropout`` in
both peers.

``--profile`` adds, per configuration and precision, a breakdown of our step (without dropout, forward only,
forward + backward, the output projection + loss alone, Adam alone in its three implementations) and the
torch.profiler table of one repetition of our step, top operators by self CPU time.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from harness import (
    TCMALLOC,
    add_common_args,
    apply_common_args,
    cpu_has_native_bf16,
    interleaved,
    machine,
    median_seconds,
    table,
    tcmalloc_loaded,
)
from train_common import (
    MarianLogits,
    Peaks,
    TorchTransformer,
    autocast,
    copy_to_torch,
    describe_batches,
    gflops,
    max_logit_diff,
    measure_peaks,
    model_config,
    token_batches,
    train_flops,
)
from transduce import fastpaths
from transduce.config import Config, TrainConfig
from transduce.data.batch import Batch
from transduce.model import Transformer
from transduce.text.special import PAD_ID
from transduce.training.loss import label_smoothed_nll
from transduce.training.trainer import Trainer

MARIAN_EAGER = "MarianMTModel (eager attention)"
PEERS = ("torch.nn.Transformer", "MarianMTModel", MARIAN_EAGER)
SDPA_ROW = "transduce (SDPA attention)"
PARITY_ATOL = 1e-4
TRAINER = "transduce Trainer.train_step"


def sdpa_attention(step: Callable[[list[Batch], str], float]) -> Callable[[list[Batch], str], float]:
    """``step`` with the explicit training attention off: attention through SDPA's CPU kernel in training too."""

    def run(batches: list[Batch], precision: str) -> float:
        with fastpaths.override(explicit_attention_max_keys=0):
            return step(batches, precision)

    return run


def make_adam(params, kind: str) -> torch.optim.Optimizer:
    flags = {"foreach": dict(foreach=True), "fused": dict(fused=True), "loop": dict(foreach=False)}[kind]
    return torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, **flags)


def loss_of(model: nn.Module, batch: Batch, precision: str) -> torch.Tensor:
    with autocast(precision):
        logits = model(batch.src, batch.tgt_in)
    if isinstance(model, Transformer):  # ours (and the Trainer row): transduce.training.loss
        loss_sum, _, n_tokens = label_smoothed_nll(logits, batch.tgt_out, 0.1, PAD_ID)
    else:  # the peers: PyTorch's own label-smoothed cross-entropy, what their users call
        n_tokens = int(batch.tgt_out.ne(PAD_ID).sum())
        loss_sum = F.cross_entropy(
            logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=0.1,
            reduction="sum",
        )  # fmt: skip
    return loss_sum / n_tokens


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, batches: list[Batch], precision: str) -> float:
    """Seconds for one full update on each batch."""
    start = time.perf_counter()
    for batch in batches:
        loss_of(model, batch, precision).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def trainer_stepper(ours: Transformer) -> Callable[[list[Batch], str], float]:
    """Updates through ``transduce.training.trainer.Trainer.train_step`` on a copy of ``ours``: what ``transduce train``
    runs (its Adam as ``build_optimizer`` makes it, the learning-rate schedule, the gradient-norm check)."""
    model = Transformer(ours.config)
    model.load_state_dict(ours.state_dict())
    config = Config(model=ours.config, train=TrainConfig(label_smoothing=0.1))
    trainer = Trainer(config, model, torch.device("cpu"))

    def run(batches: list[Batch], precision: str) -> float:
        trainer.autocast_dtype = torch.bfloat16 if precision == "bf16" else None
        start = time.perf_counter()
        for batch in batches:
            trainer.train_step([batch])
        return time.perf_counter() - start

    return run


# ----------------------------------------------------------------------------------------------------------------------
# where the time goes


def breakdown(model: Transformer, batches: list[Batch], precision: str, reps: int, adam: str, full: float) -> None:
    """Time pieces of our step; print them as shares of the full step (``full`` seconds for all batches)."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows: list[tuple[str, float]] = [(f"full step ({adam} Adam)", full)]

    def no_dropout() -> float:
        model.eval()  # only dropout depends on the mode
        try:
            return train_steps(model, opt, batches, precision)
        finally:
            model.train()

    opt = make_adam(params, adam)
    rows.append(("full step without dropout", median_seconds(no_dropout, reps)))

    def forward() -> None:
        for batch in batches:
            loss_of(model, batch, precision)

    def forward_backward() -> None:
        for batch in batches:
            loss_of(model, batch, precision).backward()
        model.zero_grad(set_to_none=True)

    rows.append(("forward + loss (autograd on)", median_seconds(forward, reps)))
    rows.append(("forward + loss + backward", median_seconds(forward_backward, reps)))

    c = model.config
    hidden = [torch.randn(b.tgt_in.shape[0], b.tgt_in.shape[1], c.d_model, requires_grad=True) for b in batches]

    def head() -> None:
        for h, batch in zip(hidden, batches):
            with autocast(precision):
                logits = model.output(h)
            loss_sum, _, n = label_smoothed_nll(logits, batch.tgt_out, 0.1, PAD_ID)
            (loss_sum / n).backward()
        model.zero_grad(set_to_none=True)

    rows.append(
        (f"output projection (d x {c.tgt_vocab_size}) + log-softmax loss, fwd + bwd", median_seconds(head, reps))
    )
    for kind in ("loop", "foreach", "fused"):
        o = make_adam(params, kind)
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3

        def step(o=o) -> None:
            for _ in batches:
                o.step()

        rows.append((f"Adam step alone ({kind})", median_seconds(step, reps)))
        del o
    model.zero_grad(set_to_none=True)
    print(f"\nWhere the time of our step goes ({len(batches)} batches, median of {reps}):\n")
    cells = [(name, f"{1000 * t / len(batches):.0f}", f"{t / full:.0%}") for name, t in rows]
    print(table(("piece", "ms per step", "share of the full step"), cells))


def profile_table(model: Transformer, batches: list[Batch], precision: str, adam: str, rows: int) -> None:
    opt = make_adam([p for p in model.parameters() if p.requires_grad], adam)
    train_steps(model, opt, batches[:1], precision)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_steps(model, opt, batches, precision)
    print(f"\ntorch.profiler, our step ({len(batches)} batches, {adam} Adam), top {rows} operators by self CPU time:\n")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60))


# ----------------------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="small,base", help="model presets, comma-separated")
    ap.add_argument("--precision", default="fp32", help="fp32, bf16 or fp32,bf16")
    ap.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size")
    ap.add_argument("--max-tokens", type=int, default=4096, help="batch budget per side, padding included")
    ap.add_argument("--lengths", default="multi30k", choices=["multi30k", "wmt"])
    ap.add_argument("--steps", type=int, default=2, help="batches (updates) per repetition and model")
    ap.add_argument("--warmup", type=int, default=1, help="untimed updates per model before timing")
    ap.add_argument("--adam", default="foreach", choices=["foreach", "fused", "loop"])
    ap.add_argument("--models", default="transduce,torch,marian", help="contenders (+ trainer: see above)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="also show where the time of our step goes")
    ap.add_argument("--profile-rows", type=int, default=25)
    add_common_args(ap, reps=3)
    args = ap.parse_args()
    apply_common_args(args)
    precisions = args.precision.split(",")
    assert set(precisions) <= {"fp32", "bf16"}, f"--precision: fp32 and/or bf16, got {args.precision}"
    wanted = args.models.split(",")
    assert set(wanted) <= {"transduce", "sdpa", "torch", "marian", "marian-eager", "trainer"}, args.models
    assert "transduce" in wanted, args.models
    print(machine())
    peaks: Peaks = measure_peaks()
    print(f"measured matmul peak (best torch.mm of two layouts): {peaks.describe()}")
    if "bf16" in precisions and not cpu_has_native_bf16():
        print(
            "NOTE: this CPU has no bf16 matrix instructions (avx512_bf16 / amx_bf16): bf16 autocast is emulated and "
            "slower than fp32, so the bf16 rows show this machine's limit, not the models' (judging bf16 needs a "
            "CPU with bf16 instructions or a GPU)."
        )
    print(
        f"step: forward + label-smoothed loss (0.1) + backward + Adam ({args.adam}) + zero_grad; "
        f"{args.steps} batches per repetition and model, median of {args.reps} after {args.warmup} warm-up steps\n"
    )

    results = []  # (config, precision, model, seconds per rep, tokens per rep, flops per rep)
    for name in args.configs.split(","):
        c = model_config(name, args.vocab)
        torch.manual_seed(args.seed)
        ours = Transformer(c).train()
        models: dict[str, nn.Module] = {"transduce": ours}
        batches = token_batches(args.steps, args.max_tokens, args.vocab, lengths=args.lengths, seed=args.seed)
        if "torch" in wanted:
            ref = TorchTransformer(c)
            copy_to_torch(ours, ref)
            diff = max_logit_diff(ours, ref, batches[0])
            print(f"{name}: logits max |ours - torch.nn.Transformer| = {diff:.2e}")
            assert diff < PARITY_ATOL, "the torch.nn.Transformer model does not reproduce our logits"
            models["torch.nn.Transformer"] = ref.train()
        if "marian" in wanted:
            import transformers

            from transduce.interop.marian import marian_model

            hf = MarianLogits(marian_model(ours), c.pad_id)  # the same dropouts (marian_config passes them on)
            diff = max_logit_diff(ours, hf, batches[0])
            attn = hf.hf.config._attn_implementation
            print(f"{name}: logits max |ours - MarianMTModel| = {diff:.2e} (transformers {transformers.__version__}, "
                  f"attention: {attn})")  # fmt: skip
            assert diff < PARITY_ATOL, "the MarianMTModel copy does not reproduce our logits"
            models["MarianMTModel"] = hf.train()
        if "marian-eager" in wanted:
            from transduce.interop.marian import marian_model

            hf = MarianLogits(marian_model(ours), c.pad_id)
            hf.hf.set_attn_implementation("eager")  # softmax(QK^T)V as explicit products, as our CPU training
            diff = max_logit_diff(ours, hf, batches[0])
            print(f"{name}: logits max |ours - {MARIAN_EAGER}| = {diff:.2e}")
            assert diff < PARITY_ATOL, "the eager MarianMTModel copy does not reproduce our logits"
            models[MARIAN_EAGER] = hf.train()
        print(f"{name}: {ours.num_parameters() / 1e6:.1f}M parameters; {describe_batches(batches)}")
        tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
        flops = sum(train_flops(c, b) for b in batches)
        steppers: dict[str, Callable[[list[Batch], str], float]] = {}
        for m, model in models.items():
            opt = make_adam([p for p in model.parameters() if p.requires_grad], args.adam)
            steppers[m] = functools.partial(train_steps, model, opt)
        if "sdpa" in wanted:  # our model, attention through scaled_dot_product_attention in the backward pass too
            steppers[SDPA_ROW] = sdpa_attention(steppers["transduce"])
        if "trainer" in wanted:
            steppers[TRAINER] = trainer_stepper(ours)
        for precision in precisions:
            for step in steppers.values():
                for i in range(args.warmup):
                    step([batches[i % len(batches)]], precision)
            runs = {m: functools.partial(step, batches, precision) for m, step in steppers.items()}
            times = interleaved(runs, args.reps, warmup=0)
            for m in steppers:
                results.append((name, precision, m, statistics.median(times[m]), tokens, flops))
            print(f"{name} {precision}: " + ", ".join(f"{m} {[round(t, 2) for t in times[m]]} s" for m in times))
            if args.profile:
                if not tcmalloc_loaded():
                    print(
                        "note: with glibc malloc, torch.profiler's own allocations can inflate allocation-heavy "
                        f"operators (seen with cat in decoding); for the profile prefer LD_PRELOAD={TCMALLOC}"
                    )
                full = statistics.median(times["transduce"])
                breakdown(ours, batches, precision, args.reps, args.adam, full)
                profile_table(ours, batches, precision, args.adam, args.profile_rows)
        del models, steppers, ours
        gc.collect()

    rows = []
    for name, precision, m, dt, tokens, flops in results:
        peers = [tok / t for n, p, mm, t, tok, _ in results if n == name and p == precision and mm in PEERS]
        speed = tokens / dt
        vs = f"{speed / max(peers):.2f}x" if peers else "-"
        achieved = flops / dt
        rows.append((name, precision, m, f"{1000 * dt / args.steps:.0f}", f"{speed:,.0f}", vs, gflops(achieved),
                     f"{achieved / peaks.of(precision):.1%}"))  # fmt: skip
    header = ("config", "precision", "model", "ms/step", "tokens/s (src+tgt)", "vs fastest peer", "GFLOP/s",
              "of matmul peak")  # fmt: skip
    print("\n" + table(header, rows))
    if len(precisions) == 2:
        print("\nbf16 autocast / fp32 throughput:")
        for name in args.configs.split(","):
            for m in dict.fromkeys(r[2] for r in results if r[0] == name):
                t = {p: dt for n, p, mm, dt, _, _ in results if n == name and mm == m}
                print(f"- {name} {m}: {t['fp32'] / t['bf16']:.2f}x")


if __name__ == "__main__":
    main()
