"""Every fast path of transduce in one place: what it does, what runs instead, and how to turn it off.

Each fast path gives the same results as its fallback (up to float rounding; ``tests/`` compares the two), only
faster, and each has a fallback on PyTorch's operations for where it cannot run (no C++ compiler, a CPU without
AVX-512, bfloat16 activations, a GPU). The defaults are chosen for the CPU at import time. Read them from
:data:`settings`; change them for a block of code with :func:`override` (tests switch several together), or for
the whole process with ``settings.<name> = value`` (checked: an unknown name or a value of the wrong type raises):

    from transduce import fastpaths
    with fastpaths.override(kernels=False, onednn_layers=False):
        translator.translate(lines)          # PyTorch's operations and MKL's products only

- ``kernels`` (``TRANSDUCE_KERNELS=0`` in the environment turns it off): transduce's C++ kernels
  (``model/csrc``, built on first use by ``model/kernels.py``): decoding attention and the step's layer norm
  (``model/step.py``), inference attention in the layers, dropout and the post-norm residual in training
  (``model/fused.py``: ``attend``, ``dropout``, ``add_norm``), the beam and greedy candidates from the logits
  (``search/candidates.py``: ``beam_row_tops``, ``RowCandidates``; ``search/beam.py``: ``advance``), the fused loss
  (``loss.py``) and the int8 product (``model/quantize.py``).
  Fallback: PyTorch's operations (the same results; dropout the same masks), also wherever the build fails (a
  warning says why) and for tensors the kernels do not take (not float32, or not on the CPU).
- ``step_function``: a decoding step as one function over the weights (``model/step.py``). Fallback: the
  decoder's modules (set it off for forward hooks on them to run).
- ``step_kernel``: that function's float32 decoder layers in one call of a kernel (``decoder_step`` in
  ``model/csrc/decoding.cpp``: the same ATen products, layer norms and attention kernels in the same order, so the
  same numbers), where the layers are plain linear layers with MKL's products, the activation is ReLU and the
  step's self-attention cache is copied into row order. Fallback: the step function's loop over the layers in
  Python.
- ``attention_kernel_max_keys``: inference attention (the encoder's, and cross-attention outside the step function)
  through the kernel up to this many keys (``model/fused.py: attend``); 0: never. Fallback:
  ``scaled_dot_product_attention``.
- ``by_position_min_source``: the step's self-attention cache stored by position (written once, read through a
  row table; ``model/step.py``, ``model/cache.py``) for padded sources at least this long. Fallback: the cache
  copied into row order inside the attention kernel at every step (``torch.index_select`` without the kernels).
- ``explicit_attention_max_keys``: attention that autograd differentiates on the CPU as explicit products for up
  to this many keys (``model/layers.py: explicit_attention``); 0: never. Fallback: SDPA's flash kernel (slower
  backward at translation lengths, memory linear in length).
- ``onednn``: the pre-softmax projection through oneDNN with a packed weight (``model/packed.py``), where PyTorch
  has oneDNN and ``transposed_weights`` is not measured faster. Fallback: ``F.linear`` (MKL).
- ``transposed_weights``: float32 inference products that oneDNN does not take (the decoding step's layers, the
  pre-softmax projection, the encoder's layers in eval mode) as MKL's plain product with a contiguous transposed
  copy of the weight, kept while the weight is unchanged (``model/packed.py``, ``model/step.py``); on where PyTorch
  uses AVX-512 on an Intel CPU. Costs a second copy of those weights while they are in use. Fallback:
  ``F.linear``, MKL's product with the transposed view.
- ``onednn_layers``, ``onednn_min_macs``: the other linear layers through oneDNN too (``model/packed.py``,
  ``model/step.py``), for products of at least ``onednn_min_macs`` multiply-adds; on where oneDNN's vectors are
  wider than MKL's (AVX-512 on an AMD CPU). Fallback: ``F.linear``.
- ``int8_kernel``: quantised layers through transduce's VNNI product (per-row scales; ``model/quantize.py``), where
  the kernels were built with AVX512-VNNI. Fallback: PyTorch's int8 operation (fbgemm).
- ``int8_min_weights``: :func:`~transduce.model.quantize.quantize_int8` quantises the linear layers of at least
  this many weights (0 where the CPU has VNNI, else 2^16); smaller ones stay float32.
- ``int8_amx``: the int8 kernel's products in the AMX tiles (``int8_amx_linear`` in ``model/csrc/int8.cpp``: the
  same quantised rows, the same exact int32 sums and formula, so the same outputs; ``model/quantize.py``) for
  layers whose inputs are a multiple of 64; on where the CPU has AMX-INT8. Fallback: the VNNI kernel.
- ``bf16_amx``: the linear layers of a model with bf16 products (:mod:`transduce.model.bf16`) through transduce's
  AMX kernel (``model/csrc/amx.cpp``: rows rounded to bf16, the weight packed once into the tiles' layout, bias, ReLU
  and residual in the same pass), every layer whatever its size; on where the CPU has AMX-BF16 (and the kernels
  were built for it). Fallback: ``bf16_onednn``, else ``F.linear`` on bf16 tensors.
- ``fused_candidates``: with ``bf16_amx`` or ``int8_amx``, a beam search's bf16 or int8 pre-softmax projection
  and the step's candidates (each row's logsumexp and best logits) in one pass (``amx_bf16_candidates`` in
  ``model/csrc/amx.cpp``, ``int8_amx_candidates`` in ``model/csrc/int8.cpp``; ``search/candidates.py``:
  ``RowCandidates.step``), the logits never written, where the rows are masked alike and there is no constraint.
  Fallback: the logits written by the AMX kernel, then ``row_candidates``.
- ``bf16_onednn``: the linear layers of a model with bf16 products (:mod:`transduce.model.bf16`, what
  ``precision="bf16"`` decodes with on the CPU; :func:`decode_precision` says when ``auto`` picks it) through
  oneDNN with the weight packed once, the ReLU fused. Fallback: ``F.linear`` on bf16 tensors.
- ``bf16_min_weights``: without the AMX kernel, :func:`~transduce.model.bf16.bf16_products` gives bf16 products to
  the linear layers of at least this many weights (2^16); smaller ones stay float32, where oneDNN's fixed cost
  loses.
- ``pause_gc``, ``pause_gc_limit_s``: Python's cyclic garbage collector paused during searches
  (``search/common.py: gc_paused``), for at most ``pause_gc_limit_s`` while searches keep overlapping. Fallback:
  the collector runs as usual.
- ``block_cache``: training on the CPU takes tensors of 256 KiB and more from transduce's block cache
  (``model/csrc/allocator.cpp``, part of the kernels; :mod:`transduce.training.memory`), which reuses blocks of about
  the right size within a bound. Fallback: the C library's allocator, whose heap fragments under batches of changing
  shapes (a Multi30k training process held 4.4 GB after 300 updates instead of 1.3).

The choices that depend on the CPU read :func:`cpu_features` (vendor; AVX2, AVX-512, VNNI, AVX512-BF16, AMX):
``onednn_layers`` (:func:`onednn_beats_mkl`), ``onednn`` and ``transposed_weights`` (:func:`transposed_beats_packed`),
``by_position_min_source`` (:func:`by_position_threshold`), ``int8_min_weights``, ``int8_amx``, ``bf16_amx`` and the
precision ``auto`` decodes in (:func:`decode_precision`).

Why each default is what it is (the measurements): ``docs/benchmarks.md``; the code next to each path says it
briefly. Only ``kernels`` has an environment variable: the others are for tests, benchmarks and users who know
why they change them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "CpuFeatures", "FastPaths", "by_position_threshold", "cpu_features", "cpu_vendor", "decode_precision",
    "onednn_available", "onednn_beats_mkl", "override", "settings", "transposed_beats_packed", "vnni_available",
]  # fmt: skip


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's linear operation with packed weights (``mkldnn._linear_pointwise``)."""
    try:
        return torch.backends.mkldnn.is_available() and callable(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def _cpuinfo(field_name: str) -> str:
    """The value of the first ``field_name`` line of /proc/cpuinfo; "" where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(field_name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86's ``flags`` line, Arm's ``Features``); empty where none."""
    return set(_cpuinfo("flags").split()) | set(_cpuinfo("Features").split())


def cpu_vendor() -> str:
    """The CPU's vendor id (``AuthenticAMD``, ``GenuineIntel``) from /proc/cpuinfo; "" where there is none."""
    return _cpuinfo("vendor_id")


@dataclass(frozen=True)
class CpuFeatures:
    """What the CPU is, as far as the fast paths' choices go (:func:`cpu_features`; tests make their own)."""

    vendor: str  # /proc/cpuinfo's vendor_id: GenuineIntel, AuthenticAMD; "" where unknown (not Linux, Arm)
    capability: str  # PyTorch's vector extension: AVX512, AVX2, DEFAULT (torch.backends.cpu.get_cpu_capability())
    vnni: bool  # AVX512-VNNI: int8 dot products (transduce's int8 kernel, PyTorch's int8 operation)
    avx512_bf16: bool  # AVX512-BF16: bf16 dot products in the vector units (AMD Zen 4 and 5, Intel Cooper Lake on)
    amx_bf16: bool  # AMX-BF16: bf16 products in matrix tiles (Intel Xeon from Sapphire Rapids on)
    amx_int8: bool  # AMX-INT8: int8 products in matrix tiles

    @property
    def kind(self) -> str:
        """The CPU's kind for benchmark tables: ``AMX``, ``AVX512-BF16``, ``AVX512``, ``AVX2`` or ``other``."""
        if self.amx_bf16:
            return "AMX"
        if self.avx512_bf16:
            return "AVX512-BF16"
        return self.capability if self.capability in ("AVX512", "AVX2") else "other"


def cpu_features() -> CpuFeatures:
    """This machine's :class:`CpuFeatures`, read at each call (tests patch what it reads): the vendor and flags from
    /proc/cpuinfo, PyTorch's vector extension and its own VNNI test. An extension counts only where PyTorch uses
    AVX-512 (a CPU or a PyTorch build without it gets none of the AVX-512 paths)."""
    flags = cpu_flags()
    capability = torch.backends.cpu.get_cpu_capability()
    avx512 = capability == "AVX512"
    return CpuFeatures(
        vendor=cpu_vendor(),
        capability=capability,
        vnni=vnni_available(),
        avx512_bf16=avx512 and "avx512_bf16" in flags,
        amx_bf16=avx512 and "amx_bf16" in flags,
        amx_int8=avx512 and "amx_int8" in flags,
    )


def onednn_beats_mkl(cpu: CpuFeatures | None = None) -> bool:
    """Whether oneDNN's fp32 products beat MKL's (behind ``F.linear``) on ``cpu`` (default: this one): PyTorch uses
    AVX-512 and the CPU is AMD's, where MKL's kernels stop at AVX2. On Intel MKL uses AVX-512 too, and oneDNN for
    every layer gave a Multi30k beam search no steady gain (1.04x at batch 32, 0.91x at 64 on a Xeon with AMX, one
    thread; docs/benchmarks.md)."""
    cpu = cpu_features() if cpu is None else cpu
    return cpu.capability == "AVX512" and cpu.vendor == "AuthenticAMD"


def transposed_beats_packed(cpu: CpuFeatures | None = None) -> bool:
    """Whether MKL's plain product with a transposed copy of each weight (``x @ W^T`` with ``W^T`` stored
    contiguously, :func:`transduce.model.packed.transposed_weight`) beats both ``F.linear`` (MKL's product with the
    transposed view) and oneDNN's packed weight on ``cpu`` (default: this one): PyTorch uses AVX-512 and the CPU is
    Intel's, where it won on a Xeon with AMX (the figures: :mod:`transduce.model.packed` and docs/benchmarks.md).
    Elsewhere unmeasured (on AMD, MKL's kernels stop at AVX2 and oneDNN's packed products win)."""
    cpu = cpu_features() if cpu is None else cpu
    return cpu.capability == "AVX512" and cpu.vendor == "GenuineIntel"


def by_position_threshold(cpu: CpuFeatures | None = None) -> int:
    """The default of ``by_position_min_source`` on ``cpu`` (default: this one): the source length from which the
    decoding step's self-attention cache is stored by position rather than copied into row order at every step.
    ``benchmarks/kv_cache.py`` (beam 4, ``small``, one thread) measured the crossover between 50 and 100 tokens on a
    Xeon with AMX (by position 0.91x at 50, 1.14x at 100, 1.57x at 400 in float32; 1.18-2.42x from 50 with bf16
    products), so 100 on Intel with AVX-512; near 400 on an AMD Zen 5 (0.92-1.00x up to 400, 1.70x at 800), so 400
    elsewhere (AVX2-only CPUs unmeasured). docs/benchmarks.md has the tables."""
    cpu = cpu_features() if cpu is None else cpu
    return 100 if cpu.capability == "AVX512" and cpu.vendor == "GenuineIntel" else 400


def decode_precision(cpu: CpuFeatures | None = None) -> tuple[str, str]:
    """The precision ``auto`` decodes in on ``cpu`` (default: this one), and why: ``bf16`` (bf16 weights and
    products, the rest float32; :mod:`transduce.model.bf16`) where the CPU has AMX-BF16, else ``fp32``.

    Measured on a Xeon with AMX (docs/benchmarks.md): a Multi30k beam search at 1.87x fp32's speed, BLEU within
    0.1. A CPU with AVX512-BF16 but no AMX stays fp32: with oneDNN kept to those instructions on the same Xeon the
    search ran at 0.71x fp32 (an AMD CPU with AVX512-BF16 is unmeasured); and so do CPUs without either (bf16
    would be emulated)."""
    cpu = cpu_features() if cpu is None else cpu
    if cpu.amx_bf16 and onednn_available():
        return "bf16", "auto: this CPU multiplies bf16 matrices in AMX tiles"
    if cpu.avx512_bf16:
        return "fp32", "auto: AVX512-BF16 without AMX, where bf16 decoding is not measured faster"
    return "fp32", "auto: this CPU has no bf16 matrix instructions"


def vnni_available() -> bool:
    """Whether PyTorch reports AVX512-VNNI (the int8 dot-product instructions)."""
    return bool(getattr(torch.cpu, "_is_vnni_supported", lambda: False)())


@dataclass
class FastPaths:
    """The fast paths and their settings (see the module's table). One instance, :data:`settings`, is read by the
    code at each call; change it with :func:`override` or :meth:`update`."""

    # transduce's C++ kernels (model/kernels.py) wherever they apply; False: PyTorch's operations everywhere
    kernels: bool = field(default_factory=lambda: os.environ.get("TRANSDUCE_KERNELS", "1") != "0")
    # one-token decoding steps through model/step.py's function; False: through the decoder's modules
    step_function: bool = True
    # ... with the float32 decoder layers of the step in one kernel call (csrc/decoding.cpp: decoder_step, the same
    # operations), where its linear layers are MKL's products; False: the step function's Python loop
    step_kernel: bool = True
    # inference attention through the kernel (model/fused.py) for at most this many keys (above: SDPA, faster from
    # about 256 keys)
    attention_kernel_max_keys: int = 128
    # the step's self-attention cache stored by position for padded sources of at least this many tokens (below,
    # copying it into row order inside the attention kernel costs no more): 100 on Intel with AVX-512, else 400
    by_position_min_source: int = field(default_factory=by_position_threshold)
    # attention that autograd differentiates on the CPU as explicit products (model/layers.py) for at most this many
    # keys (SDPA's flash kernel above; the explicit products keep the (B, h, T, S) weights for the backward pass)
    explicit_attention_max_keys: int = 512
    # the pre-softmax projection through oneDNN with a packed weight (model/packed.py); off where transposed_weights
    # is measured faster
    onednn: bool = field(default_factory=lambda: onednn_available() and not transposed_beats_packed())
    # every other linear layer through oneDNN too: faster than MKL where oneDNN has wider vectors, slower elsewhere
    onednn_layers: bool = field(default_factory=lambda: onednn_available() and onednn_beats_mkl())
    # ... for products of at least this many multiply-adds (oneDNN's fixed cost per call loses below)
    onednn_min_macs: int = 1 << 19
    # float32 inference products with a contiguous transposed copy of each weight (MKL's plain product; model/packed.py,
    # model/step.py) where oneDNN does not take them: faster than F.linear's transposed product on Intel with AVX-512
    transposed_weights: bool = field(default_factory=transposed_beats_packed)
    # quantised layers through transduce's VNNI product (model/quantize.py); False: PyTorch's int8 operation
    int8_kernel: bool = True
    # quantize_int8 leaves linear layers with fewer weights in float32 (int8 is no faster for them without VNNI)
    int8_min_weights: int = field(default_factory=lambda: 0 if cpu_features().vnni else 1 << 16)
    # the int8 kernel's products in AMX tiles (csrc/int8.cpp: int8_amx_linear, the same outputs) where the CPU has
    # AMX-INT8: 1.0-3.4x the VNNI kernel on the presets' decoding products (docs/benchmarks.md)
    int8_amx: bool = field(default_factory=lambda: cpu_features().amx_int8)
    # bf16 linear layers (model/bf16.py) through transduce's AMX kernel (model/csrc/amx.cpp) where the CPU has AMX-BF16:
    # 2-12x MKL's float32 product and 1.4-15x oneDNN's bf16 one on the presets' decoding shapes (docs/benchmarks.md)
    bf16_amx: bool = field(default_factory=lambda: cpu_features().amx_bf16)
    # a beam search's bf16 or int8 pre-softmax projection in the AMX tiles and the candidates taken from its logits
    # in the same pass (amx_bf16_candidates, int8_amx_candidates; search/candidates.py), the logits never written
    fused_candidates: bool = True
    # bf16 layers without the AMX kernel: through oneDNN with packed weights; False: F.linear on bf16 tensors
    bf16_onednn: bool = field(default_factory=onednn_available)
    # without the AMX kernel, bf16_products leaves linear layers with fewer weights in float32: oneDNN's fixed cost of
    # 40-50 us a call loses to MKL's float32 product there (a `tiny` model's 128 x 384 layer: 0.50-0.78x at 8-32 rows;
    # a 256 x 256 layer 1.20x at 32 rows already)
    bf16_min_weights: int = 1 << 16
    # Python's cyclic garbage collector off during searches (search/common.py: gc_paused) ...
    pause_gc: bool = True
    # ... for at most this long while searches keep overlapping (a full collection then)
    pause_gc_limit_s: float = 10.0
    # training on the CPU: large tensors from transduce's block cache (model/csrc/allocator.cpp;
    # transduce.training.memory)
    block_cache: bool = True

    def __setattr__(self, name: str, value: Any) -> None:
        _check(name, value)
        super().__setattr__(name, value)

    def update(self, **changes: Any) -> None:
        """Set the named settings, all checked first (an unknown name or a value of the wrong type raises
        ``TypeError``, a negative number ``ValueError``, and nothing changes)."""
        for name, value in changes.items():
            _check(name, value)
        for name, value in changes.items():
            setattr(self, name, value)

    def describe(self) -> str:
        """One line: every setting and its value (for benchmark output and bug reports)."""
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


_FIELDS = {f.name: f for f in dataclasses.fields(FastPaths)}


def _check(name: str, value: Any) -> None:
    f = _FIELDS.get(name)
    if f is None:
        close = difflib.get_close_matches(name, _FIELDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; valid: {', '.join(_FIELDS)}"
        raise TypeError(f"fastpaths: no setting {name!r}{hint}")
    kind = {"bool": bool, "int": int, "float": float}[f.type]
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        article = "an" if f.type == "int" else "a"
        raise TypeError(f"fastpaths: {name} takes {article} {f.type}, got {value!r}")
    if kind is not bool and value < 0:
        raise ValueError(f"fastpaths: {name} must be >= 0, got {value!r}")


settings = FastPaths()


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[FastPaths]:
    """Change settings of :data:`settings` for the ``with`` block, and restore them after it (also after an
    exception). Process-wide, not per thread: meant for tests, benchmarks and scripts.

    Yields:
        :data:`settings`, changed.
    """
    before = {name: getattr(settings, name) for name in changes if name in _FIELDS}
    settings.update(**changes)
    try:
        yield settings
    finally:
        for name, value in before.items():
            setattr(settings, name, value)
