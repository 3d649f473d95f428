"""Linear layers through oneDNN with their weights kept in oneDNN's own layout, or through MKL with a transposed copy
of their weights, for float32 CPU inference.

Every ``nn.Linear`` of the model (the attention and feed-forward projections and the pre-softmax projection) goes
through :func:`project`. For the pre-softmax projection in eval mode, outside autograd, on a float32 CPU tensor, it
calls oneDNN's linear with a copy of the weight packed once into oneDNN's blocked layout; anywhere else, it is the
plain ``linear(x)``. With ``fastpaths.settings.onednn_layers`` set, the other layers take the oneDNN path too (and the
feed-forward's ReLU is fused into its first product).

Why: the pre-softmax projection is the largest product of a decoding step ((rows x d_model) times (d_model x
vocabulary), with a few dozen to a few hundred rows), where MKL's BLAS, behind ``F.linear``, is far from its peak.
On this project's 2-core AMD machines it reached 72 GFLOP/s on the (128 x 256) x (256 x 8,000) output product and 36
at 32 rows, oneDNN with the packed weight 117 and 120 (two threads, an AVX2 machine).

The other layers' products are smaller, and there the choice depends on the CPU. oneDNN's fixed cost per call is
about 10-30 us; on a CPU with AVX-512, oneDNN's kernels use the 512-bit vectors and MKL's (on AMD) do not, so
oneDNN runs twice as fast once a product is large enough to pay for its fixed cost. Measured with
``benchmarks/linear_backends.py`` on one thread:

- AVX2 (an earlier AMD EPYC): oneDNN was 0.26-0.85x the speed of ``F.linear`` for the `tiny` model's shapes at
  4-128 rows, 0.92x on a whole beam search;
- AVX-512 (an AMD EPYC with AVX512-BF16): 1.65-2.04x at 128 rows (about 100 against 200 GFLOP/s), 1.0-1.5x at
  32, 0.5-0.8x at 4-8 rows, break-even near 400,000 multiply-adds a call; 1.2x on a Multi30k beam search.

So ``onednn_layers`` is on where PyTorch finds AVX-512 on an AMD CPU (on Intel, MKL's kernels use AVX-512 as well
and oneDNN for every layer gave no steady gain: it stays off), and even then a product of fewer than
``onednn_min_macs`` multiply-adds (rows x inputs x outputs) stays with ``F.linear``.

On Intel with AVX-512 the faster way is MKL's product in its plain form, ``x @ Wt`` with ``Wt`` a contiguous
(inputs x outputs) copy of the weight (:func:`transposed_weight`), rather than ``F.linear``'s ``x @ W^T`` on the
transposed view: 1.0-1.9x per product on an Intel Xeon with AMX, and a `tiny` beam search 1.10-1.13x faster, also
than with oneDNN's packed output layer (1.06-1.11x; docs/benchmarks.md). With
``fastpaths.settings.transposed_weights`` (on there; then ``onednn`` is off by default) :func:`project` and the
decoding step use the copy for every product that oneDNN does not take.

A packed or transposed copy costs one more weight matrix of memory while it is in use. It is rebuilt when the
weight's version counter moves, which every in-place PyTorch operation does, but not fused optimizers
(``torch.optim.Adam(fused=True)`` writes the weights in a kernel that leaves the counter alone). So copies are made
only in eval mode, :class:`~transduce.model.Transformer` drops its own whenever it switches between training and
evaluation mode, and the trainer bumps the counters after each update. Code that changes weights in eval mode
without moving their counters must call :func:`forget_packed`; so must code that changes weights made in inference
mode (``torch.inference_mode``), which have no version counter.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from transduce import fastpaths
from transduce.model import bf16, quantize

# id(weight) -> (weak reference to the weight, (data pointer, version), a copy of it): built on first use, rebuilt when
# the weight changes (training updates it in place, which bumps its version), dropped with the weight. _PACKED holds
# oneDNN's blocked layout, _TRANSPOSED the weight transposed into a contiguous (inputs, outputs) matrix.
_PACKED: dict[int, tuple] = {}
_TRANSPOSED: dict[int, tuple] = {}

FUSED = {"relu": F.relu}  # activations that oneDNN applies inside the product (its "post-op"), by oneDNN's name


def _copy(store: dict[int, tuple], weight: Tensor, make: Callable[[Tensor], Tensor]) -> Tensor:
    # (a weight made in inference mode has no version counter: only forget_packed tells its changes)
    wid, key = id(weight), (weight.data_ptr(), -1 if weight.is_inference() else weight._version)
    entry = store.get(wid)
    if entry is None or entry[0]() is not weight or entry[1] != key:
        ref = weakref.ref(weight, lambda _, wid=wid: store.pop(wid, None))
        entry = store[wid] = (ref, key, make(weight.detach()))
    return entry[2]


def _packed_weight(weight: Tensor) -> Tensor:
    return _copy(_PACKED, weight, torch.ops.mkldnn._reorder_linear_weight)


def transposed_weight(weight: Tensor) -> Tensor:
    """``weight`` (N, K) as a contiguous (K, N) matrix, made once and kept while the weight is unchanged: ``x @
    transposed_weight(W)`` is MKL's plain product, which on an Intel CPU with AVX-512 runs faster than the
    transposed one behind ``F.linear`` on decoding's shapes (``fastpaths.settings.transposed_weights``; measured
    per product in docs/benchmarks.md)."""
    return _copy(_TRANSPOSED, weight, lambda w: w.t().contiguous())


def forget_packed(module: nn.Module) -> None:
    """Drop the packed and transposed copies of ``module``'s weights (of all its submodules), if any: the next
    :func:`project` makes them anew."""
    for p in module.parameters():
        _PACKED.pop(id(p), None)
        _TRANSPOSED.pop(id(p), None)


def onednn_size(x: Tensor, outputs: int) -> bool:
    """Whether ``x @ W^T`` for a weight of ``outputs`` rows is large enough for oneDNN
    (``fastpaths.settings.onednn_min_macs``)."""
    return x.numel() * outputs >= fastpaths.settings.onednn_min_macs


def project(linear: nn.Module, x: Tensor, activation: str | None = None, *, output: bool = False) -> Tensor:
    """``linear(x)``, followed by ``activation`` (a name in :data:`FUSED`) when one is given. For float32 inference
    on a CPU with an ``nn.Linear`` (not a quantised one) in eval mode, outside autograd: through oneDNN with the
    packed weight when ``fastpaths.settings.onednn`` is set and, unless ``output`` (the pre-softmax projection),
    ``onednn_layers`` too and the product has at least ``onednn_min_macs`` multiply-adds; else, with
    ``transposed_weights`` set, as MKL's plain product with :func:`transposed_weight`."""
    if type(linear) is DynamicLinear:  # a quantised layer: transduce's int8 kernel where it applies
        if activation not in (None, "relu"):
            raise KeyError(f"project: no fused activation {activation!r} for a quantised layer (only 'relu')")
        return quantize.int8_project(linear, x, relu=activation == "relu")
    if type(linear) is bf16.BF16Linear:  # bf16 weights (model/bf16.py): oneDNN's bf16 product where it applies
        return bf16.project(linear, x, activation)
    paths = fastpaths.settings
    # (outside autograd only: the oneDNN op has no backward, and the copies would not pass a gradient on)
    inference = (
        type(linear) is nn.Linear and not linear.training and x.device.type == "cpu" and x.dtype == torch.float32
        and not (torch.is_grad_enabled() and (linear.weight.requires_grad or x.requires_grad))
    )  # fmt: skip
    bias = linear.bias
    if inference and bias is not None and torch.is_grad_enabled():
        bias = bias.detach()  # (in inference mode or under no_grad nothing records it: no need for the extra op)
    if inference and paths.onednn and (output or (paths.onednn_layers and onednn_size(x, linear.out_features))):
        attr = "none" if activation is None else activation
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), _packed_weight(linear.weight), bias, attr, [], "")
    if inference and paths.transposed_weights:
        x2 = x.reshape(-1, x.shape[-1])
        w = transposed_weight(linear.weight)
        y = torch.mm(x2, w) if bias is None else torch.addmm(bias, x2, w)
        y = y.view(*x.shape[:-1], linear.out_features)
        return y if activation is None else FUSED[activation](y)
    y = linear(x)
    return y if activation is None else FUSED[activation](y)
