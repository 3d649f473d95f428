"""Bounded memory for training on the CPU.

A Multi30k training process (the configs' model, 9.4 M parameters, bf16 on a CPU with AMX, one thread) grew to
4.4 GB over 300 updates, while the weights, Adam's moments and one update's tensors need well under 1 GB. The
rest came from the batches' shapes, which differ from one update to the next:

1. oneDNN's compiled primitives. Under bf16 autocast the CPU's matrix products go to oneDNN, which compiles a
   primitive for each new shape and keeps it twice: in oneDNN's primitive cache (1,024 entries by default, about
   0.3 MB each) and in the cache of ideep, PyTorch's wrapper around it (another 1,024, about 0.26 MB each). A
   Multi30k epoch has 119 batch shapes of about 23 primitives each, so both caches fill up (820 MB held) and then
   keep replacing entries, which gain little: a primitive comes back only with its batch shape, an epoch later.
2. The C library's heap. The update's large tensors differ in size with the shapes, and came from one heap with
   the small long-lived allocations made meanwhile (the cache entries above among them). The heap fragmented and
   grew, and the free memory inside it is never given back: 2.3 GB of the 3.5 GB. Giving large blocks back to the
   system at once instead (a lower mmap threshold, or ``malloc_trim`` after each update) cost 75% and 190% of the
   update's time: a new mapping is zero-filled page by page on first touch.

:func:`training_memory`, which :func:`transduce.training.train.train` enters for the run, bounds both:

- it caps the two caches at :data:`ONEDNN_CACHE_CAPACITY` and :data:`IDEEP_CACHE_CAPACITY` entries
  (``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and ``LRU_CACHE_CAPACITY`` in the environment, unless set there already;
  oneDNN and ideep read them once, when the process makes its first primitive, so this holds where training is the
  first to use oneDNN, as in ``transduce train``);
- on a CPU device it takes tensors of :data:`BLOCK_MIN_BYTES` and more from transduce's block cache
  (``model/csrc/allocator.cpp``): blocks mapped once and reused for tensors of about their size, the blocks mapped
  kept within :data:`BLOCK_LIMIT_FACTOR` x the peak of the bytes in use; the cache is PyTorch's CPU allocator until
  the run ends, when the blocks kept for reuse are given back. Without transduce's kernels (no compiler,
  ``TRANSDUCE_KERNELS=0``) or with ``fastpaths.settings.block_cache`` off, the C library's allocator serves them.

Measured with ``benchmarks/train_memory.py``; the figures are in docs/benchmarks.md ("Training memory").
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from types import ModuleType

import torch

from transduce import fastpaths

log = logging.getLogger(__name__)

#: oneDNN's primitive cache capacity during training (its default: 1,024).
ONEDNN_CACHE_CAPACITY = 256
#: ideep's cache capacity during training (its default: 1,024).
IDEEP_CACHE_CAPACITY = 64
#: Tensors of at least this many bytes come from the block cache; smaller ones from the C library's allocator.
BLOCK_MIN_BYTES = 256 * 1024
#: The block cache's mapped blocks stay within this many times the peak of the bytes in use.
BLOCK_LIMIT_FACTOR = 1.25

# the environment variables oneDNN and ideep read their capacities from, and the values set for training
_CACHE_VARIABLES = {
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": ONEDNN_CACHE_CAPACITY,
    "LRU_CACHE_CAPACITY": IDEEP_CACHE_CAPACITY,
}


@contextlib.contextmanager
def capped_onednn_caches() -> Iterator[dict[str, str]]:
    """oneDNN's and ideep's cache capacities in the environment for the ``with`` block, unless set there already
    (removed after it, so that later subprocesses do not inherit them). They take effect in a process that makes
    its first oneDNN primitive inside the block.

    Yields:
        The capacities in the environment, by variable.
    """
    added = [name for name in _CACHE_VARIABLES if name not in os.environ]
    for name in added:
        os.environ[name] = str(_CACHE_VARIABLES[name])
    try:
        yield {name: os.environ[name] for name in _CACHE_VARIABLES}
    finally:
        for name in added:
            os.environ.pop(name, None)


def _kernels() -> ModuleType | None:
    """transduce's compiled kernels (which hold the block cache), or None."""
    from transduce.model import kernels

    return kernels.compiled()


def block_cache_stats() -> dict[str, int]:
    """The block cache's counters (bytes in use, kept and mapped, the peak in use, maps, reuses, unmaps, kept
    blocks, whether installed); empty when it was never installed or the kernels are not there."""
    module = _kernels()
    return dict(module.block_cache_stats()) if module is not None else {}


@contextlib.contextmanager
def training_memory(device: torch.device) -> Iterator[bool]:
    """Bound the memory of a training run on ``device`` for the ``with`` block (see the module's description).

    Yields:
        Whether the block cache serves the run's large tensors.
    """
    with capped_onednn_caches() as caps:
        module = _kernels() if device.type == "cpu" and fastpaths.settings.block_cache else None
        installed = module is not None and bool(module.block_cache_install(BLOCK_MIN_BYTES, BLOCK_LIMIT_FACTOR))
        log.debug("training memory: oneDNN cache %s, ideep cache %s entries; block cache %s",
                  caps["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], caps["LRU_CACHE_CAPACITY"],
                  "on" if installed else "off")  # fmt: skip
        try:
            yield installed
        finally:
            if installed:
                module.block_cache_uninstall()


__all__ = [
    "BLOCK_LIMIT_FACTOR", "BLOCK_MIN_BYTES", "IDEEP_CACHE_CAPACITY", "ONEDNN_CACHE_CAPACITY", "block_cache_stats",
    "capped_onednn_caches", "training_memory",
]  # fmt: skip
