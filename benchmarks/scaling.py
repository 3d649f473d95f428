"""How training and translation cost grow with sentence length, where attention starts to dominate, and peak memory.

    python benchmarks/scaling.py                              # small; lengths 10-400; plot benchmarks/scaling.png
    python benchmarks/scaling.py --configs small,base --plot /tmp/scaling.png
    python benchmarks/scaling.py --lengths 10,50 --reps 1 --memory-configs small     # a quick look

For each configuration and source length L (``--lengths``), each in a fresh child process:

- train: one training step (forward, label-smoothed loss, backward, foreach Adam, zero_grad) on a batch of
  sentence pairs with exactly L source and L target tokens (+ EOS / BOS each), no padding, under a fixed token
  budget: ``--train-tokens`` (4096) // (L + 1) sentences, so every step holds about 4,000 tokens per side, as in
  training, and the per-token cost rises only by what grows faster than linearly (attention).
  ``--train-sentences N`` uses N sentences at every length instead (the tokens per step then grow with L).
  Reported per step and per token (source + target).
- greedy, beam4: translation of ``--batch`` (8) source sentences of exactly L tokens with transduce's ``generate``.
  The output length is forced (``min_len`` = ``max_len``) to L tokens + EOS (``--out-len source``) or to a fixed
  number of tokens (``--out-len N``, so that only the source length varies). Reported per sentence.

The model has random weights (vocabulary ``--vocab``, shared). Times are medians of ``--reps`` runs after a warm-up
run (for translation a warm-up of 8 output tokens). The attention share is the share of operator CPU time spent
inside ``scaled_dot_product_attention`` and its backward, in training up to 512 keys inside
``layers.explicit_attention`` and its backward (batched products and softmax), and in decoding inside transduce's
attention kernels (``transduce.model.kernels``; both recorded for the profiler by ``profile_kernels``):
torch.profiler, one run in another process, with tcmalloc preloaded when installed (see ``profile_env``), Python
overhead between operators not counted. It is the part quadratic in length (Q K^T, softmax, weights x V); the Q/K/V
and output projections are linear in length and not counted. Beside it for training: attention's share of the matmul
FLOPs (``train_common.forward_flops``), and for decoding the share of ``cat`` + ``index_select`` (growing the KV cache
by one position per step and re-ordering it between beams: O(L) per step, O(L^2) per sentence; for sources of
``fastpaths.settings.by_position_min_source`` tokens or more the cache is stored by position and neither copied nor
gathered, only its row table is: ``transduce.model.step``). Training is also measured at ``--train-long`` lengths (800
and 1600 by default; cheap under the token budget) to show where attention overtakes the rest.

Peak memory: each measurement runs in its own process; peak RSS is ``resource.getrusage(RUSAGE_SELF).ru_maxrss``
(the high-water mark of resident memory) read after the timed runs; "above model" subtracts the high-water mark
reached after imports, building the model and the data, so it is what the step or the search itself added
(gradients, Adam state, activations, allocator caching; for decoding the caches and beams). The "peak memory of
training and translation" table (``--memory-configs``, default small and base) measures a training step on a batch
of ~4,000 tokens per side (transduce's sampler on Multi30k-like lengths, as ``train_speed.py``; two updates, so Adam's
state exists) and translation of 32 sentences with Multi30k-like lengths with beam 4 and the default length limit
(source length + 50; a random model almost never ends early, so this is close to the worst case).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import transduce.model.layers as layers
from harness import TCMALLOC, add_common_args, apply_common_args, machine, table
from train_common import (
    fixed_batch,
    forward_flops,
    model_config,
    sample_lengths,
    token_batches,
)
from transduce.config import DecodeConfig
from transduce.model import Transformer, kernels
from transduce.search import generate
from transduce.text.special import EOS_ID, PAD_ID
from transduce.training.loss import label_smoothed_nll

HERE = Path(__file__).resolve().parent
KINDS = ("train", "greedy", "beam4")


# ----------------------------------------------------------------------------------------------------------------------
# in the child process


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _under(event, words: tuple[str, ...]) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if any(w in parent.name.lower() for w in words):
            return True
        parent = parent.cpu_parent
    return False


def op_shares(prof) -> dict[str, float]:
    """Shares of operator CPU time: attention (SDPA forward and backward, children included) and KV-cache work."""
    events = list(prof.events())
    total = sum(e.self_cpu_time_total for e in events)
    attention = ("scaled_dot_product", "scaleddotproduct", "aten::bmm", "bmmbackward", "softmaxbackward")
    attention += ("aten::_softmax",)  # (not aten::_log_softmax)
    groups = {"attention": attention, "cache": ("aten::cat", "aten::index_select")}
    out = {}
    for key, words in groups.items():
        hit = [e for e in events if any(w in e.name.lower() for w in words) and not _under(e, words)]
        out[key] = sum(e.cpu_time_total for e in hit) / total if total else 0.0
    return out


class _RecordedKernels:
    """transduce's compiled decoding kernels with each attention call recorded for torch.profiler (which sees only
    PyTorch's own operators) under a name ``op_shares`` counts as attention."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name: str):
        fn = getattr(self._module, name)
        if not name.startswith("attend"):
            return fn

        def recorded(*args, **kwargs):
            with torch.profiler.record_function(f"transduce::scaled_dot_product_{name}"):
                return fn(*args, **kwargs)

        return recorded


