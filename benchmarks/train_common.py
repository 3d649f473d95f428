"""What the training benchmarks (``train_speed.py``, ``scaling.py``) share: synthetic batches with realistic sentence
lengths, a ``torch.nn.Transformer`` model equivalent to ours, analytic matmul FLOP counts and the measured matmul peak.
The harness (arguments, machine line, timing, tables) is ``harness.py``.

Not a benchmark itself; the scripts import it (``python benchmarks/X.py`` puts ``benchmarks/`` on ``sys.path``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce.config import ModelConfig
from transduce.data.batch import Batch, collate
from transduce.data.sampler import TokenBatchSampler
from transduce.model import Transformer, sinusoid
from transduce.text.special import PAD_ID

# Lengths (subword tokens, specials excluded) of sentence pairs, as log-normal fits: log(src) ~ N(mu, sigma) and
# log(tgt / src) ~ N(ratio_mu, ratio_sigma). "multi30k": fitted to the prepared Multi30k En-De training set (joint
# BPE 8k: source mean 14.1, median 13, 99th percentile 28; target mean 14.5). "wmt": news sentences with a 32-37k
# vocabulary (mean ~28 tokens, long tail), a rough figure, not a fit to a particular corpus.
LENGTHS = {
    "multi30k": dict(mu=2.59, sigma=0.31, ratio_mu=0.016, ratio_sigma=0.18),
    "wmt": dict(mu=3.20, sigma=0.55, ratio_mu=0.05, ratio_sigma=0.20),
}


def model_config(name: str, vocab: int, **overrides) -> ModelConfig:
    return ModelConfig.preset(name, src_vocab_size=vocab, tgt_vocab_size=vocab, **overrides)


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


# ----------------------------------------------------------------------------------------------------------------------
# batches


def sample_lengths(n: int, kind: str, seed: int, lo: int = 3, hi: int = 120) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (source, target) lengths drawn as :data:`LENGTHS` ``kind`` says, clipped to [lo, hi]."""
    p = LENGTHS[kind]
    rng = np.random.default_rng(seed)
    log_src = rng.normal(p["mu"], p["sigma"], n)
    log_tgt = log_src + rng.normal(p["ratio_mu"], p["ratio_sigma"], n)
    src = np.clip(np.rint(np.exp(log_src)), lo, hi).astype(np.int64)
    tgt = np.clip(np.rint(np.exp(log_tgt)), lo, hi).astype(np.int64)
    return src, tgt


