"""One optimizer update: forward and backward over the accumulated batches, normalisation, clipping, Adam.

The gradient of an update is ``d/dθ (Σ label-smoothed loss) / N`` where the sum and ``N`` (the number of real
target tokens) run over every accumulated batch on every process. Each batch's backward uses the summed loss; DDP
averages gradients over ranks, so after the last backward the gradients are multiplied by ``world_size / N``.
Gradient accumulation over k batches therefore equals one batch holding all k, and ``n`` processes equal one
process given the union of their batches (up to float summation order).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
from typing import Any

import numpy as np
import torch
from torch import nn

from transduce.config import Config
from transduce.data.batch import Batch
from transduce.distributed import Dist, all_reduce_sum
from transduce.loss import label_smoothed_nll
from transduce.optim import build_optimizer, learning_rate, set_learning_rate

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StepResult:
    """What one update did. Losses are per target token over the whole update (all batches, all ranks)."""

    loss: float  # label-smoothed loss per target token
    nll: float  # negative log-likelihood per target token (exp(nll) is the perplexity)
    tokens: int  # target tokens in the update
    src_tokens: int  # source tokens in the update
    lr: float  # learning rate applied (0 when skipped)
    grad_norm: float | None  # gradient norm before clipping (None when the loss was not finite)
    skipped: bool  # True when the loss or gradient was not finite and no update was applied


def cpu_has_native_bf16() -> bool:
    """True when this CPU multiplies bf16 matrices in hardware (x86 avx512_bf16 or AMX; Arm's bf16 feature).

    Without it, oneDNN emulates bf16 and autocast makes CPU training much slower instead of faster.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_precision(precision: str, device: torch.device) -> tuple[str, str]:
    """The precision a run trains in for ``train.precision`` on ``device``, and why: ``auto`` is bf16 where the
    device multiplies bf16 in hardware (a CUDA GPU that supports bf16; a CPU with AVX512-BF16 or AMX), else fp32;
    any other value is taken as it is."""
    if precision != "auto":
        return precision, "as configured"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16", "auto: this GPU multiplies bf16 in hardware"
        return "fp32", "auto: this GPU has no hardware bf16"
    if device.type == "cpu":
        if cpu_has_native_bf16():
            return "bf16", "auto: this CPU multiplies bf16 in hardware (avx512_bf16 / amx_bf16)"
        return "fp32", "auto: this CPU has no bf16 instructions (bf16 would be emulated, and slower than fp32)"
    return "fp32", f"auto: fp32 on {device.type}"


def select_device(name: str, dist: Dist) -> torch.device:
    """``auto``: CUDA when available (``cuda:LOCAL_RANK``), else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", dist.local_rank)
    return torch.device("cpu")


class Trainer:
    """Holds the model, its DDP/compiled wrapper and the optimizer; applies updates with :meth:`train_step`.

    Args:
        config: the resolved config (``train`` and ``model`` sections are used).
        model: the unwrapped model (its weights are saved; the wrappers only run it).
        device: where it trains.
        dist: data-parallel position; with ``world_size`` > 1 the process group must be initialised.
    """

    def __init__(self, config: Config, model: nn.Module, device: torch.device, dist: Dist | None = None) -> None:
        self.config, self.cfg = config, config.train
        self.dist = dist or Dist()
        self.device = device
        self.model = model.to(device)
        self.optimizer = build_optimizer(self.model, self.cfg)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.step = 0  # updates applied
        self.nonfinite_in_row = 0  # consecutive skipped updates
        self.nonfinite_total = 0  # skipped updates in the whole run
        net: nn.Module = self.model
        if self.dist.enabled:
            ids = [device.index] if device.type == "cuda" else None
            net = nn.parallel.DistributedDataParallel(net, device_ids=ids)
        self.ddp = net if self.dist.enabled else None
        if self.cfg.compile:
            net = torch.compile(net)  # type: ignore[assignment]
        self.net = net
        self.precision, why = resolve_precision(self.cfg.precision, device)
        log.info("precision: %s (%s)", self.precision, why)
        self.autocast_dtype = torch.bfloat16 if self.precision == "bf16" else None
        if self.autocast_dtype is not None and device.type == "cpu" and not cpu_has_native_bf16():
            log.warning(
                "precision: bf16 on a CPU without bf16 instructions (avx512_bf16 / amx_bf16): bf16 matrix products "
                "are emulated and were 10-15x slower than fp32 on such a machine; consider train.precision=fp32"
            )
        if device.type == "cuda":  # TF32 matmuls on Ampere and newer: fp32 master weights, faster products
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast when ``precision: bf16``, else nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def train_step(self, batches: list[Batch]) -> StepResult:
        """Apply one update from ``batches`` (this process's share of it).

        A non-finite loss or gradient norm skips the update (gradients dropped, step not counted) and increments
        :attr:`nonfinite_in_row`; the caller decides when to give up.
        """
        self.model.train()
        pad, eps = self.config.model.pad_id, self.cfg.label_smoothing
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device, non_blocking=True)
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or self.ddp is None else self.ddp.no_sync()
            with sync:
                with self.autocast():
                    logits = self.net(batch.src, batch.tgt_in)  # (B, T, V)
                loss, nll, _ = label_smoothed_nll(logits, batch.tgt_out, eps, pad)
                loss.backward()
            loss_sum += loss.detach().double()
            nll_sum += nll.double()
        n_tgt = sum(b.n_tgt_tokens for b in batches)
        n_src = sum(b.n_src_tokens for b in batches)
        total_loss, total_nll, tokens, src_tokens = all_reduce_sum(
            [loss_sum.item(), nll_sum.item(), float(n_tgt), float(n_src)], self.device
        )
        tokens_i = int(tokens)
        finite = math.isfinite(total_loss) and tokens_i > 0
        grad_norm = None
        if finite:
            scale = self.dist.world_size / tokens  # undo DDP's mean over ranks, divide by all target tokens
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(scale)
            # the norm is measured even without clipping: a finite loss can still have inf/NaN gradients, and one
            # Adam step with them would corrupt every weight (a non-finite norm leaves the weights untouched)
            max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf  # inf: measure, never rescale
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
            finite = math.isfinite(grad_norm)
        result = StepResult(
            loss=total_loss / max(tokens, 1.0),
            nll=total_nll / max(tokens, 1.0),
            tokens=tokens_i,
            src_tokens=int(src_tokens),
            lr=0.0,
            grad_norm=grad_norm,
            skipped=not finite,
        )
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_in_row += 1
            self.nonfinite_total += 1
            return result
        self.nonfinite_in_row = 0
        self.step += 1
        result.lr = learning_rate(self.step, self.cfg, self.config.model.d_model)
        set_learning_rate(self.optimizer, result.lr)
        self.optimizer.step()
        # the fused optimizer writes the weights without bumping their version counters: bump them, so that what is
        # keyed on them (the packed weights of transduce.model.packed.project) sees the new values
        for p in self.params:  # (one tensor per call: a list needs torch 2.5)
            torch.autograd.graph.increment_version(p)
        self.optimizer.zero_grad(set_to_none=True)
        return result

    # ------------------------------------------------------------------------------------------------------------------
    # state (everything but the weights): tensors and plain types, loadable with torch.load(weights_only=True)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule position (the step) and the skip counters."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "nonfinite_in_row": self.nonfinite_in_row,
            "nonfinite_total": self.nonfinite_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Optimizer.load_state_dict takes each group's options from the checkpoint, "fused" and "foreach" included:
        # keep this optimizer's implementation (a checkpoint from before fused Adam would turn it off)
        impl = [{k: g[k] for k in ("fused", "foreach") if k in g} for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, options in zip(self.optimizer.param_groups, impl, strict=True):
            group.update(options)
        self.step = int(state["step"])
        self.nonfinite_in_row = int(state["nonfinite_in_row"])
        self.nonfinite_total = int(state["nonfinite_total"])


def rng_state() -> dict[str, Any]:
    """This process's random number generator states, as tensors and plain types."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
