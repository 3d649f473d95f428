"""transduce's own CPU kernel for the attention of a decoding step, built from ``csrc/attention.cpp`` on first use.

A decoding step attends with one new query per hypothesis (a few per sentence in cross-attention) over a short
cache: per (row, head) a few dozen multiply-adds. ``torch.nn.functional.scaled_dot_product_attention`` spends most
of its time on that shape in per-call and per-(row, head) set-up; the kernel here does the arithmetic directly and
made a beam search on the Multi30k model 1.10x faster (RESULTS_speed.md).

:func:`attention_kernel` compiles the C++ file with ``torch.utils.cpp_extension`` the first time a process needs it
(about 30-40 seconds with two cores; it needs a C++ compiler, ninja and Python's headers) and keeps the result in
PyTorch's extension cache (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), so later processes
load it at once. Where it cannot be built, decoding warns once and uses PyTorch's attention: the same results, only
slower. ``TRANSDUCE_KERNELS=0`` in the environment (or :data:`KERNELS` = False) turns the kernel off.

The compiled code is specific to the CPU features it was built for (AVX2 and FMA when the CPU has them, as PyTorch
reports), and the extension's name says which, so machines of different kinds can share one cache directory.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

log = logging.getLogger(__name__)

KERNELS = os.environ.get("TRANSDUCE_KERNELS", "1") != "0"  # False: decode with PyTorch's attention only
SOURCE = Path(__file__).with_name("csrc") / "attention.cpp"

_lock = threading.Lock()
_state: dict[str, ModuleType | Exception | None] = {"module": None, "error": None}


def _arch_flags() -> tuple[str, list[str]]:
    """(name suffix, compiler flags) for this CPU: AVX2 with FMA where PyTorch found them, else the compiler's
    default target."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "AVX512"):
        return "avx2", ["-mavx2", "-mfma"]
    return "generic", []


def build() -> ModuleType:
    """Compile (or load from PyTorch's extension cache) the kernel module; raises what the build raises."""
    from torch.utils import cpp_extension

    suffix, arch = _arch_flags()
    log.info("loading transduce's attention kernel (compiled on first use, about 30-40 s; then cached)")
    return cpp_extension.load(
        name=f"transduce_attention_{suffix}",
        sources=[str(SOURCE)],
        extra_cflags=["-O3", "-fopenmp-simd", *arch],
        verbose=False,
    )


def attention_kernel() -> ModuleType | None:
    """The compiled kernel module, built on first call; None when :data:`KERNELS` is off or the build failed
    (a warning says why, once per process)."""
    if not KERNELS:
        return None
    module = _state["module"]
    if module is not None or _state["error"] is not None:
        return module  # type: ignore[return-value]
    with _lock:
        if _state["module"] is None and _state["error"] is None:
            try:
                _state["module"] = build()
            except Exception as err:  # a missing compiler, ninja or header: decode without the kernel
                _state["error"] = err
                warnings.warn(
                    f"transduce: could not build the CPU attention kernel ({type(err).__name__}: {err}); decoding "
                    "uses PyTorch's attention (same results, slower). Set TRANSDUCE_KERNELS=0 to skip the attempt.",
                    RuntimeWarning,
                    stacklevel=2,
                )
    return _state["module"]  # type: ignore[return-value]


def applies(x: Tensor) -> bool:
    """Whether the kernel can attend over tensors like ``x``: float32 on the CPU, and the kernel available."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and attention_kernel() is not None


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Softmax attention of ``q`` (N, H, G, D) over ``k``, ``v`` (N, H, T, D), with ``mask`` (N, T) bool (True:
    attend) or None; ``scale`` defaults to 1/sqrt(D). Returns (N, G, H, D): ``scaled_dot_product_attention(q, k, v,
    mask[:, None, None])`` with heads and queries swapped. Float32 CPU tensors whose last dimension is dense (any
    other strides); :func:`applies` says whether the kernel is there."""
    module = attention_kernel()
    if module is None:
        raise RuntimeError("transduce's attention kernel is not available (see the warning given when it failed)")
    return module.attend(q, k, v, mask, q.shape[-1] ** -0.5 if scale is None else scale)
