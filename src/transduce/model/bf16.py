"""bfloat16 matrix products for CPU inference: the linear layers' weights in bf16, everything else in float32.

:func:`bf16_products` returns a copy of a model whose ``nn.Linear`` layers (the attention and feed-forward
projections and the pre-softmax projection; with oneDNN's products only those of at least
``fastpaths.settings.bf16_min_weights`` weights) are :class:`BF16Linear` layers: bf16 weights, each product's input
rounded to bf16 and the sums accumulated in float32, handed on as float32. The rest of the model (embeddings, layer
norms, attention, the search's log-probabilities) stays float32, so transduce's float32 kernels (``model/kernels.py``)
keep running there. This is what ``precision="bf16"`` means for a :class:`~transduce.search.translator.Translator`
on the CPU, and what ``precision="auto"`` picks on a CPU with AMX (:func:`transduce.fastpaths.decode_precision`).

Why: on a CPU with AMX (Intel Xeon from Sapphire Rapids on) bf16 matrices are multiplied in the AMX tiles, many
times float32's rate. Without AMX (AVX512-BF16's vector instructions only) oneDNN's bf16 search ran at 0.71x
fp32's, so ``auto`` picks bf16 only with AMX (docs/benchmarks.md).

How the products run, the first that applies:

- ``fastpaths.settings.bf16_amx`` (where the kernels were built with AMX-BF16): transduce's AMX kernel
  (``model/csrc/amx.cpp``): the float32 rows rounded to bf16, multiplied in the tiles by the weight packed once
  into their layout, the float32 sums with the bias, the ReLU and the residual written in the same pass. A call
  costs a few microseconds beyond its arithmetic, so every layer gets bf16 products, however small.
- ``bf16_onednn`` (where PyTorch has oneDNN): oneDNN's linear with the weight packed once into its layout and the
  ReLU fused, the input and output converted by transduce's kernels (``to_bf16``, ``bf16_to_float32`` with the
  residual added in the same pass) where they apply; the output is rounded to bf16 on its way. oneDNN's call costs
  25-50 us whatever its size, so only layers of at least ``bf16_min_weights`` weights get bf16 products.
- else (the fallback) ``F.linear`` on bf16 tensors, the output rounded to bf16.

All round the same inputs at the same places; the results agree up to the order of summation and, where the
output is rounded to bf16, that rounding.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce import fastpaths
from transduce.model import kernels

__all__ = ["BF16Linear", "bf16_function", "bf16_products", "candidates_function", "project"]


class BF16Linear(nn.Module):
    """An inference-only linear layer with a bf16 weight (and bias): ``y = float(bf16(bf16(x) W^T + b))``.

    Made from an ``nn.Linear`` by :func:`bf16_products`; takes and returns float32 (or bf16) tensors of the
    layer's shape."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)  # (N, K)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.bfloat16), requires_grad=False)
        self._packed: tuple[int, Tensor] | None = None  # (weight's data pointer, oneDNN's copy), made on first use
        self._tiles: tuple[int, Tensor, Tensor | None] | None = None  # (pointer, the AMX layout, float32 bias)

    def packed_weight(self) -> Tensor:
        """The weight in oneDNN's blocked layout (packed on first use; again if the weight was replaced)."""
        ptr = self.weight.data_ptr()
        if self._packed is None or self._packed[0] != ptr:
            self._packed = (ptr, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach()))
        return self._packed[1]

    def tiled_weight(self, module) -> tuple[Tensor, Tensor | None]:
        """The weight in the AMX kernel's tile layout and the bias in float32 (made on first use; again if the
        weight was replaced)."""
        ptr = self.weight.data_ptr()
        if self._tiles is None or self._tiles[0] != ptr:
            bias = None if self.bias is None else self.bias.detach().float().contiguous()
            self._tiles = (ptr, module.amx_bf16_pack(self.weight.detach()), bias)
        return self._tiles[1], self._tiles[2]

    def forward(self, x: Tensor) -> Tensor:
        return project(self, x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def __deepcopy__(self, memo: dict) -> BF16Linear:
        new = copy.copy(self)
        new.__dict__ = {k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k not in ("_packed", "_tiles")}
        new._packed = new._tiles = None  # (oneDNN's tensors do not copy; both are made again on first use)
        return new


def amx_kernel():
    """The kernel module when bf16 products go through transduce's AMX kernel (``fastpaths.settings.bf16_amx``, the
    kernels built with AMX-BF16, the tiles granted by the operating system), else None."""
    if not (fastpaths.settings.bf16_amx and fastpaths.settings.kernels):
        return None
    module = kernels.compiled()
    if module is None or not hasattr(module, "amx_bf16_linear") or not module.amx_available():
        return None
    return module


def bf16_products(model: nn.Module, min_weights: int | None = None) -> nn.Module:
    """A copy of ``model`` (in eval mode) whose ``nn.Linear`` layers of at least ``min_weights`` weights are
    :class:`BF16Linear` layers (inference only); smaller ones stay float32. The default: every layer where the
    products go through the AMX kernel (:func:`amx_kernel`), else ``fastpaths.settings.bf16_min_weights``. The
    original is left as it is. A weight shared with an embedding (the tied pre-softmax projection) stays float32 in
    the embedding and gets its own bf16 copy in the projection."""
    m = copy.deepcopy(model).eval()
    if min_weights is None:
        min_weights = 0 if amx_kernel() is not None else fastpaths.settings.bf16_min_weights
    for module in list(m.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear and child.weight.numel() >= min_weights:
                setattr(module, child_name, BF16Linear(child))
    return m


def _onednn_applies(x: Tensor) -> bool:
    return fastpaths.settings.bf16_onednn and x.device.type == "cpu" and fastpaths.onednn_available()


def project(linear: BF16Linear, x: Tensor, activation: str | None = None, residual: Tensor | None = None) -> Tensor:
    """``linear(x)``, then ``activation`` (None or ``"relu"``), then ``+ residual``; in ``x``'s dtype.

    Shape: ``x`` (..., K) -> (..., N)."""
    if activation not in (None, "relu"):
        raise KeyError(f"bf16 project: no fused activation {activation!r} (only 'relu')")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])  # (R, K)
    amx = amx_kernel() if x.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled() else None
    if amx is not None:  # transduce's AMX kernel: float32 in and out, the bias, ReLU and residual in one pass
        weight, bias = linear.tiled_weight(amx)
        r = None if residual is None else residual.reshape(-1, linear.out_features)
        r = r if r is None or r.stride(-1) == 1 else r.contiguous()
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        y = amx.amx_bf16_linear(x2, weight, bias, r, activation == "relu", linear.out_features)
        return y.view(*shape[:-1], linear.out_features)
    convert = kernels.compiled() if kernels.applies(x) else None  # transduce's conversions (float32 on the CPU)
    xb = convert.to_bf16(x2.contiguous()) if convert is not None else x2.to(torch.bfloat16).contiguous()
    if _onednn_applies(x) and not torch.is_grad_enabled():
        y = torch.ops.mkldnn._linear_pointwise(xb, linear.packed_weight(), linear.bias, activation or "none", [], "")
    else:  # the fallback: PyTorch's bf16 product
        y = F.linear(xb, linear.weight, linear.bias)
        y = y.relu_() if activation == "relu" else y
    if convert is not None:  # (R, N) float32, the residual added in the same pass
        r = None if residual is None else residual.reshape(-1, linear.out_features).contiguous()
        return convert.bf16_to_float32(y.contiguous(), r).view(*shape[:-1], linear.out_features)
    y = y.to(x.dtype).view(*shape[:-1], linear.out_features)
    return y if residual is None else y.add_(residual)


