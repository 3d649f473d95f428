"""The fast paths of the layers of :mod:`transduce.model.layers` on the CPU, each behind one call that the layer
makes, and each computing what the layer's plain PyTorch code computes:

- :func:`dropout` and :class:`Dropout` (every dropout of the model, §5.4): a mask hashed from a seed and each
  element's index, one pass of a compiled kernel (``csrc/training.cpp``) or the same mask from PyTorch's operations,
  nothing kept for the backward pass; :func:`torch.nn.functional.dropout` on other devices.
- :func:`add_norm` (a post-norm residual connection in training): ``LayerNorm(x + dropout(y))`` as one kernel each
  way; None where it does not apply, and the layer runs dropout, the sum and its LayerNorm.
- :func:`attend` (inference attention, the encoder's and cross-attention outside the step function): transduce's
  attention kernel (:func:`transduce.model.kernels.attend`) for short key sets; None where it does not apply, and
  the layer runs ``scaled_dot_product_attention``.

The settings (:mod:`transduce.fastpaths`): ``kernels`` for all three (off: PyTorch's operations, dropout with the
same masks), ``attention_kernel_max_keys`` for :func:`attend`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from transduce import fastpaths
from transduce.model import kernels

# ----------------------------------------------------------------------------------------------------------------------
# dropout

_KEEP_LEVELS = 1 << 16  # the CPU dropout draws 16 random bits per element
_M32 = 0xFFFFFFFF


def _keep_levels(p: float) -> int:
    """How many of the 2^16 values of a 16-bit draw keep an element at drop probability ``p``."""
    return round((1.0 - p) * _KEEP_LEVELS)


def _mul32(x: Tensor, c: int) -> Tensor:
    """``x * c mod 2^32`` for int64 tensors of 32-bit values, in halves so that no product overflows 64 bits."""
    return ((x & 0xFFFF) * c + (((x >> 16) * c) & 0xFFFF) * 65536) & _M32


def _mix32(x: Tensor) -> Tensor:
    """``mix32`` of ``csrc/training.cpp`` (Chris Wellons' lowbias32), on int64 tensors of 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def dropout_draws(n: int, seed: int, device: torch.device | str = "cpu") -> Tensor:
    """The 16-bit draws (int64 values in [0, 2^16)) of elements 0..n-1 under ``seed``, with PyTorch's operations:
    what the kernel ``dropout_apply`` of ``csrc/training.cpp`` computes. Element ``i = 16 b + l`` takes the low half
    of the 32 bits of word ``j = 8 b + l`` for ``l < 8`` and the high half of word ``8 b + l - 8`` otherwise; word
    ``j``'s bits are ``mix32(mix32(lo32(j) ^ lo32(seed)) ^ (hi32(j) + hi32(seed)))``."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    lane = i % 16
    j = 8 * (i // 16) + lane % 8
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    word = _mix32(_mix32((j & _M32) ^ k0) ^ (((j >> 32) + k1) & _M32))
    return (word >> (16 * (lane // 8))) & 0xFFFF


def _new_seed() -> int:
    """A 64-bit seed from PyTorch's default CPU generator (so ``torch.manual_seed`` and saved RNG states reproduce
    the masks)."""
    return int(torch.empty((), dtype=torch.int64).random_(-(2**63), None))


def _mask_parameters(p: float) -> tuple[int, int, float]:
    """(seed, levels, scale) of a dropout mask at drop probability ``p``: a new seed from PyTorch's generator (none
    drawn at ``p`` = 0, where every element is kept), the keeping draws, and the factor of the kept elements."""
    if p == 0.0:
        return 0, _KEEP_LEVELS, 1.0
    levels = _keep_levels(p)
    return _new_seed(), levels, _KEEP_LEVELS / levels


def _apply_mask(x: Tensor, seed: int, levels: int, scale: float) -> Tensor:
    """``x * scale`` where the draws of ``seed`` keep an element (draw < ``levels``), 0 elsewhere: the compiled kernel
    for float32 and bfloat16 where it is available, else the same function with PyTorch's operations."""
    if kernels.trains(x):
        return kernels.compiled().dropout_apply(x.contiguous(), seed, levels, scale)
    keep = dropout_draws(x.numel(), seed, x.device).view(x.shape) < levels
    return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype))


