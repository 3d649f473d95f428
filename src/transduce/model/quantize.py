"""Dynamic int8 quantisation for CPU inference.

``nn.Linear`` layers (attention and feed-forward projections, and the output projection) get int8 weights,
quantised once per output channel, and int8 activations quantised per batch at run time (PyTorch's dynamic
quantisation, fbgemm/x86 kernels); embeddings, LayerNorm and attention itself stay float32. The quantised model
is for inference only: a copy, the float model is left as it is.

Which layers: on a CPU with AVX512-VNNI (the int8 dot-product instructions, which PyTorch's int8 kernels use), every
linear layer; elsewhere, layers with fewer than ``min_weights`` weights (65,536 by default) stay float32, since
for them int8 is no faster, only less exact. Measured on one thread with ``benchmarks/linear_backends.py``
(docs/benchmarks.md):

- AVX2, no VNNI (an earlier AMD EPYC): dynamic int8 ran the `tiny` model's 128-wide projections (128 x 128 to
  128 x 384 weights) at 0.31-1.04x the speed of float32 at 4-128 rows, the `base` model's 512-wide ones at
  1.49-4.27x, and a 128 x 8,000 output projection at 1.3-2.1x the float32 oneDNN path that decoding uses for it;
- AVX-512 with VNNI (an AMD EPYC with AVX512-BF16): the `tiny` model's projections at 1.3-3.0x ``F.linear`` at
  32-128 rows (0.4-0.9x at 4-8 rows, where a beam search of a batch rarely is), the `base` model's at 2.6-7.6x,
  the output projection at 1.9x the oneDNN path.

    from transduce.model.quantize import quantize_int8
    fast = quantize_int8(model)        # or Translator.load(path, quantize="int8"), transduce translate --int8

How the quantised layers run: on a CPU with AVX512-VNNI (where transduce's kernels are built with it),
:func:`int8_project` runs each layer through transduce's own product (``csrc/int8.cpp``) on the same int8 weights, with
each row of the input quantised with its own scale and zero point; elsewhere (and with
``transduce.fastpaths.settings.int8_kernel`` False) through PyTorch's operation (fbgemm), which quantises the whole
input with one scale. On the `tiny` model's products (the Multi30k model's) the kernel took 1.9-19 us a call where
fbgemm took 13-42 us (2.1-7.2x), and 344 against 602 us on the (128 x 128) x (128 x 8,000) output projection (1.75x):
fbgemm costs 10-15 us a call whatever its size (``benchmarks/linear_backends.py --preset tiny --rows 4,32,128 --threads
1``). Per-row scales are also more exact than one scale per call, and a row's output does not depend on the other rows
of its batch: the first 64 Multi30k test sentences all translated the same alone as in one batch (with fbgemm's one
scale per call, 53 of them).

On a CPU with AMX-INT8 the products go through the AMX tiles (``fastpaths.settings.int8_amx``): transduce's
``int8_amx_linear`` quantises the rows as above and sums the same uint8 x int8 products exactly in int32 with TDPBUSD,
then applies the same formula, so its outputs are the VNNI kernel's, bit for bit; the weight's layout is the VNNI
kernel's (16 groups of 4 inputs for 16 outputs are one tile), for layers whose inputs are a multiple of 64 (every
preset's). A call costs a few microseconds beyond its arithmetic: on one thread of an Intel Xeon with AMX it ran the
presets' decoding products at 1.0-3.4x the VNNI kernel's speed and 1.1-20x oneDNN's int8 matrix multiplication's,
which an earlier route used for the largest layers only (docs/benchmarks.md).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from transduce import fastpaths
from transduce.model import kernels

QUANTIZATIONS = ("int8",)
LANES = 16  # output channels per block of the kernel's weight layout (one 512-bit vector of int32)
MAX_INPUTS = 65792  # the kernel's int32 sums hold 255 * 128 * inputs: wider layers go through PyTorch's operation


def quantize_int8(model: nn.Module, min_weights: int | None = None) -> nn.Module:
    """A copy of ``model`` (in eval mode) whose ``nn.Linear`` layers of at least ``min_weights`` weights (None:
    ``fastpaths.settings.int8_min_weights``, which depends on the CPU; 0: every linear layer) are dynamically
    quantised to int8."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    min_weights = fastpaths.settings.int8_min_weights if min_weights is None else min_weights
    q = copy.deepcopy(model).eval()
    names = {
        name for name, m in q.named_modules() if type(m) is nn.Linear and m.weight.numel() >= min_weights
    }  # fmt: skip
    if not names:
        return q
    with warnings.catch_warnings():  # torch marks its quantised tensor types as deprecated in favour of torchao
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return quantize_dynamic(q, dict.fromkeys(names, per_channel_dynamic_qconfig), dtype=torch.qint8, inplace=True)


