"""The Transformer's building blocks (paper §3): attention, feed-forward, positions, encoder and decoder layers.

Mask convention, used everywhere in this package: an attention mask is a boolean tensor broadcastable to
``(batch, heads, query_len, key_len)`` in which **True means "may attend"** (the convention of
``torch.nn.functional.scaled_dot_product_attention``). ``None`` means "attend everywhere". Masks are built only by
:func:`padding_mask` and :func:`causal_mask`.

The CPU's fast paths of these layers are in :mod:`transduce.model.fused`, one call each, beside the PyTorch code
that they compute the same as: dropout (``fused.dropout``, ``fused.Dropout``), the post-norm residual in training
(``fused.add_norm``) and inference attention through the attention kernel (``fused.attend``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce import fastpaths
from transduce.model import fused
from transduce.model.packed import project

KV = tuple[Tensor, Tensor]  # (keys, values), each (B, h, T, d_k)


# ----------------------------------------------------------------------------------------------------------------------
# masks


def padding_mask(tokens: Tensor, pad_id: int, padded: bool | None = None) -> Tensor | None:
    """Key mask for a right-padded batch.

    Args:
        tokens: (B, S) token ids.
        pad_id: the padding id.
        padded: whether the batch has padding, when the caller knows (a training batch counts its tokens on the
            CPU); None: looked up on a CPU tensor, assumed on any other device (looking would wait for the device
            to finish its queue, and a mask of all True gives the same attention).
    Returns:
        (B, 1, 1, S) bool, True at real tokens; ``None`` when the batch has no padding (the fast path).
    """
    if padded is False:
        return None
    real = tokens.ne(pad_id)
    if padded is None and tokens.device.type == "cpu" and bool(real.all()):
        return None
    return real[:, None, None, :]


def causal_mask(query_len: int, key_len: int, device: torch.device | None = None) -> Tensor:
    """Causal mask for ``query_len`` new positions that follow ``key_len - query_len`` cached ones.

    Returns:
        (1, 1, query_len, key_len) bool: query i (absolute position key_len - query_len + i) may attend key j <= it.
    """
    offset = key_len - query_len
    q = torch.arange(query_len, device=device)[:, None] + offset
    k = torch.arange(key_len, device=device)[None, :]
    return (k <= q)[None, None]


# ----------------------------------------------------------------------------------------------------------------------
# positions


def sinusoid(positions: Tensor, d_model: int) -> Tensor:
    """The paper's positional encoding at the given positions (§3.5), computed in float64 for accuracy.

    ``PE(pos, 2i) = sin(pos / 10000^(2i/d_model))`` and ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))``.
    The float64 arithmetic runs on the CPU (Apple's ``mps`` has no float64); the result is on ``positions``' device.

    Args:
        positions: (T,) integer positions.
    Returns:
        (T, d_model) float32.
    """
    if positions.is_meta:  # shapes only (``with torch.device("meta")``)
        return torch.empty(len(positions), d_model, device=positions.device)
    cpu = torch.device("cpu")  # (explicitly: a ``with torch.device(...)`` context would move them)
    pos = positions.to(cpu, torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=cpu)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (T, d_model / 2)
    pe = torch.empty(len(positions), d_model, dtype=torch.float64, device=cpu)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.to(torch.float32).to(positions.device)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings for any length: a table is computed once and grown (doubled) on demand.

    The table is a plain attribute, not a buffer: ``DistributedDataParallel`` broadcasts buffers from rank 0 before
    every forward pass, and tables that grew to different sizes on different ranks (a long validation sentence
    decoded by one rank) would be broadcast with different shapes. It follows the module's ``.to()`` all the same
    (:meth:`_apply`), and is grown outside inference mode, so a table grown by a search (under
    ``torch.inference_mode``) is an ordinary tensor that training can use afterwards.
    """

    def __init__(self, d_model: int, initial_length: int = 256):
        super().__init__()
        self.d_model = d_model
        self.table = sinusoid(torch.arange(initial_length), d_model)  # (length, d_model)

    def _apply(self, fn, recurse: bool = True):  # (nn.Module's: .to(), .cuda(), .half() move the table too)
        self.table = fn(self.table)
        return super()._apply(fn, recurse)

    def forward(self, offset: int, length: int) -> Tensor:
        """Encodings of positions ``offset .. offset + length - 1``, shape (length, d_model)."""
        end = offset + length
        table = self.table
        if end > table.shape[0]:
            size = max(end, 2 * table.shape[0])
            with torch.inference_mode(False):
                table = sinusoid(torch.arange(size), self.d_model).to(device=table.device, dtype=table.dtype)
            self.table = table  # a single assignment: safe for concurrent readers
        return table[offset:end]


class LearnedPositions(nn.Module):
    """Learned absolute position embeddings (Table 3, row E), for positions below ``max_positions``."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, offset: int, length: int) -> Tensor:
        end = offset + length
        if end > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence of {end} positions exceeds max_positions={self.embedding.num_embeddings} of the learned "
                "position embeddings; translate shorter pieces or train with sinusoidal positions"
            )
        return self.embedding.weight[offset:end]


# ----------------------------------------------------------------------------------------------------------------------
# attention and feed-forward


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention, ``softmax(Q K^T / sqrt(d_k)) V`` over h heads (§3.2).

    Self-attention projects Q, K and V with one fused (3 d_model x d_model) matrix; cross-attention projects Q from
    the decoder and K, V with one fused matrix from the encoder output (computed once per source sentence).
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float, bias: bool, self_attention: bool):
        super().__init__()
        self.heads, self.d_k, self.dropout = heads, d_model // heads, dropout
        if self_attention:
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # [W^Q; W^K; W^V]
        else:
            self.q = nn.Linear(d_model, d_model, bias=bias)
            self.kv = nn.Linear(d_model, 2 * d_model, bias=bias)  # [W^K; W^V]
        self.out = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (getattr(self, "qkv", None), getattr(self, "q", None), getattr(self, "kv", None), self.out):
            if lin is None:
                continue
            d = lin.in_features
            for block in lin.weight.data.split(d, dim=0):  # Xavier per d x d projection, as if unfused
                nn.init.xavier_uniform_(block)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def _heads(self, x: Tensor, parts: int) -> Tensor:
        """(B, T, parts * d_model) -> (parts, B, h, T, d_k), a view of ``x`` (two operations however many parts: a
        decoding step is made of many small operations, and each costs)."""
        b, t, _ = x.shape
        return x.view(b, t, parts, self.heads, self.d_k).permute(2, 0, 3, 1, 4)

    def memory_kv(self, memory: Tensor) -> KV:
        """Keys and values of the encoder output for cross-attention, each (B, h, S, d_k)."""
        k, v = self._heads(project(self.kv, memory), 2).unbind(0)
        return k, v

    def self_attend(
        self,
        x: Tensor,
        mask: Tensor | None,
        *,
        causal: bool = False,
        cache: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention of ``x`` (B, T, d_model) over itself and, with a ``cache``, over earlier positions.

        Args:
            mask: attention mask (see module docstring) or None.
            causal: when True and ``mask`` is None, each position attends only to itself and earlier positions,
                cached ones included.
            cache: (2, B, h, t + T, d_k) whose first t positions hold the keys (``[0]``) and values (``[1]``) of
                earlier positions in the batch's row order (see :meth:`~transduce.model.Transformer.decode`): the
                keys and values of ``x`` are written into its last T positions, in place, and ``x`` attends over
                all t + T.
        Returns:
            output (B, T, d_model), and the attention weights (B, h, T, t + T) when ``need_weights`` else None.
        """
        qkv = self._heads(project(self.qkv, x), 3)
        if cache is None:
            q, k, v = qkv.unbind(0)
        else:
            q = qkv[0]
            cache.narrow(3, cache.shape[3] - q.shape[2], q.shape[2]).copy_(qkv[1:])
            k, v = cache.unbind(0)
        is_causal = False
        if causal and mask is None:
            if k.shape[2] == q.shape[2]:
                is_causal = True  # no earlier positions: SDPA's own (fast) causal masking
            elif q.shape[2] > 1:
                mask = causal_mask(q.shape[2], k.shape[2], q.device)  # several new positions after a cache
            # else: one new position after the cache may see every key
        return self._attend(q, k, v, mask, is_causal, need_weights)

    def cross_attend(
        self, x: Tensor, kv: KV, mask: Tensor | None, *, group: int = 1, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of the decoder states ``x`` (B, T, d_model) over the encoder's (k, v) from :meth:`memory_kv`.

        With ``group`` > 1, ``kv`` and ``mask`` hold one row per ``group`` consecutive rows of ``x`` (the beams of a
        sentence); the group's queries attend together, so the keys and values are neither copied nor read once per
        row.
        """
        q = self._heads(project(self.q, x), 1)[0]  # (B, h, T, d_k)
        if group == 1:
            return self._attend(q, kv[0], kv[1], mask, False, need_weights)
        b, h, t, d_k = q.shape
        q = q.view(b // group, group, h, t, d_k).transpose(1, 2).reshape(b // group, h, group * t, d_k)
        out, weights = self._attend(q, kv[0], kv[1], mask, False, need_weights)  # (B / group, group * T, d_model)
        if weights is not None:  # (B / group, h, group * T, S) -> (B, h, T, S)
            weights = weights.view(b // group, h, group, t, -1).transpose(1, 2).reshape(b, h, t, -1)
        return out.view(b, t, -1), weights

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``softmax(Q K^T / sqrt(d_k)) V`` in each head, the heads concatenated and projected by W^O (§3.2.2): as
        explicit products where the weights are wanted or autograd differentiates on the CPU (see
        :func:`explicit_attention`), else through the attention kernel where :func:`fused.attend` applies, else SDPA."""
        p = self.dropout if self.training else 0.0
        explicit = q.requires_grad and q.device.type == "cpu"
        if need_weights or (explicit and k.shape[2] <= fastpaths.settings.explicit_attention_max_keys):
            out, weights = explicit_attention(q, k, v, mask, is_causal, p)
            weights = weights if need_weights else None
        else:
            fast = fused.attend(q, k, v, mask, is_causal, p)  # the attention kernel; None where it does not apply
            if fast is not None:
                return project(self.out, fast), None
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)
            weights = None
        b, h, t, d_k = out.shape
        out = out.transpose(1, 2).reshape(b, t, h * d_k)  # concat heads: (B, T, d_model)
        return project(self.out, out), weights


# Attention that autograd will differentiate on the CPU goes through explicit_attention instead of
# scaled_dot_product_attention, whose CPU kernel is a flash-attention kernel built for long sequences: at
# translation lengths its backward pass was 3-5x slower than the explicit products in bf16 and about 1.2x slower in
# float32 on this project's machine (benchmarks/train_speed.py --profile shows both). The cost is memory: the
# (B, h, T, S) scores and weights are kept for the backward pass, so batches with more than
# fastpaths.settings.explicit_attention_max_keys keys (where the explicit products' lead also shrinks: at 400 keys
# 1.7x in bf16, none in float32) keep SDPA's kernel, whose memory grows linearly with length.


def explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """``softmax(Q K^T / sqrt(d_k)) V`` with the weights materialised, the function ``scaled_dot_product_attention``
    computes (same mask convention; ``is_causal`` is its top-left causal mask).

    The products run in the inputs' dtype (bf16 under autocast, as Hugging Face's eager attention); the softmax is
    float32, and its weights are cast to ``v``'s dtype for the product with the values. Under bf16 autocast the
    gradients of the Multi30k model (200 validation sentences) differed from float32 training by 2.88e-2
    (relative norm) with these bf16 scores, 2.86e-2 with float32 scores and 3.41e-2 through SDPA's bf16 kernel:
    the linear layers' bf16 products dominate, and float32 scores cost 1.04x the step. ``dropout_p`` drops
    attention weights (:func:`transduce.model.fused.dropout`).

    A query whose every key is masked gets zero weights and a zero output, as from SDPA.

    Returns:
        output (B, h, Tq, d_v) in ``v``'s dtype and the weights (B, h, Tq, Tk), float32.
    """
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (B, h, Tq, Tk)
    if is_causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1, dtype=torch.float32)
    if mask is not None:
        nothing = ~mask.any(dim=-1, keepdim=True)  # a query with every key masked: zeros, as SDPA gives, not NaN
        if bool(nothing.any()):
            weights = weights.masked_fill(nothing, 0.0)
    dropped = fused.dropout(weights, dropout_p, dropout_p > 0.0)
    return dropped.to(v.dtype) @ v, weights


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """Position-wise ``FFN(x) = act(x W1 + b1) W2 + b2`` (§3.3); the paper's act is ReLU."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str, dropout: float):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.act = ACTIVATIONS[activation]
        self.dropout = fused.Dropout(dropout)
        for lin in (self.w1, self.w2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.act is F.relu and not self.training:  # inference: ReLU fused into the first product
            return project(self.w2, project(self.w1, x, "relu"))
        return project(self.w2, self.dropout(self.act(project(self.w1, x))))


# ----------------------------------------------------------------------------------------------------------------------
# layers


class _Residual(nn.Module):
    """Residual wiring shared by both layer types: post-norm ``LayerNorm(x + Dropout(y))`` (the paper) or pre-norm
    ``x + Dropout(y)`` with ``LayerNorm`` applied to the sublayer's input."""

    def __init__(self, pre_norm: bool, dropout: float):
        super().__init__()
        self.pre_norm = pre_norm
        self.dropout = fused.Dropout(dropout)

    def inp(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return norm(x) if self.pre_norm else x

    def add(self, x: Tensor, y: Tensor, norm: nn.LayerNorm) -> Tensor:
        if not self.pre_norm:  # the kernel's LayerNorm(x + dropout(y)) in training; None where it does not apply
            fast = fused.add_norm(x, y, norm, self.dropout.p, self.training)
            if fast is not None:
                return fast
        x = x + (self.dropout(y) if self.training else y)  # (no module call in inference: each one costs)
        return x if self.pre_norm else norm(x)


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each wrapped in a residual connection and LayerNorm."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = MultiHeadAttention(
            cfg.d_model, cfg.heads, dropout=cfg.attention_dropout, bias=cfg.bias, self_attention=True
        )
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, activation=cfg.activation, dropout=cfg.activation_dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.res = _Residual(cfg.norm == "pre", cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor | None, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        a, weights = self.self_attn.self_attend(self.res.inp(x, self.norm1), mask, need_weights=need_weights)
        x = self.res.add(x, a, self.norm1)
        x = self.res.add(x, self.ffn(self.res.inp(x, self.norm2)), self.norm2)
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder output, then feed-forward; each with residual + norm."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = MultiHeadAttention(
            cfg.d_model, cfg.heads, dropout=cfg.attention_dropout, bias=cfg.bias, self_attention=True
        )
        self.cross_attn = MultiHeadAttention(
            cfg.d_model, cfg.heads, dropout=cfg.attention_dropout, bias=cfg.bias, self_attention=False
        )
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, activation=cfg.activation, dropout=cfg.activation_dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.res = _Residual(cfg.norm == "pre", cfg.dropout)

    def forward(
        self,
        x: Tensor,
        memory_kv: KV,
        memory_mask: Tensor | None,
        *,
        cache: Tensor | None = None,
        need_weights: bool = False,
        group: int = 1,
    ) -> tuple[Tensor, tuple[Tensor | None, Tensor | None]]:
        """Causal self-attention over ``x`` (B, T, d_model) and, with a ``cache`` (this layer's part of the decoder
        cache, see :meth:`MultiHeadAttention.self_attend`, which writes ``x``'s keys and values into it), earlier
        positions; then attention over the encoder output (``memory_kv`` and ``memory_mask`` with one row per
        ``group`` rows of ``x``, see :class:`~transduce.model.DecoderCache`).

        Returns:
            x, and the (self, cross) attention weights when ``need_weights``.
        """
        a, self_w = self.self_attn.self_attend(
            self.res.inp(x, self.norm1), None, causal=True, cache=cache, need_weights=need_weights
        )
        x = self.res.add(x, a, self.norm1)
        c, cross_w = self.cross_attn.cross_attend(
            self.res.inp(x, self.norm2), memory_kv, memory_mask, group=group, need_weights=need_weights
        )
        x = self.res.add(x, c, self.norm2)
        x = self.res.add(x, self.ffn(self.res.inp(x, self.norm3)), self.norm3)
        return x, (self_w, cross_w)


class ClassificationHead(nn.Module):
    """A sentence vector to class scores, BERT's way: dropout, then one linear layer (weights drawn with standard
    deviation 0.02, biases zero, as BERT initialises it)."""

    def __init__(self, d_model: int, classes: int, *, dropout: float):
        super().__init__()
        self.dropout = fused.Dropout(dropout)
        self.out = nn.Linear(d_model, classes)
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, pooled: Tensor) -> Tensor:
        """(B, d_model) -> (B, classes) logits."""
        return self.out(self.dropout(pooled))
