"""Dynamic int8 quantisation for CPU inference.

``nn.Linear`` layers (attention and feed-forward projections, and the output projection) get int8 weights,
quantised once per output channel, and int8 activations quantised per batch at run time (PyTorch's dynamic
quantisation, fbgemm/x86 kernels); embeddings, LayerNorm and attention itself stay float32. The quantised model
is for inference only: a copy, the float model is left as it is.

Which layers: on a CPU with AVX512-VNNI (the int8 dot-product instructions, which PyTorch's int8 kernels use), every
linear layer; elsewhere, layers with fewer than ``min_weights`` weights (65,536 by default) stay float32, since
for them int8 is no faster, only less exact. Measured on one thread with ``benchmarks/linear_backends.py``
(RESULTS_speed.md):

- AVX2, no VNNI (an earlier AMD EPYC): dynamic int8 ran the `tiny` model's 128-wide projections (128 x 128 to
  128 x 384 weights) at 0.31-1.04x the speed of float32 at 4-128 rows, the `base` model's 512-wide ones at
  1.49-4.27x, and a 128 x 8,000 output projection at 1.3-2.1x the float32 oneDNN path that decoding uses for it;
- AVX-512 with VNNI (an AMD EPYC with AVX512-BF16): the `tiny` model's projections at 1.3-3.0x ``F.linear`` at
  32-128 rows (0.4-0.9x at 4-8 rows, where a beam search of a batch rarely is), the `base` model's at 2.6-7.6x,
  the output projection at 1.9x the oneDNN path.

    from transduce.model.quantize import quantize_int8
    fast = quantize_int8(model)        # or Translator.load(path, quantize="int8"), transduce translate --int8
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

QUANTIZATIONS = ("int8",)


def default_min_weights() -> int:
    """The default of :data:`MIN_WEIGHTS` for this CPU: 0 (every layer) where PyTorch reports AVX512-VNNI, else
    2^16."""
    vnni = bool(getattr(torch.cpu, "_is_vnni_supported", lambda: False)())
    return 0 if vnni else 1 << 16


MIN_WEIGHTS = default_min_weights()  # linear layers with fewer weights stay float32 (see above)


def quantize_int8(model: nn.Module, min_weights: int | None = None) -> nn.Module:
    """A copy of ``model`` (in eval mode) whose ``nn.Linear`` layers of at least ``min_weights`` weights (None:
    :data:`MIN_WEIGHTS`, which depends on the CPU; 0: every linear layer) are dynamically quantised to int8."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    min_weights = MIN_WEIGHTS if min_weights is None else min_weights
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
