"""Beam search with and without its optional speed-ups, side by side on one model and one set of sentences:
the chunked top-k (``transduce.search.beam.CHUNKED_TOPK``), early stopping (``DecodeConfig.early_stopping``),
oneDNN with packed weights for every linear layer, not only the pre-softmax projection
(``transduce.model.packed.ONEDNN_LAYERS``), the decoding step as one function over the weights instead of the
decoder's modules (``transduce.model.step.FAST_STEP``), transduce's attention kernel
(``transduce.model.kernels.KERNELS``), the candidates from the logits (``transduce.search.beam.FROM_LOGITS``), the
garbage collector paused (``transduce.search.common.PAUSE_GC``) and the cache stored by position for long sources
(``transduce.model.step.BY_POSITION``). Rows 1-5 run without the last four (as before they existed).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python benchmarks/beam_variants.py \\
        --model runs/multi30k_en_de --src ../shared/data/multi30k/test_2016_flickr.en.gz \\
        --ref ../shared/data/multi30k/test_2016_flickr.de.gz

Sentences are sorted by length and decoded in batches of ``--batch`` (beam 4, output up to source length + 50),
the variants interleaved in every repetition; prints sentences/s (median), the speed ratio to the first variant,
how many outputs equal the first variant's, and with ``--ref`` the lowercased Moses-tokenised BLEU; then the time
of the candidate top-k alone on a (batch, beam, vocabulary) tensor, both ways.

With ``--steps 1,8,32,64`` it measures instead what one decoder step of the default search (chunked top-k, early
stopping) costs at each batch size: sentences/s, decoder calls, and the whole search time (encoder included) per
decoder call. A step for at most 4 rows (batch 1) against one for at most 128 (batch 32; finished sentences leave
the batch) shows the fixed cost of a step (Python, operator dispatch, weight reads).
``--compile`` first wraps the decoder's layer stack in ``torch.compile(dynamic=True)`` (timed after two warm-up
batches, so compilation is not counted).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import transduce.model.kernels as kernels_module
import transduce.model.packed as packed_module
import transduce.model.step as step_module
import transduce.search.beam as beam_module
import transduce.search.common as common_module
from transduce.config import DecodeConfig
from transduce.evaluate import score_tokenized_lowercase
from transduce.search import generate
from transduce.search.common import pad_sequences
from transduce.textio import read_lines
from transduce.translate import Translator

SWITCHES = {  # name: (module, attribute) of each speed-up's switch
    "chunked": (beam_module, "CHUNKED_TOPK"),
    "onednn_layers": (packed_module, "ONEDNN_LAYERS"),
    "fast_step": (step_module, "FAST_STEP"),
    "kernels": (kernels_module, "KERNELS"),
    "from_logits": (beam_module, "FROM_LOGITS"),
    "pause_gc": (common_module, "PAUSE_GC"),
    "by_position": (step_module, "BY_POSITION"),
}
BEFORE_KERNELS = {"kernels": False, "from_logits": False, "pause_gc": False, "by_position": False}
NOW = {"chunked": True, "early": True, "onednn_layers": False, "fast_step": True, "kernels": True,
       "from_logits": True, "pause_gc": True, "by_position": True}  # fmt: skip
VARIANTS = {  # name: the switches (and early stopping) of each row
    "torch.topk, exact stop": {**NOW, **BEFORE_KERNELS, "chunked": False, "early": False},
    "chunked top-k, exact stop": {**NOW, **BEFORE_KERNELS, "early": False},
    "chunked top-k, early stopping": {**NOW, **BEFORE_KERNELS},
    "chunked top-k, early stopping, oneDNN layers": {**NOW, **BEFORE_KERNELS, "onednn_layers": True},
    "chunked top-k, early stopping, decoder modules (no step function)": {**NOW, **BEFORE_KERNELS, "fast_step": False},
    "row 3 + attention kernel": {**NOW, "from_logits": False, "pause_gc": False, "by_position": False},
    "row 6 + candidates from the logits": {**NOW, "pause_gc": False, "by_position": False},
    "row 7 + garbage collector paused": {**NOW, "by_position": False},
    "row 8 + cache by position for long sources (all defaults)": NOW,
}
DEFAULTS = {name: getattr(module, attr) for name, (module, attr) in SWITCHES.items()}  # as the package sets them


def apply(switches: dict) -> None:
    for name, (module, attr) in SWITCHES.items():
        setattr(module, attr, switches[name])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="run directory or checkpoint")
    ap.add_argument("--src", required=True, help="source text (plain or .gz)")
    ap.add_argument("--ref", help="reference text for BLEU (its language from the file name: test.de.gz -> de)")
    ap.add_argument("--sentences", type=int, default=0, help="first N sentences (0: all)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--variants", metavar="I,J,..", help="only these rows of the variants table (1-based; default: all)"
    )
    ap.add_argument("--profile", action="store_true", help="then profile the last variant once (torch.profiler)")
    ap.add_argument("--steps", metavar="B1,B2,..", help="time per decoder step at these batch sizes, not variants")
    ap.add_argument("--compile", action="store_true", help="with --steps: torch.compile the decoder layers first")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    tr = Translator.load(args.model)
    lines = [text for _, text in read_lines(args.src)][: args.sentences or None]
    ids = tr.tokenizer.encode_src_batch(lines)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    c = tr.model.config

    def make_batches(size: int) -> list[torch.Tensor]:
        return [
            pad_sequences([[*ids[i], c.eos_id] for i in order[k : k + size]], c.pad_id)
            for k in range(0, len(order), size)
        ]

    if args.steps:
        time_steps(tr.model, make_batches, [int(b) for b in args.steps.split(",")], args)
        return
    batches = make_batches(args.batch)

    def run(early: bool) -> list[list[int]]:
        cfg = DecodeConfig(beam=args.beam, max_len_a=1.0, max_len_b=50, early_stopping=early)
        return [h[0].tokens for src in batches for h in generate(tr.model, src, cfg)]

    names = list(VARIANTS)
    variants = (
        {names[int(i) - 1]: VARIANTS[names[int(i) - 1]] for i in args.variants.split(",")}
        if args.variants
        else VARIANTS
    )
    times: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, list[list[int]]] = {}
    try:
        for _ in range(args.reps):
            for name, switches in variants.items():
                apply(switches)
                t0 = time.perf_counter()
                outputs[name] = run(switches["early"])
                times[name].append(time.perf_counter() - t0)
    finally:
        apply(DEFAULTS)
    refs = [text for _, text in read_lines(args.ref)][: len(lines)] if args.ref else None
    lang = Path(args.ref).name.removesuffix(".gz").rsplit(".", 1)[-1] if args.ref else ""
    first = next(iter(variants))
    base = statistics.median(times[first])
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.model}; {len(ids)} sentences, batch "
          f"{args.batch}, beam {args.beam}; median of {args.reps}\n")  # fmt: skip
    print("| variant | sent/s | vs first | outputs equal to the first | lc-tok BLEU |")
    print("|---|---|---|---|---|")
    for name in variants:
        t = statistics.median(times[name])
        same = sum(a == b for a, b in zip(outputs[name], outputs[first]))
        bleu = "-"
        if refs is not None:
            hyps = [""] * len(ids)
            for pos, i in enumerate(order):
                hyps[i] = tr.tokenizer.decode_tgt(outputs[name][pos])
            bleu = f"{score_tokenized_lowercase(hyps, refs, lang).bleu_lc_tok:.2f}"
        print(f"| {name} | {len(ids) / t:.1f} | {base / t:.2f}x | {same}/{len(ids)} | {bleu} |")
    # the top-k alone, on log-probabilities of the model's vocabulary shaped as in a beam step (sentences, beam, V)
    g = torch.Generator().manual_seed(0)
    total = torch.log_softmax(torch.randn(args.batch, args.beam, c.tgt_vocab_size, generator=g) * 3, dim=-1)
    cost = {}
    for chunked in (False, True):
        beam_module.CHUNKED_TOPK = chunked
        beam_module.top_candidates(total, 2 * args.beam)
        best = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(100):
                beam_module.top_candidates(total, 2 * args.beam)
            best = min(best, (time.perf_counter() - t0) / 100)
        cost[chunked] = best * 1e3
    beam_module.CHUNKED_TOPK = True
    print(
        f"\ntop_candidates on {tuple(total.shape)} (best of 7 x 100): torch.topk {cost[False]:.2f} ms, "
        f"chunked {cost[True]:.2f} ms"
    )
    if args.profile:  # the last variant (its attention kernel calls are not torch operators: the profile misses them)
        last = variants[list(variants)[-1]]
        apply(last)
        try:
            with torch.profiler.profile() as prof:
                run(last["early"])
        finally:
            apply(DEFAULTS)
        print("\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def time_steps(model, make_batches, sizes: list[int], args: argparse.Namespace) -> None:
    """Decoder calls and time per call of the default beam search (chunked top-k, early stopping) by batch size."""
    if args.compile:  # (the cache's gather with out= stays outside the compiled graph, in Transformer.decode)
        step_module.FAST_STEP = False  # the steps go through the (compiled) layer stack, not the step function
        torch._dynamo.config.recompile_limit = 64  # first steps, row counts of 1, groups: a few graphs each
        model._decode_layers = torch.compile(model._decode_layers, dynamic=True)
    calls = 0
    decode = model.decode

    def counting(*a, **k):
        nonlocal calls
        calls += 1
        return decode(*a, **k)

    model.decode = counting
    cfg = DecodeConfig(beam=args.beam, max_len_a=1.0, max_len_b=50, early_stopping=True)
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.model}; beam {args.beam}, early stopping"
          f"{', torch.compile' if args.compile else ''}; median of {args.reps}\n")  # fmt: skip
    print("| batch | sentences | sent/s | decoder calls | ms per call |")
    print("|---|---|---|---|---|")
    for size in sizes:
        batches = make_batches(size)
        for src in batches[:2]:  # warm-up (and compilation)
            generate(model, src, cfg)
        times = []
        for _ in range(args.reps):
            calls = 0
            t0 = time.perf_counter()
            for src in batches:
                generate(model, src, cfg)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        n = sum(len(b) for b in batches)
        print(f"| {size} | {n} | {n / t:.1f} | {calls} | {1e3 * t / calls:.2f} |")


if __name__ == "__main__":
    main()
