"""transduce's own CPU kernels, built from ``csrc/decoding.cpp``, ``csrc/training.cpp`` and ``csrc/int8.cpp`` on
first use.

For decoding steps:

- ``attend``: a decoding step attends with one new query per hypothesis (a few per sentence in cross-attention)
  over a short cache: per (row, head) a few dozen multiply-adds. ``torch.nn.functional.scaled_dot_product_attention``
  spends most of its time on that shape in per-call and per-(row, head) set-up; the kernel does the arithmetic
  directly and made a beam search on the Multi30k model 1.21x faster (docs/benchmarks.md).
- ``logsumexp`` and ``row_topk``: beam search's next-token candidates from the logits in two passes (the
  normaliser of each row, then its largest logits), instead of a log-softmax written out, a sum and a top-k;
  ``row_candidates``: both a row at a time (the logits read from memory once), for the steps where the search
  masks the same tokens in every row.
- ``layer_norm``: the step's layer norms (float32 rows), where ATen's call costs about 9 us on (128, 128), most of
  it fixed cost (the kernel: about 5 us).

For int8 inference (``csrc/int8.cpp``, built only for CPUs with AVX512-VNNI):

- ``int8_linear``: a dynamically quantised linear layer, each input row quantised with its own scale, the products
  summed by VPDPBUSD (:func:`transduce.model.quantize.int8_function`).

For training steps (float32 and bfloat16):

- ``dropout_apply``: dropout in one pass with a mask hashed from a seed and the element index
  (:func:`transduce.model.layers.dropout`); the backward pass reapplies the seed, so no mask is stored.
- ``smoothed_nll_forward`` / ``smoothed_nll_backward``: the label-smoothed loss of :mod:`transduce.loss` in one
  pass over each row of logits forward and one backward, in the logits' own dtype.
- ``add_layer_norm_forward`` / ``add_layer_norm_backward``: a post-norm residual ``LayerNorm(x + dropout(y))``
  (:class:`transduce.model.layers._AddLayerNorm`) in one pass over the rows each way.

:func:`compiled` compiles the C++ files with ``torch.utils.cpp_extension`` the first time a process needs it
(about 30-40 seconds with two cores; it needs a C++ compiler, ninja and Python's headers) and keeps the result in
PyTorch's extension cache (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), so later processes
load it at once. Where it cannot be built, transduce warns once and uses PyTorch's operations: the same results
(dropout: the same masks), only slower. ``TRANSDUCE_KERNELS=0`` in the environment (or
``transduce.fastpaths.settings.kernels = False``) turns the kernels off.

The compiled code is specific to the CPU features it was built for (AVX2 and FMA when the CPU has them, as PyTorch
reports; with AVX-512, AVX512-BF16's float-to-bf16 conversion and AVX512-VNNI's int8 products where present), and
the extension's name says which, so machines of different kinds can share one cache directory.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from transduce import fastpaths

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = (CSRC / "decoding.cpp", CSRC / "training.cpp", CSRC / "int8.cpp")
HEADERS = (CSRC / "vecmath.h",)  # PyTorch rebuilds when a source changes; a header's hash goes into the flags

_lock = threading.Lock()
_state: dict[str, ModuleType | Exception | None] = {"module": None, "error": None}


def _arch_flags() -> tuple[str, list[str]]:
    """(name suffix, compiler flags) for this CPU: AVX2 with FMA where PyTorch found them; where it found AVX-512,
    also AVX512-BF16's conversion instructions and AVX512-VNNI's int8 products (``int8.cpp``) where the CPU has them
    (256-bit vectors still for the compiler's own loops); else the compiler's default target."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        vnni = getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
        if bf16 or vnni:
            flags = ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mprefer-vector-width=256"]
            flags += ["-mavx512bf16"] if bf16 else []
            flags += ["-mavx512vnni"] if vnni else []
            return "avx512" + ("bf16" if bf16 else "") + ("_vnni" if vnni else ""), flags
    if capability in ("AVX2", "AVX512"):
        return "avx2", ["-mavx2", "-mfma"]
    return "generic", []


def build() -> ModuleType:
    """Compile (or load from PyTorch's extension cache) the kernel module; raises what the build raises."""
    from torch.utils import cpp_extension

    suffix, arch = _arch_flags()
    headers = hashlib.sha256(b"".join(h.read_bytes() for h in HEADERS)).hexdigest()[:16]
    log.info("loading transduce's CPU kernels (compiled on first use, about 30-40 s; then cached)")
    return cpp_extension.load(
        name=f"transduce_kernels_{suffix}",
        sources=[str(s) for s in SOURCES],
        extra_cflags=["-O3", "-fopenmp", *arch, f"-DTRANSDUCE_HEADERS={headers}"],
        extra_ldflags=["-fopenmp"],  # libgomp.so.1: the process already has PyTorch's, and uses it
        verbose=False,
    )


def compiled() -> ModuleType | None:
    """The compiled module (``attend``, ``logsumexp``, ``row_topk``), built on first call; None when
    ``fastpaths.settings.kernels`` is off or the build failed (a warning says why, once per process)."""
    if not fastpaths.settings.kernels:
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
                    f"transduce: could not build the CPU kernels ({type(err).__name__}: {err}); decoding and "
                    "training use PyTorch's operations (same results, slower). Set TRANSDUCE_KERNELS=0 to skip "
                    "the attempt.",
                    RuntimeWarning,
                    stacklevel=2,
                )
    return _state["module"]  # type: ignore[return-value]


def applies(x: Tensor) -> bool:
    """Whether the kernels take tensors like ``x``: float32 on the CPU, and the kernels available."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and compiled() is not None


def trains(x: Tensor) -> bool:
    """Whether the training kernels take tensors like ``x``: float32 or bfloat16 on the CPU, and the kernels
    available."""
    return x.dtype in (torch.float32, torch.bfloat16) and x.device.type == "cpu" and compiled() is not None


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Softmax attention of ``q`` (N, H, G, D) over ``k``, ``v`` (N, H, T, D), with ``mask`` (N, T) bool (True:
    attend) or None; ``scale`` defaults to 1/sqrt(D). Returns (N, G, H, D): ``scaled_dot_product_attention(q, k, v,
    mask[:, None, None])`` with heads and queries swapped. Float32 CPU tensors whose last dimension is dense (any
    other strides); :func:`applies` says whether the kernels are there."""
    return _required().attend(q, k, v, mask, q.shape[-1] ** -0.5 if scale is None else scale)


def logsumexp(x: Tensor) -> Tensor:
    """``torch.logsumexp(x, dim=1)`` of a (R, V) float32 CPU tensor with dense rows."""
    return _required().logsumexp(x)


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=1)`` of a (R, V) float32 CPU tensor with dense rows (1 <= k <= V): values largest first,
    among equal values the smaller index first."""
    values, indices = _required().row_topk(x, k)
    return values, indices


def row_candidates(x: Tensor, k: int, excluded: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``logsumexp(x)``, then ``x[:, excluded] = -inf`` (in place), then ``row_topk(x, k)``, a row at a time (each
    row read from memory once): ``(normalisers (R,), values (R, k), indices (R, k))``. ``excluded``: 1-D int64 ids."""
    normalisers, values, indices = _required().row_candidates(x, k, excluded)
    return normalisers, values, indices


def _required() -> ModuleType:
    module = compiled()
    if module is None:
        raise RuntimeError("transduce's CPU kernels are not available (see the warning given when they failed)")
    return module