def profile_kernels() -> None:
    """Make the attention of transduce's kernels and of training's explicit products visible to the profiler
    (profiled runs only: it costs a little). The explicit products' backward (bmm, softmax) is counted by name: in
    training only attention multiplies batched matrices or takes a softmax (the loss is a kernel)."""
    module = kernels.compiled()
    if module is not None:
        kernels._state["module"] = _RecordedKernels(module)
    explicit = layers.explicit_attention

    def recorded(*args, **kwargs):
        with torch.profiler.record_function("transduce::scaled_dot_product_explicit"):
            return explicit(*args, **kwargs)

    layers.explicit_attention = recorded


def run_worker(spec: dict) -> dict:
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    c = model_config(spec["config"], spec["vocab"])
    model = Transformer(c)
    kind, length, reps = spec["kind"], spec["length"], spec["reps"]
    result: dict = {"params": model.num_parameters()}
    if kind in ("train", "train4k"):
        if kind == "train":
            n = spec["train_sentences"] or max(1, spec["train_tokens"] // (length + 1))
            batches = [fixed_batch(n, length, length, c.src_vocab_size)]
        else:
            batches = token_batches(1, 4096, c.src_vocab_size, seed=1)
        b = batches[0]
        result.update(
            sentences=len(b), tokens=b.n_src_tokens + b.n_tgt_tokens, shape=[list(b.src.shape), list(b.tgt_in.shape)]
        )
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=True)

        def once(warmup: bool = False) -> None:
            logits = model(b.src, b.tgt_in)
            loss_sum, _, n = label_smoothed_nll(logits, b.tgt_out, 0.1, PAD_ID)
            (loss_sum / n).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    else:
        model.eval()
        if kind == "translate32":
            src_len, _ = sample_lengths(32, "multi30k", seed=1)
            g = torch.Generator().manual_seed(1)
            rows = [[*torch.randint(4, c.src_vocab_size, (n,), generator=g).tolist(), EOS_ID] for n in src_len]
            width = max(map(len, rows))
            src = torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])
            cfg = DecodeConfig(beam=4)  # the paper's decoding: max length = source length + 50
        else:
            src = fixed_batch(spec["batch"], length, 1, c.src_vocab_size).src
            out_len = length if spec["out_len"] == "source" else int(spec["out_len"])
            beam = 1 if kind == "greedy" else int(kind.removeprefix("beam"))
            cfg = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=out_len, min_len=out_len)
            result["out_len"] = out_len
        result.update(sentences=src.shape[0], shape=list(src.shape))

        short = cfg.replace(max_len_a=0.0, max_len_b=8, min_len=0)

        def once(warmup: bool = False) -> None:  # the warm-up decodes 8 tokens: shapes change every step anyway
            hyps = generate(model, src, short if warmup else cfg)
            if warmup:
                return
            result["out_tokens"] = sum(len(h[0].tokens) for h in hyps)

    if spec["profile"]:  # a process of its own: only the warm-up and one profiled run
        once(warmup=True)
        profile_kernels()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            once()
        result.update(op_shares(prof))
        return result
    base = maxrss_mib()
    times = []
    for i in range(reps + 1):  # the first run is the warm-up
        t0 = time.perf_counter()
        once(warmup=i == 0)
        if i:
            times.append(time.perf_counter() - t0)
    result.update(seconds=statistics.median(times), times=times, rss_peak=maxrss_mib(), rss_base=base)
    return result


# ----------------------------------------------------------------------------------------------------------------------
# in the parent


def profile_env() -> dict[str, str]:
    """The environment of the profiled runs: ours, with tcmalloc preloaded when it is installed. With glibc's
    malloc, torch.profiler's own allocations upset the allocator: in greedy decoding at L = 400, ``cat`` (growing the
    KV cache) took 8 of 13 s of profiled operator time against 0.5 of 4.5 s with tcmalloc, which would make the
    shares meaningless; the timed runs are not profiled and keep the allocator they were started with."""
    env = os.environ.copy()
    if Path(TCMALLOC).exists() and "tcmalloc" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = " ".join(filter(None, [TCMALLOC, env.get("LD_PRELOAD", "")]))
    return env


