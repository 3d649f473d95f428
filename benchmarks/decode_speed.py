"""Decoding speed: transduce's greedy and beam search against Hugging Face ``MarianMTModel.generate`` with the same
weights on the same inputs, measured side by side in one run.

The model is the ``small`` preset (3+3 layers, d_model 256, d_ff 1024, 4 heads) with a shared 8000-token vocabulary
and random weights. Both sides produce exactly 25 output positions per hypothesis (EOS is kept out until then), so
both do the same number of decoder steps: ours 24 tokens + a forced EOS, HF ``min_new_tokens = max_new_tokens = 25``.
Before timing, the Marian copy's logits are checked against ours (max abs difference < 1e-4).

    python benchmarks/decode_speed.py                      # 500 sentences, batch 32, median of 3
    python benchmarks/decode_speed.py --sentences 100 --reps 1
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from transduce.config import DecodeConfig, ModelConfig
from transduce.model import Transformer
from transduce.search import generate
from transduce.special import EOS_ID, PAD_ID

OUT_LEN = 25  # output positions per hypothesis, EOS included on our side


def make_batches(n: int, batch: int, vocab: int, seed: int) -> list[torch.Tensor]:
    """``n`` random source sentences of 5-40 tokens (+ EOS), right-padded in batches of ``batch``."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 41, (n,), generator=g).tolist()
    sents = [[*torch.randint(4, vocab, (length,), generator=g).tolist(), EOS_ID] for length in lengths]
    out = []
    for i in range(0, n, batch):
        chunk = sents[i : i + batch]
        width = max(map(len, chunk))
        out.append(torch.tensor([s + [PAD_ID] * (width - len(s)) for s in chunk]))
    return out


def time_ours(model: Transformer, batches: list[torch.Tensor], beam: int) -> tuple[float, list]:
    cfg = DecodeConfig(beam=beam, length_penalty=0.6, max_len_a=0.0, max_len_b=OUT_LEN - 1, min_len=OUT_LEN - 1)
    t0 = time.perf_counter()
    out = [generate(model, src, cfg) for src in batches]
    return time.perf_counter() - t0, out


def time_hf(hf, batches: list[torch.Tensor], beam: int) -> tuple[float, list]:
    kw = dict(num_beams=beam, do_sample=False, min_new_tokens=OUT_LEN, max_new_tokens=OUT_LEN, length_penalty=0.6)
    t0 = time.perf_counter()
    out = []
    with torch.inference_mode():
        for src in batches:
            out.append(hf.generate(input_ids=src, attention_mask=src.ne(PAD_ID).long(), **kw))
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="greedy,beam4")
    ap.add_argument("--no-hf", action="store_true", help="time transduce only")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model = Transformer(ModelConfig.preset("small", src_vocab_size=args.vocab, tgt_vocab_size=args.vocab)).eval()
    batches = make_batches(args.sentences, args.batch, args.vocab, args.seed)
    hf = None
    if not args.no_hf:
        import transformers

        from transduce.interop.marian import marian_model, parity_error

        hf = marian_model(model)  # the residual stream permuted so that Marian's [sin | cos] table gives our function
        diff = parity_error(model, hf)
        print(f"logits max |ours - Marian| = {diff:.2e} (transformers {transformers.__version__})")
        assert diff < 1e-4, "Marian copy does not reproduce our logits"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print(f"{args.sentences} sentences, batch {args.batch}, {OUT_LEN} output positions, median of {args.reps}\n")

    rows = []
    for mode in args.modes.split(","):
        beam = 1 if mode == "greedy" else int(mode.removeprefix("beam"))
        ours_t, hf_t = [], []
        for _ in range(args.reps):
            t, out = time_ours(model, batches, beam)
            ours_t.append(t)
            assert all(len(h[0].tokens) == OUT_LEN - 1 for b in out for h in b)
            if hf is not None:
                t, hf_out = time_hf(hf, batches, beam)
                hf_t.append(t)
                assert all(o.shape[1] == OUT_LEN + 1 for o in hf_out)  # start token + 25
        agree = ""
        if hf is not None and beam == 1:  # greedy tokens should agree (the random model almost never picks pad/bos)
            same = sum(
                h[0].tokens == o[1:OUT_LEN].tolist() for b, ob in zip(out, hf_out) for h, o in zip(b, ob)
            )  # fmt: skip
            agree = f"{same}/{args.sentences}"
        rows.append((mode, statistics.median(ours_t), statistics.median(hf_t) if hf_t else None, agree))

    n, toks = args.sentences, args.sentences * OUT_LEN
    print("| mode | transduce sent/s | transduce tok/s | HF generate sent/s | HF tok/s | ratio | greedy agreement |")
    print("|---|---|---|---|---|---|---|")
    for mode, ours, theirs, agree in rows:
        hf_cols = f"{n / theirs:.1f} | {toks / theirs:.0f} | {theirs / ours:.2f}x" if theirs else "- | - | -"
        print(f"| {mode} | {n / ours:.1f} | {toks / ours:.0f} | {hf_cols} | {agree or '-'} |")


if __name__ == "__main__":
    main()