def token_batches(
    n_batches: int, max_tokens: int, vocab: int, *, lengths: str = "multi30k", seed: int = 0, pool: int = 20_000
) -> list[Batch]:
    """``n_batches`` training batches as transduce makes them: ``pool`` sentence pairs with realistic lengths, cut by
    :class:`TokenBatchSampler` into batches of at most ``max_tokens`` per side (padding included), shuffled; the
    first ``n_batches`` are returned. Token ids are uniform over the non-special ids."""
    src_len, tgt_len = sample_lengths(pool, lengths, seed)
    sampler = TokenBatchSampler(src_len, tgt_len, max_tokens, seed=seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for indices in sampler:
        out.append(collate([(_ids(src_len[i], vocab, g), _ids(tgt_len[i], vocab, g)) for i in indices]))
        if len(out) == n_batches:
            break
    return out


def fixed_batch(sentences: int, src_len: int, tgt_len: int, vocab: int, seed: int = 0) -> Batch:
    """``sentences`` pairs of exactly ``src_len`` / ``tgt_len`` tokens (specials excluded): no padding."""
    g = torch.Generator().manual_seed(seed)
    return collate([(_ids(src_len, vocab, g), _ids(tgt_len, vocab, g)) for _ in range(sentences)])


def _ids(n: int, vocab: int, g: torch.Generator) -> np.ndarray:
    """``n`` random non-special token ids."""
    return torch.randint(4, vocab, (int(n),), generator=g).numpy()


def describe_batches(batches: list[Batch]) -> str:
    sents = [len(b) for b in batches]
    real = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
    padded = sum(b.src.numel() + b.tgt_in.numel() for b in batches)
    per_side = [f"{b.src.numel()}/{b.tgt_in.numel()}" for b in batches]
    return (
        f"{len(batches)} batches of {min(sents)}-{max(sents)} sentences, padded src/tgt tokens {', '.join(per_side)}; "
        f"{real / len(batches):,.0f} real src+tgt tokens per batch, padding {1 - real / padded:.1%}"
    )


# ----------------------------------------------------------------------------------------------------------------------
# torch.nn.Transformer with our model's function


class TorchTransformer(nn.Module):
    """Our model (post-norm, shared embedding scaled by sqrt(d), our sinusoid table, tied output projection, the
    same dropouts) built on ``torch.nn.Transformer``. ``nn.Transformer`` always adds a final LayerNorm to its encoder
    and decoder, which a post-norm model does not have, so the encoder and decoder stacks are passed in as
    ``custom_encoder`` / ``custom_decoder`` without one. ``nn.TransformerEncoderLayer`` uses its one ``dropout`` for
    the residual branches, the attention weights and the FFN activation; the last two are set to our
    ``attention_dropout`` / ``activation_dropout`` (0 in the presets), so every dropout matches ours."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        assert c.norm == "post" and c.share_vocab and c.tie_output and c.positions == "sinusoidal"
        assert not c.output_bias and c.bias
        self.config = c
        self.embed = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
        self.drop = nn.Dropout(c.dropout)
        self.register_buffer("pe", sinusoid(torch.arange(1024), c.d_model), persistent=False)
        kw = dict(
            d_model=c.d_model, nhead=c.heads, dim_feedforward=c.d_ff, dropout=c.dropout, activation=c.activation,
            layer_norm_eps=c.layer_norm_eps, batch_first=True, norm_first=False,
        )  # fmt: skip
        if c.activation == "swish":
            kw["activation"] = F.silu
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), c.encoder_layers, enable_nested_tensor=False)
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), c.decoder_layers)
        for layer in enc.layers:
            layer.self_attn.dropout = c.attention_dropout
            layer.dropout.p = c.activation_dropout
        for layer in dec.layers:
            layer.self_attn.dropout = layer.multihead_attn.dropout = c.attention_dropout
            layer.dropout.p = c.activation_dropout
        self.transformer = nn.Transformer(
            d_model=c.d_model, nhead=c.heads, batch_first=True, custom_encoder=enc, custom_decoder=dec
        )
        self._causal: dict[int, Tensor] = {}

    def _embed(self, tokens: Tensor) -> Tensor:
        n = tokens.shape[1]
        if n > self.pe.shape[0]:
            self.pe = sinusoid(torch.arange(2 * n), self.config.d_model)
        return self.drop(self.embed(tokens) * self.scale + self.pe[:n])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        pad = src.eq(self.config.pad_id)
        pad = pad if bool(pad.any()) else None  # like ours: no mask when nothing is padded
        t = tgt_in.shape[1]
        if t not in self._causal:
            self._causal[t] = nn.Transformer.generate_square_subsequent_mask(t)
        y = self.transformer(
            self._embed(src), self._embed(tgt_in), tgt_mask=self._causal[t], src_key_padding_mask=pad,
            memory_key_padding_mask=pad, tgt_is_causal=True,
        )  # fmt: skip
        return F.linear(y, self.embed.weight)


def copy_to_torch(model: Transformer, ref: TorchTransformer) -> None:
    """Write ``model``'s weights into ``ref``."""
    pairs: list[tuple[Tensor, Tensor]] = [(ref.embed.weight, model.src_embed.weight)]

    def lin(dst: nn.Linear, src: nn.Linear) -> None:
        pairs.extend([(dst.weight, src.weight), (dst.bias, src.bias)])

    def ln(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
        pairs.extend([(dst.weight, src.weight), (dst.bias, src.bias)])

    for theirs, ours in zip(ref.transformer.encoder.layers, model.encoder_layers):
        pairs += [(theirs.self_attn.in_proj_weight, ours.self_attn.qkv.weight)]
        pairs += [(theirs.self_attn.in_proj_bias, ours.self_attn.qkv.bias)]
        lin(theirs.self_attn.out_proj, ours.self_attn.out)
        lin(theirs.linear1, ours.ffn.w1)
        lin(theirs.linear2, ours.ffn.w2)
        ln(theirs.norm1, ours.norm1)
        ln(theirs.norm2, ours.norm2)
    for theirs, ours in zip(ref.transformer.decoder.layers, model.decoder_layers):
        pairs += [(theirs.self_attn.in_proj_weight, ours.self_attn.qkv.weight)]
        pairs += [(theirs.self_attn.in_proj_bias, ours.self_attn.qkv.bias)]
        lin(theirs.self_attn.out_proj, ours.self_attn.out)
        x = ours.cross_attn
        pairs += [(theirs.multihead_attn.in_proj_weight, torch.cat([x.q.weight, x.kv.weight]))]
        pairs += [(theirs.multihead_attn.in_proj_bias, torch.cat([x.q.bias, x.kv.bias]))]
        lin(theirs.multihead_attn.out_proj, x.out)
        lin(theirs.linear1, ours.ffn.w1)
        lin(theirs.linear2, ours.ffn.w2)
        ln(theirs.norm1, ours.norm1)
        ln(theirs.norm2, ours.norm2)
        ln(theirs.norm3, ours.norm3)
    with torch.no_grad():
        for dst, src in pairs:
            dst.copy_(src)
    n_ref = sum(p.numel() for p in ref.parameters())
    assert n_ref == model.num_parameters(), f"parameter counts differ: {n_ref} vs {model.num_parameters()}"


class MarianLogits(nn.Module):
    """``forward(src, tgt_in) -> logits`` for a MarianMTModel, so all contenders are called the same way."""

    def __init__(self, hf, pad_id: int):
        super().__init__()
        self.hf, self.pad_id = hf, pad_id

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        mask = src.ne(self.pad_id).long()
        return self.hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt_in, use_cache=False).logits


def max_logit_diff(a: nn.Module, b: nn.Module, batch: Batch) -> float:
    """Largest |logit difference| of two models in eval mode at the real target positions of ``batch``."""
    was = a.training, b.training
    a.eval(), b.eval()
    with torch.no_grad():
        diff = (a(batch.src, batch.tgt_in) - b(batch.src, batch.tgt_in)).abs()
    a.train(was[0]), b.train(was[1])
    return float((diff * batch.tgt_out.ne(PAD_ID)[:, :, None]).max())


# ----------------------------------------------------------------------------------------------------------------------
# FLOPs


def matmul_params(c: ModelConfig) -> tuple[int, int]:
    """Weights in matrix products per source token and per target token (biases, norms, embeddings excluded):
    source: encoder (4 d^2 attention + 2 d d_ff per layer) + the decoder's cross-attention K, V projections of the
    memory (2 d^2 per decoder layer); target: decoder (4 d^2 self-attention + 2 d^2 cross Q and output + 2 d d_ff
    per layer) + the output projection d V."""
    d, f = c.d_model, c.d_ff
    src = c.encoder_layers * (4 * d * d + 2 * d * f) + c.decoder_layers * 2 * d * d
    tgt = c.decoder_layers * (6 * d * d + 2 * d * f) + d * c.tgt_vocab_size
    return src, tgt


def forward_flops(
    c: ModelConfig, src_lengths: Tensor, tgt_lengths: Tensor, causal_half: bool = True, attention: bool = True
) -> float:
    """Matmul FLOPs of one teacher-forced forward pass over sentences of the given real (non-pad) lengths:
    ``2 (P_src S + P_tgt T)`` for the projections (:func:`matmul_params`) plus attention scores and weighted sums,
    ``4 d`` per query-key pair and layer: ``s^2`` pairs in encoder self-attention, ``t s`` in cross-attention and
    ``t (t + 1) / 2`` in causal decoder self-attention (the useful part; ``t^2`` with ``causal_half=False``).
    ``attention=False`` leaves the attention terms out."""
    p_src, p_tgt = matmul_params(c)
    s, t = src_lengths.double(), tgt_lengths.double()
    proj = 2 * (p_src * s.sum() + p_tgt * t.sum())
    causal = t * (t + 1) / 2 if causal_half else t * t
    pairs = c.encoder_layers * (s * s).sum() + c.decoder_layers * (t * s + causal).sum()
    return float(proj + (4 * c.d_model * pairs if attention else 0))


def train_flops(c: ModelConfig, batch: Batch) -> float:
    """Matmul FLOPs of one training step on ``batch``: 3x the forward pass (the backward pass computes two
    products, for the input and the weight gradient, for each one of the forward pass)."""
    return 3 * forward_flops(c, batch.src.ne(PAD_ID).sum(1), batch.tgt_in.ne(PAD_ID).sum(1))


def matmul_peak(dtype: torch.dtype, n: int, transposed: bool, seconds: float = 1.0) -> float:
    """Best FLOP/s of an n x n x n ``torch.mm`` in ``dtype`` over about ``seconds`` (at least 3 products).
    ``transposed``: the right operand is a transposed view (``a @ w.T``, the layout of ``nn.Linear``'s forward),
    else contiguous (``a @ b``). The two can differ a lot: without bf16 instructions, bf16 ``a @ b`` ran ~10x slower
    than ``a @ w.T`` here (the latter goes to oneDNN)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    if transposed:
        b = b.t()
    torch.mm(a, b)
    best, start, k = math.inf, time.perf_counter(), 0
    while k < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
        k += 1
    return 2 * n**3 / best


@dataclass
class Peaks:
    """Measured matmul FLOP/s per precision and layout ("a@b", "a@w.T"); the peak is the better layout."""

    sizes: dict[str, int]
    flops: dict[str, dict[str, float]]

    def of(self, precision: str) -> float:
        return max(self.flops[precision].values())

    def describe(self) -> str:
        parts = []
        for precision, by_layout in self.flops.items():
            layouts = ", ".join(f"{layout} {gflops(f)}" for layout, f in by_layout.items())
            n = self.sizes[precision]
            parts.append(f"{precision} {gflops(self.of(precision))} GFLOP/s ({n}^3; {layouts})")
        ratio = self.of("bf16") / self.of("fp32") if "bf16" in self.flops else None
        return "; ".join(parts) + (f"; bf16/fp32 = {ratio:.2f}" if ratio is not None else "")


def measure_peaks(precisions: tuple[str, ...] = ("fp32", "bf16"), n_fp32: int = 2048, n_bf16: int = 1024) -> Peaks:
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    sizes = {"fp32": n_fp32, "bf16": n_bf16}
    flops = {
        p: {layout: matmul_peak(dtypes[p], sizes[p], t) for layout, t in (("a@b", False), ("a@w.T", True))}
        for p in precisions
    }
    return Peaks({p: sizes[p] for p in precisions}, flops)


def gflops(x: float) -> str:
    return f"{x / 1e9:,.1f}"
