"""Data parallelism with ``torch.distributed``: one code path for one process and for ``torchrun``.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`setup` reads
them and joins the process group (gloo on CPU, NCCL on CUDA). Without them it is a single process and no group is
created. Only rank 0 writes files (:attr:`Dist.is_main`).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class Dist:
    """Where this process stands in the data-parallel job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes the run directory."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launched_world_size() -> int:
    """The number of processes ``torchrun`` started for this job (``WORLD_SIZE``; 1 without ``torchrun``)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_local_rank() -> int:
    """This process's rank on its node (``LOCAL_RANK``; 0 without ``torchrun``)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def setup(device: str | torch.device, timeout_minutes: float = 60.0, *, shared_gpu: bool = False) -> Dist:
    """Join the process group described by the ``torchrun`` environment, if any.

    Args:
        device: ``"cuda"`` or a CUDA device (NCCL backend, one GPU per local rank), else gloo.
        timeout_minutes: how long a collective (the barrier while rank 0 prepares the data, an all-reduce) waits
            for the other ranks before the job fails (NCCL's own default is 10 minutes).
        shared_gpu: the ranks share one GPU (``train.device=cuda:N`` under ``torchrun``): NCCL refuses that, so
            gloo carries the collectives.
    """
    world_size = launched_world_size()
    if world_size <= 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), launched_local_rank()
    device = torch.device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" and not shared_gpu else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device if device.index is not None else torch.device("cuda", local_rank))
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_minutes))
        if rank == 0:
            log = logging.getLogger(__name__)
            log.info("process group: %d ranks, %s; collectives time out after %g min (train.dist_timeout_minutes)",
                     world_size, backend, timeout_minutes)  # fmt: skip
    return Dist(rank, world_size, local_rank)


def teardown() -> None:
    """Leave the process group (no-op for a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def leave(code: int) -> NoReturn:
    """End a data-parallel worker whose work is written and whose process group is destroyed (:func:`teardown`),
    skipping the interpreter's finalisation: flush the logs and streams, then ``os._exit(code)``.

    Why: once a ``DistributedDataParallel`` model was built, gloo's worker threads outlive
    ``destroy_process_group`` (seen with torch 2.13 on CPU: something in PyTorch keeps the group, and its threads
    still run after the group is destroyed, the model deleted and the garbage collected), and such a thread that
    touches a Python object while the interpreter shuts down aborts the process ("terminate called without an
    active exception"; 3 of 150 two-process runs of a short training on a loaded machine, 0 of 60 with this exit),
    which ``torchrun`` reports as a failed job although every file was written. The ``transduce`` command ends its
    ``torchrun`` workers so; a script of one's own that trains under ``torchrun`` should end with it too.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few numbers over all processes (float64; identity for a single process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over all processes, in place, without reading it back to the host (identity for one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


def any_true(flag: bool, device: torch.device) -> bool:
    """True on every process when ``flag`` is true on any (e.g. a stop signal received by one rank)."""
    return all_reduce_sum([1.0 if flag else 0.0], device)[0] > 0


def broadcast_object(obj: object) -> object:
    """Rank 0's ``obj`` on every process (identity for a single process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