class _CPUDropout(torch.autograd.Function):
    """Inverted dropout whose mask is a function of a seed (:func:`dropout_draws`): nothing is kept for the backward
    pass but the seed, which is applied to the incoming gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        ctx.seed, ctx.levels, ctx.scale = _mask_parameters(p)
        return _apply_mask(x, ctx.seed, ctx.levels, ctx.scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return _apply_mask(grad, ctx.seed, ctx.levels, ctx.scale), None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout (§5.4): in training, zero each element with probability ``p`` and scale the rest by
    ``1 / (1 - p)``; the identity otherwise (``x`` itself, as also for ``p`` = 0).

    On the CPU this is one pass of a compiled kernel (``csrc/training.cpp``, built with the decoding kernels), not
    :func:`torch.nn.functional.dropout`, whose CPU Bernoulli sampler makes one double-precision draw per element and
    keeps a mask for the backward pass. Each element's keep decision is 16 bits of a counter-based hash of its index
    and a 64-bit seed drawn from PyTorch's generator (:func:`dropout_draws`; ``torch.manual_seed`` and saved RNG
    states reproduce the masks); the backward pass recomputes the mask from the seed, so dropout keeps no memory for
    it. On a bfloat16 (4086, 256) activation the kernel takes about 0.11 ms each way on two threads, against about
    2.8 ms forward plus backward for the earlier mask drawn from PyTorch's generator (``benchmarks/train_speed.py
    --profile``, docs/benchmarks.md). The drop probability is rounded to a multiple of 2^-16 (0.3 becomes 0.300003),
    and the kept elements are scaled by the inverse of the rounded keep probability, so the expectation is preserved
    (exactly in float32; bfloat16 rounds the product once per element, as :func:`torch.nn.functional.dropout` does).
    Without the compiled kernels (no compiler, or ``TRANSDUCE_KERNELS=0``) and for other dtypes, PyTorch's operations
    compute the same masks, more slowly. Other devices, and ``p`` within 2^-17 of 1, use
    :func:`torch.nn.functional.dropout`.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or _keep_levels(p) == 0:
        return F.dropout(x, p, True)
    return _CPUDropout.apply(x, p)


class Dropout(nn.Dropout):
    """:class:`torch.nn.Dropout` through :func:`dropout` (the faster CPU mask); ``inplace=True`` keeps PyTorch's
    in-place dropout."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)


# ----------------------------------------------------------------------------------------------------------------------
# the post-norm residual in training

# Post-norm residual connections in training on the CPU run LayerNorm(x + dropout(y)) as one kernel
# (csrc/training.cpp: the same dropout mask as dropout(), the LayerNorm in float32), one pass over the rows forward
# and one backward instead of dropout, add and LayerNorm with their backward passes; PyTorch's operations where the
# kernels do not apply.


