"""One decoding step of the decoder (one new token per row, in inference), as a plain function over the weights.

:meth:`transduce.model.Transformer.decode` calls :func:`decode_step` when it is asked for one new position per row
outside autograd in eval mode: every step of a search. It computes what the decoder's modules compute (the same
operations in the same order, up to float rounding; ``tests/test_model.py`` compares the two), with fewer
operations and no module calls:

- the weights are read from the modules once per search, at its first step, into :class:`StepWeights`, which the
  cache carries from step to step (module attribute look-ups and calls cost microseconds each, and a step of a
  4-layer decoder makes a few hundred of them);
- each linear layer is one ``torch.addmm`` on the weight's transposed view, and a sublayer's output projection
  adds into the residual directly (``addmm(x, a, W^T)`` plus the bias, not a projection and then a sum);
- the new keys and values go into the cache with one copy per layer, and the queries of the new position go to
  attention as views, with no head split or merge copies; the embedding, scale and position are one ``torch.add``.

Why: a decoding step of a small model is made of many small operations, and in eager PyTorch each costs Python and
dispatch time whatever its size: see docs/benchmarks.md for what it saved on the Multi30k model. Forward hooks on the
decoder's modules do not run here; ``transduce.fastpaths.settings.step_function = False`` decodes through the
modules.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from transduce import fastpaths
from transduce.model import bf16, kernels, packed, quantize
from transduce.model.cache import DecoderCache

Linear = Callable[..., Tensor]  # (x, residual=None) -> x W^T + b (+ residual)
Norm = Callable[[Tensor], Tensor]


def _linear(lin: nn.Module, relu: bool = False) -> Linear:
    """``lin`` (followed by a ReLU when ``relu``) as a function of ``(x, residual=None)``: for a plain ``nn.Linear``
    one ``addmm`` (on a contiguous transposed copy of the weight with ``fastpaths.settings.transposed_weights``,
    :func:`~transduce.model.packed.transposed_weight`), or oneDNN's product with the packed weight where
    ``fastpaths.settings.onednn_layers`` is set and the product is large enough
    (:func:`~transduce.model.packed.onednn_size`); for a bf16 layer oneDNN's bf16 product; for a dynamically
    quantised layer :func:`~transduce.model.quantize.int8_function` (transduce's VNNI product where it applies,
    else PyTorch's int8 operation; ReLU and residual fused); any other layer through
    :func:`~transduce.model.packed.project`, as in the modules."""
    quantised = _int8_linear(lin, relu)
    if quantised is not None:
        return quantised
    if type(lin) is bf16.BF16Linear:  # bf16 weights: oneDNN's bf16 product, ReLU and residual fused
        return bf16.bf16_function(lin, relu)
    activation = "relu" if relu else None
    if type(lin) is not nn.Linear:

        def call(x: Tensor, residual: Tensor | None = None) -> Tensor:
            y = packed.project(lin, x, activation)
            return y if residual is None else residual + y  # (an unknown layer's output may not be its own)

        return call
    b, outputs = lin.bias, lin.out_features
    # MKL's plain product with a transposed copy of the weight where that is faster (fastpaths.transposed_weights)
    w = packed.transposed_weight(lin.weight) if fastpaths.settings.transposed_weights else lin.weight.t()

    def addmm(x: Tensor, residual: Tensor | None = None) -> Tensor:
        if fastpaths.settings.onednn_layers and packed.onednn_size(x, outputs):
            y = packed.project(lin, x, activation)
        elif residual is not None and not relu:  # the residual added inside the product
            y = torch.addmm(residual, x, w)
            return y if b is None else y.add_(b)
        else:
            y = torch.mm(x, w) if b is None else torch.addmm(b, x, w)
            y = y.relu_() if relu else y
        return y if residual is None else y.add_(residual)

    return addmm


def _int8_linear(lin: nn.Module, relu: bool) -> Linear | None:
    """A dynamically quantised int8 linear layer (``torch.ao.nn.quantized.dynamic.Linear``, what
    :func:`~transduce.model.quantize.quantize_int8` makes) as :func:`~transduce.model.quantize.int8_function`
    (transduce's VNNI kernel, or the operation the layer's ``forward`` calls), the ReLU and the residual fused
    into it; None for any other layer (float16 ones included)."""
    if type(lin) is not DynamicLinear or lin._packed_params.dtype != torch.qint8:
        return None

    return quantize.int8_function(lin, relu)


def _output(lin: nn.Module) -> Callable[[Tensor], Tensor]:
    """The pre-softmax projection as a function of (B, d_model) rows: the int8 operation for a quantised layer
    (:func:`_int8_linear`), else :func:`~transduce.model.packed.project` as the model calls it."""
    int8 = _int8_linear(lin, relu=False)
    return int8 if int8 is not None else lambda x: packed.project(lin, x, output=True)


def _norm(norm: nn.Module) -> Norm:
    """A LayerNorm as a function (the identity for ``nn.Identity``, the post-norm decoder's missing final norm):
    transduce's kernel where it applies (float32 on the CPU), else ``torch.layer_norm``."""
    if isinstance(norm, nn.Identity):
        return lambda x: x
    shape, weight, bias, eps = norm.normalized_shape, norm.weight, norm.bias, norm.eps
    applies = norm.weight is not None and kernels.applies(norm.weight)
    kernel = kernels.compiled() if applies else None
    if kernel is None or len(shape) != 1:
        return lambda x: torch.layer_norm(x, shape, weight, bias, eps)
    # (under CPU autocast the activations are bf16, which the kernel does not take)
    return lambda x: (
        kernel.layer_norm(x, weight, bias, eps)
        if x.dtype == torch.float32
        else torch.layer_norm(x, shape, weight, bias, eps)
    )


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as :func:`decode_step` uses it."""

    norm1: Norm
    qkv: Linear
    self_out: Linear
    norm2: Norm
    cross_q: Linear
    cross_out: Linear
    norm3: Norm
    w1: Linear  # with the activation fused when it is a ReLU
    activation: Callable[[Tensor], Tensor] | None  # None: fused into w1
    w2: Linear


@dataclass(frozen=True)
class StepWeights:
    """The decoder's weights, read from its modules once per search (the tensors themselves, not copies)."""

    model: nn.Module  # the model they were read from: a cache passed to another model's decode is read anew
    layers: tuple[LayerWeights, ...]
    final_norm: Norm
    pre_norm: bool
    embedding: Tensor  # (tgt_vocab, d_model)
    embed_scale: float
    positions: nn.Module  # (offset, length) -> (length, d_model)
    output: Callable[[Tensor], Tensor]  # the pre-softmax projection: packed.project, or the int8 operation
    heads: int
    d_k: int
    # the layers as the kernel's decoder_step takes them (weights, layer norm eps), where it applies: _kernel_layers
    kernel_layers: tuple[list[Tensor], list[float]] | None = None

    @classmethod
    def of(cls, model: nn.Module) -> StepWeights:
        cfg = model.config
        layers = []
        for layer in model.decoder_layers:
            relu = layer.ffn.act is F.relu
            layers.append(LayerWeights(
                _norm(layer.norm1), _linear(layer.self_attn.qkv), _linear(layer.self_attn.out),
                _norm(layer.norm2), _linear(layer.cross_attn.q), _linear(layer.cross_attn.out),
                _norm(layer.norm3), _linear(layer.ffn.w1, relu), None if relu else layer.ffn.act,
                _linear(layer.ffn.w2),
            ))  # fmt: skip
        return cls(
            model, tuple(layers), _norm(model.decoder_norm), cfg.norm == "pre", model.tgt_embed.weight,
            model.embed_scale, model.tgt_positions, _output(model.output), cfg.heads, cfg.d_k, _kernel_layers(model),
        )  # fmt: skip


_NONE = torch.empty(0)  # decoder_step's "no bias" (and "no norm weight"): a tensor with no elements


def _kernel_layers(model: nn.Module) -> tuple[list[Tensor], list[float]] | None:
    """The decoder's layers as the kernel's ``decoder_step`` takes them (``fastpaths.settings.step_kernel``): 18
    tensors per layer (each norm's weight and bias, each linear layer's weight as the (inputs, outputs) matrix
    :func:`_linear` multiplies by and its bias), the final norm's two, and the norms' eps; None where the kernel does
    not apply: the kernels not built, weights not float32 on the CPU, a linear layer that is not a plain
    ``nn.Linear`` or that oneDNN would take (``onednn_layers``), a norm that is not a ``LayerNorm`` over the last
    dimension, an activation other than ReLU."""
    paths = fastpaths.settings
    if not (paths.step_kernel and paths.kernels) or paths.onednn_layers:
        return None
    if not kernels.applies(model.tgt_embed.weight) or kernels.compiled() is None:
        return None
    weights: list[Tensor] = []
    eps: list[float] = []

    def linear(lin: nn.Module) -> bool:
        if type(lin) is not nn.Linear or not kernels.applies(lin.weight):
            return False
        weights.append(packed.transposed_weight(lin.weight) if paths.transposed_weights else lin.weight.t())
        weights.append(_NONE if lin.bias is None else lin.bias)
        return True

    def norm(n: nn.Module) -> bool:
        if type(n) is not nn.LayerNorm or len(n.normalized_shape) != 1:
            return False
        weights.extend(_NONE if t is None else t for t in (n.weight, n.bias))
        eps.append(n.eps)
        return True

    for layer in model.decoder_layers:
        if layer.ffn.act is not F.relu:
            return None
        parts = (
            norm(layer.norm1) and linear(layer.self_attn.qkv) and linear(layer.self_attn.out)
            and norm(layer.norm2) and linear(layer.cross_attn.q) and linear(layer.cross_attn.out)
            and norm(layer.norm3) and linear(layer.ffn.w1) and linear(layer.ffn.w2)
        )  # fmt: skip
        if not parts:
            return None
    if isinstance(model.decoder_norm, nn.Identity):  # the post-norm decoder has no final norm
        weights += [_NONE, _NONE]
        eps.append(0.0)
    elif not norm(model.decoder_norm):
        return None
    return weights, eps


def decode_step(
    model: nn.Module, tokens: Tensor, cache: DecoderCache, logits: bool = True
) -> tuple[Tensor, DecoderCache]:
    """:meth:`~transduce.model.Transformer.decode` for ``tokens`` of shape (B, 1), in inference: the logits (B, 1,
    tgt_vocab) of the next token and the cache extended by this position (the cache passed in is not modified).
    With ``logits=False`` the decoder's output states (B, d_model) instead, before the pre-softmax projection (for
    a search that reduces the logits as it makes them: ``search/candidates.py``)."""
    weights = cache.step_weights
    if weights is None or weights.model is not model:
        weights = StepWeights.of(model)
    rows, t, group = tokens.shape[0], cache.length, cache.group
    heads, d_k, pre, embedding = weights.heads, weights.d_k, weights.pre_norm, weights.embedding
    d_model = heads * d_k
    # attention through transduce's kernels (kernels.py) for float32 on the CPU, else PyTorch's. Under CPU autocast
    # the activations are bf16 (or float16), which the kernels do not take. With the kernels and a long source the
    # self-attention cache is stored by position (DecoderCache.table): written in place, never gathered. Below
    # fastpaths.settings.by_position_min_source tokens, copying the cache into row order inside the attention
    # kernel costs no more (beam 4, `small`, one thread: by position 0.92-1.00x up to 400 tokens and 1.70x at 800 on
    # an AMD Zen 5, 0.91x at 50 and 1.14x at 100 on an Intel Xeon with AMX: fastpaths.by_position_threshold).
    kernel = kernels.compiled() if kernels.applies(embedding) and not torch.is_autocast_enabled("cpu") else None
    min_source = fastpaths.settings.by_position_min_source
    by_table = kernel is not None and (
        cache.table is not None or (t == 0 and cache.cross_kv[0][0].shape[2] >= min_source)
    )
    # without the table and with the kernels, each layer's attention copies the cache's rows into the new cache
    # itself (attend_gathered), where they are read anyway
    gathered = kernel is not None and not by_table
    position = weights.positions(t, 1)[0]
    if position.dtype != embedding.dtype:
        position = position.to(embedding.dtype)
    x = torch.add(position, torch.embedding(embedding, tokens.view(rows)), alpha=weights.embed_scale)  # (B, d_model)
    memory_mask, scale = cache.memory_mask, d_k**-0.5
    if kernel is not None and memory_mask is not None:
        memory_mask = memory_mask[:, 0, 0]  # (B / group, S)
    past = order = None
    if gathered:
        order = cache.order.contiguous() if t > 0 and cache.order is not None else None  # (nothing to order at t = 0)
        if weights.kernel_layers is not None:  # the loop below in one kernel call (the same operations)
            tensors, eps = weights.kernel_layers
            keys, values = zip(*cache.cross_kv)
            past_all = cache.self_kv.contiguous() if t > 0 else None  # (layers, 2, B', h, t, d_k)
            out, self_kv = kernel.decoder_step(
                x, tensors, eps, past_all, order, keys, values, memory_mask, heads, group, pre, scale
            )  # fmt: skip
            out = weights.output(out)[:, None] if logits else out
            return out, DecoderCache(self_kv, cache.cross_kv, cache.memory_mask, group, step_weights=weights)
        past = cache.self_kv.contiguous().unbind(0) if t > 0 else None  # per layer (2, B', h, t, d_k)
        self_kv = embedding.new_empty(len(weights.layers), 2, rows, heads, t + 1, d_k)  # written by the kernel
    elif by_table:
        self_kv, written = _storage(cache, weights, rows)  # (layers, 2, capacity, slab rows, h, d_k)
        column = torch.arange(rows, device=embedding.device)[:, None]  # this step's rows write slab rows 0 .. B - 1
        table = column if t == 0 else torch.cat([cache.table, column], dim=1)  # (B, t + 1)
    else:
        self_kv = model._extended_self_kv(cache, 1)  # (layers, 2, B, h, t + 1, d_k); the new position written below
    # (methods, not indexing: `t[:, 1:]` costs several times `t.narrow(1, 1, 2)`, and a step makes dozens)
    for i, (w, kv, (k, v)) in enumerate(zip(weights.layers, self_kv.unbind(0), cache.cross_kv)):
        # masked self-attention: the new position's keys and values into the cache, its query over all t + 1
        qkv = w.qkv(w.norm1(x) if pre else x).view(rows, 3, heads, d_k)
        new_kv = qkv.narrow(1, 1, 2).transpose(0, 1)  # (2, B, h, d_k)
        if by_table:
            kv.select(1, t).narrow(1, 0, rows).copy_(new_kv)  # kv: (2, capacity, slab rows, h, d_k)
        elif not gathered:
            kv.select(3, t).copy_(new_kv)  # kv: (2, B, h, t + 1, d_k)
        s_row, _, s_head, s_dim = qkv.stride()
        q = qkv.as_strided((rows, heads, 1, d_k), (s_row, s_head, s_head, s_dim))  # qkv[:, 0, :, None]: (B, h, 1, d_k)
        if by_table:
            a = kernel.attend_by_table(q, *kv.unbind(0), table, scale)  # (B, 1, h, d_k)
        elif gathered:
            a = kernel.attend_gathered(q, None if past is None else past[i], order, new_kv, kv, scale)
        elif kernel is not None:
            a = kernel.attend(q, *kv.unbind(0), None, scale)  # (B, 1, h, d_k)
        else:
            a = F.scaled_dot_product_attention(q, *kv.unbind(0))  # (B, h, 1, d_k)
        x = w.self_out(a.reshape(rows, d_model), x)
        if not pre:
            x = w.norm1(x)
        # attention over the encoder output: the queries of a sentence's `group` rows together
        q = w.cross_q(w.norm2(x) if pre else x).view(rows // group, group, heads, d_k).transpose(1, 2)
        if kernel is not None:
            a = kernel.attend(q, k, v, memory_mask, scale)  # (B / group, group, h, d_k)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=memory_mask).transpose(1, 2)
        x = w.cross_out(a.reshape(rows, d_model), x)
        if not pre:
            x = w.norm2(x)
        # feed-forward
        h = w.w1(w.norm3(x) if pre else x)
        x = w.w2(h if w.activation is None else w.activation(h), x)
        if not pre:
            x = w.norm3(x)
    out = weights.final_norm(x)  # (B, d_model)
    out = weights.output(out)[:, None] if logits else out  # (B, 1, V)
    if by_table:
        return out, DecoderCache(self_kv, cache.cross_kv, cache.memory_mask, group, None, weights, table, written)
    return out, DecoderCache(self_kv, cache.cross_kv, cache.memory_mask, group, step_weights=weights)


FIRST_CAPACITY = 16  # positions of a new by-position storage; it doubles when full
_written_lock = threading.Lock()


def _storage(cache: DecoderCache, weights: StepWeights, rows: int) -> tuple[Tensor, list[int]]:
    """The by-position storage a step writes its position ``t = cache.length`` into, and its ``written`` count
    (already counting position t): the cache's own when no other step has written position t there yet and it has
    room; else a new one, twice as long when it was full, with the cache's t positions copied (the old storage is
    left as it was, for the caches that use it)."""
    layers, heads, d_k, t = len(weights.layers), weights.heads, weights.d_k, cache.length
    if cache.table is None:  # the first step
        return _new_storage(weights.embedding, layers, FIRST_CAPACITY, rows, heads, d_k), [1]
    storage, written = cache.self_kv, cache.written
    capacity, slab_rows = storage.shape[2], storage.shape[3]
    # an inference tensor (the storage of a search under torch.inference_mode) cannot be written outside it
    writable = not storage.is_inference() or torch.is_inference_mode_enabled()
    if writable and t < capacity and rows <= slab_rows:
        with _written_lock:  # two threads stepping from caches on one storage: only one writes position t in place
            if written[0] == t:
                written[0] = t + 1
                return storage, written
    capacity = 2 * capacity if t >= capacity else capacity
    grown = _new_storage(storage, layers, capacity, max(rows, slab_rows), heads, d_k)
    grown[:, :, :t, :slab_rows].copy_(storage[:, :, :t])
    return grown, [t + 1]


def _new_storage(like: Tensor, layers: int, capacity: int, slab_rows: int, heads: int, d_k: int) -> Tensor:
    """An uninitialised by-position storage, indexed (layer, k/v, position, slab row, head, :) but laid out with
    the positions of each (slab row, head) next to each other: a row whose ancestors kept their slab row reads its
    keys and values as one run of memory (greedy search's rows always do)."""
    return like.new_empty(layers, 2, slab_rows, heads, capacity, d_k).permute(0, 1, 4, 2, 3, 5)