@dataclass(frozen=True)
class PackedInt8:
    """A quantised layer's weight in the order of ``csrc/int8.cpp``'s product (:func:`pack_weight`)."""

    weight: Tensor  # (ceil(N / 16), ceil(K / 4), 64) int8
    scales: Tensor  # (16 ceil(N / 16),) float32: each output channel's scale, 0 in the padding
    sums: Tensor  # (16 ceil(N / 16),) int32: sum over k of the int8 weights of each output channel
    bias: Tensor | None  # (N,) float32
    outputs: int  # N
    source: object  # the layer's packed parameters this was made from (rebuilt when the layer gets new ones)


def pack_weight(weight: Tensor, scales: Tensor, bias: Tensor | None = None, source: object = None) -> PackedInt8:
    """An int8 weight (N, K) with one scale per output channel (N,) in the kernel's layout: for each block of 16
    output channels, for each group of 4 inputs, the 16 x 4 bytes that one VPDPBUSD instruction multiplies (zero
    padded to whole blocks and groups)."""
    n, k = weight.shape
    blocks, groups = -(-n // LANES), -(-k // 4)
    padded = weight.new_zeros(blocks * LANES, groups * 4)
    padded[:n, :k] = weight
    packed = padded.view(blocks, LANES, groups, 4).permute(0, 2, 1, 3).reshape(blocks, groups, 4 * LANES)
    channel_scales = torch.zeros(blocks * LANES)
    channel_scales[:n] = scales.float()
    sums = torch.zeros(blocks * LANES, dtype=torch.int32)
    sums[:n] = weight.sum(1, dtype=torch.int32)
    bias = None if bias is None else bias.detach().float().contiguous()
    return PackedInt8(packed.contiguous(), channel_scales, sums, bias, n, source)


def _int8_weight(linear: nn.Module) -> tuple[Tensor, Tensor] | None:
    """A dynamically quantised layer's int8 weight (N, K) and its output channels' scales (N,), where the weight is
    symmetric int8 (per channel or per tensor) with at most :data:`MAX_INPUTS` inputs; else None."""
    if linear._packed_params.dtype != torch.qint8 or linear.in_features > MAX_INPUTS:
        return None
    weight = linear.weight()
    if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        scales, zeros = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
    elif weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        scales = torch.full((weight.shape[0],), weight.q_scale(), dtype=torch.float64)
        zeros = torch.tensor([weight.q_zero_point()])
    else:
        return None
    if bool(zeros.ne(0).any()):
        return None
    return weight.int_repr(), scales


def _layer_copy(linear: nn.Module, attr: str, make: Callable[..., Any]) -> Any:
    """A copy of a dynamically quantised int8 layer's weight for one of the products, ``make(weight, scales, bias,
    source)``, made on first use and kept on the layer as ``attr`` (made again when the layer gets new packed
    parameters); None where the products do not take the layer (:func:`_int8_weight`)."""
    params = linear._packed_params._packed_params
    cached = getattr(linear, attr, None)
    if cached is not None and cached.source is params:
        return cached
    found = _int8_weight(linear)
    if found is None:
        return None
    made = make(*found, linear.bias(), params)
    setattr(linear, attr, made)
    return made


def _packed_int8(linear: nn.Module) -> PackedInt8 | None:
    """The VNNI kernel's copy of a quantised layer's weight (:func:`pack_weight`), or None."""
    return _layer_copy(linear, "_transduce_int8", pack_weight)


def amx_applies(module: Any, packed: PackedInt8) -> bool:
    """Whether a layer's products go through ``int8_amx_linear``: ``fastpaths.settings.int8_amx``, the kernels built
    with AMX-INT8, the tiles granted by the operating system, and the layer's inputs a multiple of 64."""
    return (
        fastpaths.settings.int8_amx and hasattr(module, "int8_amx_linear") and packed.weight.shape[1] % 16 == 0
        and module.amx_available()  # (amx.cpp's: built with the AMX-INT8 product, asks for the tiles' state)
    )  # fmt: skip


def int8_function(linear: nn.Module, relu: bool = False) -> Callable[..., Tensor]:
    """A dynamically quantised int8 layer (``torch.ao.nn.quantized.dynamic.Linear``) as a function of ``(x,
    residual=None)``: ``linear(x)``, then a ReLU when ``relu``, then plus ``residual`` when one is given. Through
    transduce's VNNI kernel where it applies (``fastpaths.settings.int8_kernel`` set, the kernels built with VNNI,
    symmetric int8 weights, and at each call a float32 CPU input), else through PyTorch's int8 operation as the
    layer's ``forward`` calls it. With ``fastpaths.settings.int8_amx`` (on where the CPU has AMX-INT8, the kernels
    built for it), a layer whose inputs are a multiple of 64 goes through ``int8_amx_linear``, the same product in
    the AMX tiles (the same outputs, bit for bit). The decoding step makes these once per search (the checks are done
    here, not per call)."""
    params = linear._packed_params._packed_params
    quantised = linear._packed_params.dtype == torch.qint8
    reduce_range = not (linear.version is None or linear.version < 4)  # as DynamicLinear.forward
    op = torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic

    def torch_op(x: Tensor, residual: Tensor | None = None) -> Tensor:
        if quantised:
            y = op(x, params, reduce_range=reduce_range)
        else:  # float16 weights
            y = linear(x)
            y = y.relu_() if relu else y
        return y if residual is None else y.add_(residual)

    module = kernels.compiled() if fastpaths.settings.int8_kernel and quantised else None
    packed = _packed_int8(linear) if hasattr(module, "int8_linear") else None  # (built only with VNNI)
    if packed is None:
        return torch_op
    product = module.int8_amx_linear if amx_applies(module, packed) else module.int8_linear
    weight, scales, sums, bias, outputs = packed.weight, packed.scales, packed.sums, packed.bias, packed.outputs

    def rows_product(x: Tensor, residual: Tensor | None) -> Tensor:
        return product(x, weight, scales, sums, bias, residual, relu, outputs)

    def kernel(x: Tensor, residual: Tensor | None = None) -> Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return torch_op(x, residual)
        fused = residual is None or (residual.dtype == torch.float32 and residual.shape == (*x.shape[:-1], outputs))
        if x.dim() == 2 and x.stride(1) == 1 and fused and (residual is None or residual.stride(1) == 1):
            return rows_product(x, residual)
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).contiguous()
        res = residual.reshape(-1, outputs).contiguous() if residual is not None and fused else None
        y = rows_product(rows, res).view(*shape[:-1], outputs)
        return y if fused else y.add_(residual)  # (a residual that broadcasts, or of another dtype: as torch_op)

    return kernel


