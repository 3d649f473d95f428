"""Devices and numeric precisions: one spelling for every command and the library.

A device is ``auto`` (CUDA when a GPU is visible, else Apple's ``mps`` when there, else the CPU), ``cpu``, ``cuda``
(under ``torchrun``, the GPU of the process's local rank, or GPU 0 when each process sees only its own),
``cuda:N`` or ``mps``. A device the machine does not have is refused with a one-line :class:`DeviceError` before
anything is loaded.

A precision is a name of :data:`PRECISIONS`: ``fp32``, ``bf16`` or ``fp16``. Training runs bf16/fp16 under autocast
with float32 master weights (fp16 with a gradient scaler); inference casts the weights. On CUDA, float32 matrix
products use TF32 where the GPU has it (Ampere and newer).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from transduce.errors import TransduceError

if TYPE_CHECKING:  # (the config imports this module: it loads without torch)
    import torch

#: The precisions a user may name, and the name of the torch dtype each computes in (adding one is one line here).
PRECISIONS: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DEVICE_FORMS = "auto, cpu, cuda, cuda:N or mps"
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


class DeviceError(TransduceError, ValueError):
    """A device that is misspelt or that this machine (or this PyTorch) does not have."""


def check_device_name(name: str, where: str = "device") -> None:
    """Raise :class:`DeviceError` unless ``name`` is one of :data:`DEVICE_FORMS` (availability is not checked)."""
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise DeviceError(f"{where}: {name!r} is not a device ({DEVICE_FORMS})")


def _mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(name: str | torch.device, local_rank: int = 0, where: str = "device") -> torch.device:
    """The device ``name`` stands for on this machine.

    Args:
        name: see :data:`DEVICE_FORMS` (a ``torch.device`` is checked the same way).
        local_rank: this process's rank on its node: ``auto`` and ``cuda`` take GPU ``local_rank``, or GPU 0 when
            the process sees only one (``CUDA_VISIBLE_DEVICES`` set per process).
        where: the option's name, for the error message.
    Returns:
        The device, whose index is set for CUDA.
    Raises:
        DeviceError: a misspelt device, or one that is not there (no CUDA build, no GPU, GPU N of fewer, no mps).
    """
    import torch

    name = str(name)
    check_device_name(name, where)
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif _mps_available():
            name = "mps"
        else:
            return torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "mps":
        if not _mps_available():
            raise DeviceError(f"{where}: 'mps' asked for, but this machine or PyTorch has no Apple GPU (mps)")
        return torch.device("mps")
    if not torch.cuda.is_available():
        why = "this PyTorch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise DeviceError(f"{where}: {name!r} asked for, but {why}; use --device cpu (or auto)")
    count = torch.cuda.device_count()
    if ":" in name:
        index, which = int(name.split(":")[1]), ""
    else:  # one process per GPU: with CUDA_VISIBLE_DEVICES set per process (SLURM, some launchers) its GPU is 0
        index, which = (0 if count == 1 else local_rank), " (the local rank)"
    if index >= count:
        raise DeviceError(f"{where}: {name!r} asked for GPU {index}{which}, but {count} GPU(s) are visible "
                          f"(CUDA_VISIBLE_DEVICES={_visible()})")  # fmt: skip
    return torch.device("cuda", index)


def _visible() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "unset")


def check_precision(name: str, where: str = "precision") -> torch.dtype:
    """The dtype of precision ``name``; :class:`DeviceError` naming the choices when it is not one."""
    import torch

    if name not in PRECISIONS:
        raise DeviceError(f"{where}: {name!r} is not one of {', '.join(PRECISIONS)}")
    return getattr(torch, PRECISIONS[name])


def allow_tf32(device: torch.device) -> None:
    """On CUDA, let float32 matrix products and convolutions use TF32 (Ampere and newer; a no-op elsewhere)."""
    import torch

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