class _AddLayerNorm(torch.autograd.Function):
    """``layer_norm(x + dropout(y, p), weight, bias, eps)`` over the last dimension through the kernels; ``x``
    float32, ``y`` float32 or bfloat16 (the sublayer's output under autocast). Keeps x, y and the row statistics;
    the backward pass recomputes the sum and the mask (from the seed)."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, weight: Tensor, bias: Tensor, p: float, eps: float) -> Tensor:
        ctx.seed, ctx.levels, ctx.scale = _mask_parameters(p)
        d = x.shape[-1]
        x2, y2 = x.reshape(-1, d).contiguous(), y.reshape(-1, d).contiguous()
        out, mean, rstd = kernels.compiled().add_layer_norm_forward(
            x2, y2, ctx.seed, ctx.levels, ctx.scale, weight.contiguous(), bias.contiguous(), eps
        )
        ctx.save_for_backward(x2, y2, mean, rstd, weight)
        ctx.shapes = x.shape, y.shape
        return out.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        x2, y2, mean, rstd, weight = ctx.saved_tensors
        g = grad.reshape(x2.shape).float().contiguous()
        gx, gy, gw, gb = kernels.compiled().add_layer_norm_backward(
            g, x2, y2, mean, rstd, ctx.seed, ctx.levels, ctx.scale, weight.contiguous()
        )
        return gx.view(ctx.shapes[0]), gy.view(ctx.shapes[1]), gw, gb, None, None


def _fused_residual_applies(x: Tensor, y: Tensor, norm: nn.LayerNorm, p: float) -> bool:
    return (
        x.dtype == torch.float32
        and x.shape == y.shape
        and tuple(norm.normalized_shape) == (x.shape[-1],)
        and norm.weight is not None
        and norm.bias is not None
        and norm.weight.dtype == norm.bias.dtype == torch.float32
        and (p == 0.0 or _keep_levels(p) > 0)
        and kernels.trains(y)
    )


def add_norm(x: Tensor, y: Tensor, norm: nn.LayerNorm, p: float, training: bool) -> Tensor | None:
    """``norm(x + dropout(y, p, training))`` through the kernels (:class:`_AddLayerNorm`) in training, where they
    apply; None elsewhere (inference, and tensors or norms the kernel does not take), where the caller computes it
    with PyTorch's operations."""
    if not training or not _fused_residual_applies(x, y, norm, p):
        return None
    return _AddLayerNorm.apply(x, y, norm.weight, norm.bias, p, norm.eps)


# ----------------------------------------------------------------------------------------------------------------------
# inference attention

# Inference attention (the encoder's, and the decoder's over the encoder output outside the step function) on the CPU
# goes through transduce's attention kernel (kernels.attend) for up to fastpaths.settings.attention_kernel_max_keys
# keys. One thread, the AVX-512 machine, 32 sentences x 4 heads of 32, a padding mask: 94 against SDPA's 139 us at 16
# keys, 3.4 against 4.1 ms at 128, 18.0 against 15.5 ms at 256; the Multi30k model's encoder over the 1,000 test
# sentences 124 -> 103 ms.


def _kernel_attends(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> bool:
    """Whether :func:`attend` may use the attention kernel: no gradient wanted, float32 on the
    CPU with the kernels built, at most ``fastpaths.settings.attention_kernel_max_keys`` keys, and no mask or a
    key-padding mask of exactly (B, 1, 1, S) (not a causal, broadcast or any other mask: those go to SDPA)."""
    if k.shape[2] > fastpaths.settings.attention_kernel_max_keys:
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    if mask is not None and not (
        mask.dtype == torch.bool and mask.shape == (q.shape[0], 1, 1, k.shape[2]) and mask.stride(3) == 1
    ):  # fmt: skip
        return False
    return kernels.applies(q)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout_p: float) -> Tensor | None:
    """Attention of ``q`` over ``k``, ``v`` (each (B, h, T, d_k), the mask as the layers' convention says) through
    the attention kernel, the heads concatenated: (B, T, h * d_k), what ``scaled_dot_product_attention`` gives with
    its heads side by side. None where the kernel does not apply (dropout, a causal mask, and see
    :func:`_kernel_attends`), where the caller runs SDPA."""
    if dropout_p != 0.0 or is_causal or not _kernel_attends(q, k, v, mask):
        return None
    b, h, t, d_k = q.shape
    padding = None if mask is None else mask[:, 0, 0]  # (B, S): True at real keys
    out = kernels.attend(q, k, v, padding, d_k**-0.5)  # (B, T, h, d_k): the heads already side by side
    return out.view(b, t, h * d_k)
