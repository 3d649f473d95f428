"""Dynamic int8 quantisation for CPU inference.

Every ``nn.Linear`` (attention and feed-forward projections, and the output projection) gets int8 weights,
quantised once per output channel, and int8 activations quantised per batch at run time (PyTorch's dynamic
quantisation, fbgemm/x86 kernels); embeddings, LayerNorm and attention itself stay float32. The quantised model
is for inference only: a copy, the float model is left as it is.

    from transduce.model.quantize import quantize_int8
    fast = quantize_int8(model)        # or Translator.load(path, quantize="int8"), transduce translate --int8
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

QUANTIZATIONS = ("int8",)


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (in eval mode) whose ``nn.Linear`` layers are dynamically quantised to int8."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    q = copy.deepcopy(model).eval()
    with warnings.catch_warnings():  # torch marks its quantised tensor types as deprecated in favour of torchao
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return quantize_dynamic(q, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