def candidates_function(linear: nn.Module) -> Callable[[Tensor, int, Tensor], tuple[Tensor, Tensor, Tensor]] | None:
    """A quantised pre-softmax projection ``linear`` and a beam step's reduction of its logits in one pass through
    the AMX tiles (``int8_amx_candidates`` in ``model/csrc/int8.cpp``), as
    :func:`transduce.model.bf16.candidates_function` for bf16: a function of ``(x, k, excluded)``, float32 CPU rows
    ``x`` (R, K), returning what :func:`transduce.model.kernels.row_candidates` returns for the layer's int8 logits
    (``int8_amx_linear``'s), without writing them. None where that product does not apply (:func:`amx_applies`)."""
    module = kernels.compiled() if fastpaths.settings.int8_kernel else None
    if not hasattr(module, "int8_amx_candidates") or type(linear) is not DynamicLinear:
        return None
    packed = _packed_int8(linear) if linear._packed_params.dtype == torch.qint8 else None
    if packed is None or not amx_applies(module, packed):
        return None
    weight, scales, sums, bias, outputs = packed.weight, packed.scales, packed.sums, packed.bias, packed.outputs

    def call(x: Tensor, k: int, excluded: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = x if x.stride(-1) == 1 else x.contiguous()
        normalisers, values, tokens = module.int8_amx_candidates(x, weight, scales, sums, bias, outputs, k, excluded)
        return normalisers, values, tokens

    return call


def int8_project(linear: nn.Module, x: Tensor, relu: bool = False, residual: Tensor | None = None) -> Tensor:
    """:func:`int8_function` of ``linear`` applied to ``x`` (and ``residual``)."""
    return int8_function(linear, relu)(x, residual)
