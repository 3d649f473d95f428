"""transduce's own CPU kernels, built from ``csrc/decoding.cpp``, ``csrc/training.cpp``, ``csrc/int8.cpp``,
``csrc/amx.cpp`` and ``csrc/allocator.cpp`` on first use.

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
- ``decoder_step``: the float32 decoder layers of a step in one call (ATen's products, ``layer_norm``,
  ``attend_gathered`` and ``attend`` in the order of the step function's Python loop, so the same numbers), sparing
  the interpreter and binding time of about a hundred small operations a step
  (:func:`transduce.model.step.decode_step`, ``fastpaths.settings.step_kernel``).
- ``beam_advance``: the rest of a beam step once each row's best logits are known: the candidates' scores, each
  sentence's best ``2 * beam``, the survivors, their rows and the history, in one call where PyTorch's operations
  took about thirty (:func:`transduce.search.beam.advance`).

For int8 inference (``csrc/int8.cpp``, built only for CPUs with AVX512-VNNI):

- ``int8_linear``: a dynamically quantised linear layer, each input row quantised with its own scale, the products
  summed by VPDPBUSD (:func:`transduce.model.quantize.int8_function`); ``int8_amx_linear`` the same in AMX tiles
  (TDPBUSD) where the CPU has AMX-INT8, with the same outputs.

For bf16 inference (``csrc/amx.cpp``, built only for CPUs with AMX-BF16):

- ``amx_bf16_linear``: a linear layer with a bf16 weight, the float32 rows rounded to bf16 and multiplied in the AMX
  tiles, the float32 sums written with the bias, ReLU and residual (:func:`transduce.model.bf16.project`);
  ``amx_bf16_pack`` puts the weight into the tiles' layout once; ``amx_available`` asks the operating system for the
  tiles' state.
- ``amx_bf16_candidates``: a beam step's pre-softmax projection in the tiles and ``row_candidates``' reduction of
  its logits in the same pass, 256 logits of a row at a time in the cache, the logits never written
  (:func:`transduce.model.bf16.candidates_function`, ``search/candidates.py``).

For training steps (float32 and bfloat16):

- ``dropout_apply``: dropout in one pass with a mask hashed from a seed and the element index
  (:func:`transduce.model.fused.dropout`); the backward pass reapplies the seed, so no mask is stored.
- ``smoothed_nll_forward`` / ``smoothed_nll_backward``: the label-smoothed loss of :mod:`transduce.training.loss` in one
  pass over each row of logits forward and one backward, in the logits' own dtype.
- ``add_layer_norm_forward`` / ``add_layer_norm_backward``: a post-norm residual ``LayerNorm(x + dropout(y))``
  (:func:`transduce.model.fused.add_norm`) in one pass over the rows each way.

For training memory (``csrc/allocator.cpp``):

- ``block_cache_install`` / ``block_cache_uninstall`` / ``block_cache_release`` / ``block_cache_stats``: a CPU
  allocator that takes large tensors from blocks mapped once and reused, within a bound, for the duration of a
  training run (:mod:`transduce.training.memory`).

:func:`compiled` compiles the C++ files with ``torch.utils.cpp_extension`` the first time a process needs it
(about 30-40 seconds with two cores; it needs a C++ compiler, ninja and Python's headers) and keeps the result in
PyTorch's extension cache (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), so later processes
load it at once. Where it cannot be built, transduce warns once and uses PyTorch's operations: the same results
(dropout: the same masks), only slower. ``TRANSDUCE_KERNELS=0`` in the environment (or
``transduce.fastpaths.settings.kernels = False``) turns the kernels off.

The compiled code is specific to the CPU features it was built for (AVX2 and FMA when the CPU has them, as PyTorch
reports; with AVX-512, AVX512-BF16's float-to-bf16 conversion, AVX512-VNNI's int8 products and AMX-BF16's tiles
where present), and
the extension's name says which, so machines of different kinds can share one cache directory. The name also carries
a hash of the Python environment (interpreter, PyTorch's version and location), so two environments on one machine
never rebuild over each other or load each other's build.

A build never hangs a later command. ``torch.utils.cpp_extension`` guards a build with a ``lock`` file in the build
directory and waits, without a bound, while that file exists; a build killed by SIGTERM or SIGKILL leaves it behind.
transduce holds an operating-system lock (``flock``, released by the kernel when its holder dies, however it dies)
around its builds: the process that gets it knows no live transduce build is running, so a ``lock`` file there was
left by a killed one, and is removed (a warning says so). A process that waits for a live build waits at most
:data:`BUILD_WAIT_S` seconds (``TRANSDUCE_KERNEL_WAIT``), then warns and runs on PyTorch's operations.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import IO

import torch
from torch import Tensor

from transduce import fastpaths

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = (CSRC / "decoding.cpp", CSRC / "training.cpp", CSRC / "int8.cpp", CSRC / "allocator.cpp", CSRC / "amx.cpp")
# PyTorch rebuilds when a source changes; a header's hash goes into the flags
HEADERS = (CSRC / "vecmath.h", CSRC / "amx_tiles.h")

_DEFAULT_BUILD_WAIT_S = 300.0


def _build_wait_s(default: float = _DEFAULT_BUILD_WAIT_S) -> float:
    """``TRANSDUCE_KERNEL_WAIT`` when it is a number of seconds >= 0; else a warning and ``default``."""
    raw = os.environ.get("TRANSDUCE_KERNEL_WAIT")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0.0 <= value < math.inf:
        log.warning("TRANSDUCE_KERNEL_WAIT=%r is not a number of seconds >= 0; waiting at most %g s for another "
                    "process's kernel build", raw, default)  # fmt: skip
        return default
    return value


#: Seconds a process waits for another process's build of the same kernels before it gives up and runs on
#: PyTorch's operations (a build takes 30-40 s on two cores): ``TRANSDUCE_KERNEL_WAIT``, else 300.
BUILD_WAIT_S = _build_wait_s()

#: Without ``flock`` (Windows, some network file systems) a ``lock`` file older than this many seconds is taken
#: for a killed build's.
STALE_LOCK_S = 600.0

#: Loading kernels that are already built takes well under a second; a load that takes longer than this compiles
#: them (changed sources or flags), and says so then.
COMPILE_NOTICE_S = 2.0
_COMPILE_NOTICE = "compiling transduce's CPU kernels (first use, about 30-40 s; then cached)"

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
            amx = bf16 and fastpaths.cpu_features().amx_bf16
            flags += (
                ["-mamx-tile", "-mamx-bf16", "-mamx-int8"]
                if amx and vnni
                else ["-mamx-tile", "-mamx-bf16"]
                if amx
                else []
            )
            return "avx512" + ("bf16" if bf16 else "") + ("_vnni" if vnni else "") + ("_amx" if amx else ""), flags
    if capability in ("AVX2", "AVX512"):
        return "avx2", ["-mavx2", "-mfma"]
    return "generic", []


def environment_tag() -> str:
    """A short hash of this Python environment: the interpreter (its prefix, version and ABI) and the PyTorch the
    kernels are compiled against (version, CUDA/HIP version, location)."""
    parts = (
        sys.prefix, sys.version, getattr(sys, "abiflags", ""), torch.__version__, str(torch.version.cuda),
        str(getattr(torch.version, "hip", None)), os.path.dirname(torch.__file__),
    )  # fmt: skip
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]


def extension_name() -> str:
    """The extension's name: the CPU's instruction sets and the environment (:func:`environment_tag`)."""
    return f"transduce_kernels_{_arch_flags()[0]}_{environment_tag()}"


def build_directory(name: str) -> Path:
    """Where ``name`` is built: ``TORCH_EXTENSIONS_DIR`` (or PyTorch's default cache) / name."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / name


class BuildWaitTimeout(RuntimeError):
    """Another process's build of the kernels did not finish in :data:`BUILD_WAIT_S` seconds."""


@contextmanager
def build_lock(directory: Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold the builders' lock of ``directory``; on getting it, remove a ``lock`` file that a killed build of
    ``torch.utils.cpp_extension`` left (no live builder holds ours). Raises :class:`BuildWaitTimeout` after
    ``wait_s`` seconds (default :data:`BUILD_WAIT_S`) of waiting for a live builder."""
    wait_s = BUILD_WAIT_S if wait_s is None else wait_s
    directory.mkdir(parents=True, exist_ok=True)
    torch_lock = directory / "lock"
    try:
        import fcntl
    except ImportError:  # no flock (Windows)
        fcntl = None
    with open(directory / "transduce.flock", "a+") as handle:
        deadline, said = time.monotonic() + wait_s, False
        while (locked := _try_flock(fcntl, handle)) is False:
            if time.monotonic() >= deadline:
                raise BuildWaitTimeout(f"another process has been building the kernels in {directory} for more "
                                       f"than {wait_s:.0f} s (TRANSDUCE_KERNEL_WAIT)")  # fmt: skip
            if not said:
                log.info("waiting up to %.0f s for another process building the kernels in %s", wait_s, directory)
                said = True
            time.sleep(0.2)
        if locked is None:  # no flock here: a lock file older than any build is a killed build's
            if torch_lock.exists() and time.time() - torch_lock.stat().st_mtime > STALE_LOCK_S:
                _remove_stale(torch_lock)
            yield
            return
        try:
            if torch_lock.exists():  # no live builder holds ours: a killed build left it
                _remove_stale(torch_lock)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _try_flock(fcntl: ModuleType | None, handle: IO) -> bool | None:
    """True: ``handle``'s exclusive flock is ours; False: another process holds it; None: no flock on this system
    or file system (Windows, some network mounts)."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return None


def _remove_stale(torch_lock: Path) -> None:
    log.warning("removing %s, left by a kernel build that was killed", torch_lock)
    torch_lock.unlink(missing_ok=True)


def build() -> ModuleType:
    """Compile (or load from PyTorch's extension cache) the kernel module; raises what the build raises, and
    :class:`BuildWaitTimeout` when another process's build takes too long."""
    from torch.utils import cpp_extension

    arch = _arch_flags()[1]
    name = extension_name()
    directory = build_directory(name)
    headers = hashlib.sha256(b"".join(h.read_bytes() for h in HEADERS)).hexdigest()[:16]
    with build_lock(directory):
        # a first build is announced at once; a load from the cache says nothing unless it turns out to compile
        built = any(directory.glob(f"{name}*.so")) or any(directory.glob(f"{name}*.pyd"))
        notice = threading.Timer(COMPILE_NOTICE_S, log.info, (_COMPILE_NOTICE,))
        notice.daemon = True
        if built:
            notice.start()
        else:
            log.info(_COMPILE_NOTICE)
        try:
            return cpp_extension.load(
                name=name,
                sources=[str(s) for s in SOURCES],
                extra_cflags=["-O3", "-fopenmp", *arch, f"-DTRANSDUCE_HEADERS={headers}"],
                extra_ldflags=["-fopenmp"],  # libgomp.so.1: the process already has PyTorch's, and uses it
                build_directory=str(directory),
                verbose=False,
            )
        finally:
            notice.cancel()


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
