"""How close a bf16-autocast training step's gradients come to float32 training, by attention path.

    python benchmarks/attention_precision.py                                        # random `small` model
    python benchmarks/attention_precision.py --model runs/m30k_s_de_en/checkpoints/step_00006800 \\
        --data runs/m30k_s_data_de_en --split valid --sentences 200                # a trained model, real text

One batch, dropout off, the label-smoothed loss of ``transduce.loss``; the reference is the same step in float32
(through SDPA). Each row runs the step under bf16 autocast and prints the relative error of the loss and of all
parameter gradients (concatenated, ``|g - g_ref| / |g_ref|``):

- ``explicit, bf16 scores``: ``layers.explicit_attention`` as transduce trains on the CPU (products in bf16, softmax
  in float32);
- ``explicit, float32 scores``: the same with Q and K cast to float32 for the scores (autocast off for that product);
- ``SDPA``: ``scaled_dot_product_attention``'s bf16 CPU kernel (``layers.EXPLICIT_CPU_BACKWARD`` off).
"""

from __future__ import annotations

import argparse
import math

import torch

import transduce.model.layers as layers
from speed_common import model_config, token_batches
from transduce.loss import label_smoothed_nll
from transduce.model import Transformer


def float32_scores(q, k, v, mask, is_causal, dropout_p=0.0):
    """``layers.explicit_attention`` with the scores computed in float32."""
    with torch.autocast(q.device.type, enabled=False):
        scores = (q.float() * (1.0 / math.sqrt(q.shape[-1]))) @ k.float().transpose(-2, -1)
    if is_causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights.to(v.dtype) @ v, weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a checkpoint (default: a random `small` model)")
    ap.add_argument("--data", help="a prepared data directory (with --model)")
    ap.add_argument("--split", default="valid")
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    if args.model:
        from transduce.checkpoint import load_model
        from transduce.data.batch import collate
        from transduce.data.binary import ParallelDataset

        model, _, _ = load_model(args.model)
        if not args.data:
            ap.error("--model needs --data (the prepared directory the model was trained on)")
        ds = ParallelDataset(args.data, args.split)
        batch = collate([ds[i] for i in range(min(args.sentences, len(ds)))])
        what = f"{args.model}, {len(batch.src)} sentences of {args.data} {args.split}"
    else:
        model = Transformer(model_config("small", 8000))
        batch = token_batches(1, 4096, 8000, seed=args.seed)[0]
        what = f"random small model, {len(batch.src)} synthetic sentences"
    model.train()
    for m in model.modules():  # dropout off: the rows must differ only in arithmetic
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(m, layers.MultiHeadAttention):
            m.dropout = 0.0

    def step(autocast: bool) -> tuple[torch.Tensor, float]:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(batch.src, batch.tgt_in)
        loss, _, n = label_smoothed_nll(logits, batch.tgt_out, 0.1, model.config.pad_id)
        (loss / n).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()]), loss.item() / n

    layers.EXPLICIT_CPU_BACKWARD = False
    ref, ref_loss = step(False)
    print(f"{what}; float32 loss {ref_loss:.5f}\n")
    print("| bf16 autocast, attention | gradient rel. error | loss rel. error |")
    print("|---|---|---|")
    explicit = layers.explicit_attention
    for name, impl, on in (
        ("explicit, bf16 scores (transduce)", explicit, True),
        ("explicit, float32 scores", float32_scores, True),
        ("SDPA bf16 kernel", explicit, False),
    ):
        layers.explicit_attention, layers.EXPLICIT_CPU_BACKWARD = impl, on
        grad, loss = step(True)
        print(f"| {name} | {((grad - ref).norm() / ref.norm()).item():.3e} | {abs(loss - ref_loss) / ref_loss:.1e} |")
    layers.explicit_attention, layers.EXPLICIT_CPU_BACKWARD = explicit, True


if __name__ == "__main__":
    main()