def measure(spec: dict, env: dict[str, str] | None = None) -> dict:
    """Run one measurement in a fresh ``python scaling.py --worker SPEC`` process."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env or os.environ.copy())
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    sys.stderr.write(proc.stderr[-3000:])
    raise RuntimeError(f"worker failed ({proc.returncode}): {spec}")


def plot(rows: list[dict], path: Path, train_title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    styles = {"train": ("C0", "training step (ms)"), "greedy": ("C1", "greedy, per sentence (ms)"),
              "beam4": ("C2", "beam 4, per sentence (ms)")}  # fmt: skip
    markers = ["o", "s", "^", "D"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    for ci, config in enumerate(configs):
        for kind, (color, label) in styles.items():
            pts = sorted(
                ((r["length"], r) for r in rows if r["config"] == config and r["kind"] == kind), key=lambda p: p[0]
            )
            if not pts:
                continue
            xs = [x for x, _ in pts]
            ms = [1000 * r["seconds"] / (1 if kind == "train" else r["sentences"]) for _, r in pts]
            ls = "-" if ci == 0 else "--"
            ax1.plot(xs, ms, ls, color=color, marker=markers[ci % 4], label=f"{config}: {label}")
            share = [100 * r.get("attention", float("nan")) for _, r in pts]
            ax2.plot(xs, share, ls, color=color, marker=markers[ci % 4], label=f"{config}: {kind}")
    ref = [r for r in rows if r["kind"] != "train" and r["config"] == configs[0]]
    if ref:  # guides: linear and quadratic growth from the shortest translation point
        shortest = min(ref, key=lambda r: (r["length"], r["seconds"]))
        x0, y0 = shortest["length"], 1000 * shortest["seconds"] / shortest["sentences"]
        xs = sorted({r["length"] for r in ref})
        ax1.plot(xs, [y0 * x / x0 for x in xs], ":", color="grey", label="~ L (guide)")
        ax1.plot(xs, [y0 * (x / x0) ** 2 for x in xs], "-.", color="grey", label="~ L² (guide)")
    ax1.set(xscale="log", yscale="log", xlabel="source length L (tokens)", ylabel="milliseconds",
            title=f"time vs length (training: {train_title})")  # fmt: skip
    ax2.set(xscale="log", xlabel="source length L (tokens)", ylabel="% of operator CPU time", ylim=(0, 100),
            title="share of time in attention (fwd+bwd)")  # fmt: skip
    ax2.axhline(50, color="grey", lw=0.8, ls=":")  # above this line attention dominates
    lengths = sorted({r["length"] for r in rows})
    for ax in (ax1, ax2):
        ax.set_xticks(lengths, [str(x) for x in lengths])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="small", help="model presets for the length scan, comma-separated")
    ap.add_argument("--lengths", default="10,25,50,100,200,400")
    ap.add_argument("--train-long", default="800,1600", help="extra lengths for the training step only")
    ap.add_argument("--kinds", default=",".join(KINDS), help="train, greedy, beam4 (beamN works)")
    ap.add_argument("--train-tokens", type=int, default=4096, help="token budget per side of a training step")
    ap.add_argument("--train-sentences", type=int, default=0, help="sentences per training step (instead of a budget)")
    ap.add_argument("--batch", type=int, default=8, help="sentences per translation batch")
    ap.add_argument("--out-len", default="source", help="decoded tokens: 'source' (= L) or a fixed number")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--plot", default=str(HERE / "scaling.png"), help="PNG to write ('' for none)")
    ap.add_argument("--memory-configs", default="small,base", help="configs of the peak-memory table ('' for none)")
    ap.add_argument("--save-json", default="", help="also write every measurement to this JSON file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    add_common_args(ap, reps=3)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(run_worker(json.loads(args.worker))))
        return

    apply_common_args(args)  # for the machine line; the workers set their own
    print(machine())
    train_batch = (f"{args.train_sentences} sentences" if args.train_sentences
                   else f"{args.train_tokens} tokens per side")  # fmt: skip
    print(f"length scan: configs {args.configs}; training batch {train_batch}; translation batch {args.batch} "
          f"sentences, output length {args.out_len}; median of {args.reps} after one warm-up; every measurement "
          "in a fresh process\n")  # fmt: skip
    common = dict(vocab=args.vocab, threads=args.threads, batch=args.batch, out_len=args.out_len, reps=args.reps,
                  train_tokens=args.train_tokens, train_sentences=args.train_sentences)  # fmt: skip
    rows = []
    for config in filter(None, args.configs.split(",")):
        lengths = [int(x) for x in args.lengths.split(",")]
        long = [int(x) for x in args.train_long.split(",") if x and "train" in args.kinds.split(",")]
        for length in sorted(set(lengths + long)):
            for kind in args.kinds.split(",") if length in lengths else ["train"]:
                t0 = time.perf_counter()
                spec = {**common, "config": config, "length": length, "kind": kind, "profile": False}
                r = measure(spec)
                r.update(measure({**spec, "profile": True}, profile_env()))
                r.update(config=config, length=length, kind=kind)
                rows.append(r)
                took = time.perf_counter() - t0
                print(f"  {config} L={length} {kind}: {r['seconds']:.3f} s, attention {r['attention']:.0%}, "
                      f"peak RSS {r['rss_peak']:.0f} MiB ({took:.0f} s)", flush=True)  # fmt: skip

    if rows:
        print(f"\nTraining step, batch of {train_batch}, sentence pairs of L + L tokens (no padding):\n")
        header = ("config", "L", "sentences", "tokens (src+tgt)", "ms/step", "µs/token", "per token vs shortest",
                  "attention share of time", "of FLOPs", "peak RSS MiB", "above model MiB")  # fmt: skip
        cells = []
        for config in dict.fromkeys(r["config"] for r in rows):
            train = [r for r in rows if r["config"] == config and r["kind"] == "train"]
            for r in train:
                per_tok = r["seconds"] / r["tokens"]
                rel = per_tok / (train[0]["seconds"] / train[0]["tokens"])
                flops = attention_flop_share(config, args.vocab, r["length"])
                cells.append((config, r["length"], r["sentences"], f"{r['tokens']:,}", f"{1000 * r['seconds']:.0f}",
                              f"{1e6 * per_tok:.0f}", f"{rel:.2f}x", f"{r['attention']:.0%}", f"{flops:.0%}",
                              *memory_cells(r)))  # fmt: skip
        print(table(header, cells))
        out = "L tokens + EOS" if args.out_len == "source" else f"{args.out_len} tokens + EOS"
        print(f"\nTranslation, batches of {args.batch} sentences of L tokens, output forced to {out}:\n")
        header = ("config", "L", "search", "ms/sentence", "ms per output token", "attention share",
                  "cache cat/index_select share", "peak RSS MiB", "above model MiB")  # fmt: skip
        cells = []
        for config in dict.fromkeys(r["config"] for r in rows):
            for r in rows:
                if r["config"] != config or r["kind"] == "train":
                    continue
                per_sent = r["seconds"] / r["sentences"]
                cells.append((config, r["length"], r["kind"], f"{1000 * per_sent:.1f}",
                              f"{1000 * per_sent / (r['out_len'] + 1):.2f}", f"{r['attention']:.0%}",
                              f"{r['cache']:.0%}", *memory_cells(r)))  # fmt: skip
        print(table(header, cells))
        if args.save_json:
            Path(args.save_json).write_text(json.dumps(rows, indent=1))
        if args.plot:
            plot(rows, Path(args.plot), train_batch)
            print(f"\nplot: {args.plot}")

    memory = [c for c in args.memory_configs.split(",") if c]
    if memory:
        print("\nPeak memory of training and translation (fresh process each; ru_maxrss):\n")
        cells = []
        for config in memory:
            spec = {**common, "config": config, "length": 0, "profile": False, "reps": 1}
            tr = measure({**spec, "kind": "train4k"})
            s, t = tr["shape"]
            batch = f"{tr['sentences']} sentences, {s[0] * s[1]:,}/{t[0] * t[1]:,} src/tgt tokens padded"
            cells.append((config, f"{tr['params'] / 1e6:.1f}M", "training step (Adam)", batch,
                          f"{tr['seconds']:.2f} s", *memory_cells(tr)))  # fmt: skip
            de = measure({**spec, "kind": "translate32"})
            batch = f"32 sentences, source {de['shape'][1]} wide, {de['out_tokens']:,} tokens out"
            cells.append((config, f"{de['params'] / 1e6:.1f}M", "translation, beam 4", batch,
                          f"{de['seconds']:.2f} s", *memory_cells(de)))  # fmt: skip
        print(table(("config", "parameters", "what", "batch", "time", "peak RSS MiB", "above model MiB"), cells))


def attention_flop_share(config: str, vocab: int, length: int) -> float:
    """Attention's share of the matmul FLOPs of a teacher-forced pass over L + L tokens (+ EOS / BOS)."""
    c = model_config(config, vocab)
    n = torch.tensor([length + 1])
    return 1 - forward_flops(c, n, n, attention=False) / forward_flops(c, n, n)


def memory_cells(r: dict) -> tuple[str, str]:
    return f"{r['rss_peak']:.0f}", f"{r['rss_peak'] - r['rss_base']:.0f}"


if __name__ == "__main__":
    main()