def bf16_function(linear: BF16Linear, relu: bool = False) -> Callable[..., Tensor]:
    """``linear`` as a function of ``(x, residual=None)`` for the decoding step (``model/step.py``)."""
    activation = "relu" if relu else None
    amx = amx_kernel()
    if amx is None:

        def call(x: Tensor, residual: Tensor | None = None) -> Tensor:
            return project(linear, x, activation, residual)

        return call
    # the AMX kernel, resolved once per search (a step makes dozens of these calls): float32 rows of the CPU, as
    # decoding's are; anything else (bf16 activations under autocast, gradients) through project()
    weight, bias, outputs = *linear.tiled_weight(amx), linear.out_features

    def call_amx(x: Tensor, residual: Tensor | None = None) -> Tensor:
        rows = x.dtype == torch.float32 and x.dim() == 2 and x.device.type == "cpu" and not torch.is_grad_enabled()
        if not rows or (residual is not None and residual.dim() != 2):
            return project(linear, x, activation, residual)
        x = x if x.stride(-1) == 1 else x.contiguous()
        residual = residual if residual is None or residual.stride(-1) == 1 else residual.contiguous()
        return amx.amx_bf16_linear(x, weight, bias, residual, relu, outputs)

    return call_amx


def candidates_function(linear: BF16Linear) -> Callable[[Tensor, int, Tensor], tuple[Tensor, Tensor, Tensor]] | None:
    """The pre-softmax projection ``linear`` and a beam step's reduction of its logits in one pass, through the AMX
    kernel (``amx_bf16_candidates`` in ``model/csrc/amx.cpp``): a function of ``(x, k, excluded)``, float32 rows
    ``x`` (R, d_model) with dense rows, that returns what :func:`transduce.model.kernels.row_candidates` returns
    for ``project(linear, x)`` (``(normalisers (R,), values (R, k), tokens (R, k))``: each row's logsumexp, then
    its ``k`` largest logits with the ids ``excluded`` left out) without writing the logits. None where the AMX
    kernel does not apply (:func:`amx_kernel`)."""
    amx = amx_kernel()
    if amx is None or not hasattr(amx, "amx_bf16_candidates"):
        return None
    weight, bias = linear.tiled_weight(amx)
    outputs = linear.out_features

    def call(x: Tensor, k: int, excluded: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = x if x.stride(-1) == 1 else x.contiguous()
        normalisers, values, tokens = amx.amx_bf16_candidates(x, weight, bias, outputs, k, excluded)
        return normalisers, values, tokens

    return call
