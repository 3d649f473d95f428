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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from transduce import fastpaths
from transduce.config import Config
from transduce.data.batch import Batch
from transduce.device import allow_tf32, check_precision, resolve_device
from transduce.training.distributed import Dist, all_reduce_tensor
from transduce.training.loss import smoothed_nll_sums
from transduce.training.optim import build_optimizer, learning_rate, set_learning_rate
from transduce.transfer.classify.training import loss_sums as classification_sums
from transduce.transfer.encoder import lr_scales
from transduce.transfer.mlm.training import loss_sums as masked_lm_sums

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
    overflow: bool = False  # fp16: the scaled gradient overflowed; the loss scale was lowered (not a divergence)
    flags: tuple[float, ...] = ()  # the caller's flags of train_step, summed over ranks


#: fp16: the initial loss scale (it doubles after 2000 updates without an overflow, halves at an overflow).
FP16_INIT_SCALE = 128.0
#: fp16: an overflow while the loss scale is at or above this is the scaler's search for a scale, not a divergence.
MIN_LOSS_SCALE = 1e-4


def cpu_has_native_bf16() -> bool:
    """True when this CPU multiplies bf16 matrices in hardware (x86 avx512_bf16 or AMX; Arm's bf16 feature).

    Without it, oneDNN emulates bf16 and autocast makes CPU training much slower instead of faster.
    """
    return bool(fastpaths.cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


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
    """The training device ``name`` stands for (:func:`transduce.device.resolve_device`; ``auto`` and ``cuda``
    take the GPU of the local rank)."""
    return resolve_device(name, dist.local_rank, where="train.device")


class Trainer:
    """Holds the model, its DDP/compiled wrapper and the optimizer; applies updates with :meth:`train_step`.

    A step waits for the device once: the micro-batches' forward and backward passes are queued without reading
    anything back (padding facts and token counts come from the CPU batches), then one all-reduce carries the loss
    sums, the token counts and the caller's flags, and one read brings them back with the gradient norm.

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
        self.optimizer = build_optimizer(self.model, self.cfg, lr_scales(self.model, config))  # (init_from)
        self.task = config.data.task  # classify: one label per example; mlm: the chosen pieces of each text
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.step = 0  # updates applied
        self.time_share = 0.0  # decay_by time: the share of max_minutes spent, agreed by the ranks (the loop sets it)
        self.nonfinite_in_row = 0  # consecutive skipped updates
        self.nonfinite_total = 0  # skipped updates in the whole run
        net: nn.Module = self.model
        if self.dist.enabled:
            ids = [device.index] if device.type == "cuda" else None
            net = nn.parallel.DistributedDataParallel(net, device_ids=ids)
        self.ddp = net if self.dist.enabled else None
        if self.cfg.compile:
            # batches differ in shape every step: compile for symbolic sizes once rather than once per shape
            net = torch.compile(net, dynamic=True)  # type: ignore[assignment]
        self.net = net
        self.precision, why = resolve_precision(self.cfg.precision, device)
        log.info("precision: %s (%s)", self.precision, why)
        dtype = check_precision(self.precision, "train.precision")
        self.autocast_dtype = None if dtype == torch.float32 else dtype
        # fp16's narrow range: the loss is scaled up before the backward pass and the gradients scaled back, the scale
        # lowered after an overflow and raised after a run of good steps (bf16 has float32's range: no scaling). The
        # loss is a sum over tokens, so a logit's gradient reaches the scale itself: fairseq's initial 128, not
        # PyTorch's 65536, which overflows fp16's 65504 at once
        self.scaler = torch.amp.GradScaler(device.type, init_scale=FP16_INIT_SCALE) if dtype == torch.float16 else None
        # accumulate the step's sums in float64 where the device has it (Apple's mps does not)
        self.sum_dtype = torch.float32 if device.type == "mps" else torch.float64
        if self.autocast_dtype is not None and device.type == "cpu":
            if dtype == torch.bfloat16 and not cpu_has_native_bf16():
                log.warning("precision: bf16 on a CPU without bf16 instructions (avx512_bf16 / amx_bf16): bf16 matrix "
                            "products are emulated and were 10-15x slower than fp32 on such a machine; consider "
                            "train.precision=fp32")  # fmt: skip
            elif dtype == torch.float16:
                log.warning("precision: fp16 on a CPU is for testing: CPUs multiply fp16 slowly; use fp32 or bf16")
        allow_tf32(device)  # TF32 matmuls on Ampere and newer: fp32 master weights, faster products

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16/fp16 autocast when ``precision`` says so, else nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def train_step(
        self, batches: list[Batch], flags: Sequence[float] | Callable[[], Sequence[float]] = ()
    ) -> StepResult:
        """Apply one update from ``batches`` (this process's share of it).

        A non-finite loss or gradient norm skips the update (gradients dropped, step not counted) and increments
        :attr:`nonfinite_in_row`; the caller decides when to give up. Under fp16 a finite loss with an overflowing
        gradient lowers the loss scale instead (``overflow``; not counted while the scale is above
        :data:`MIN_LOSS_SCALE`).

        Args:
            batches: the micro-batches, on the CPU (they are copied to the device here).
            flags: numbers every rank must agree on (a signal received, a time limit reached), summed over ranks in
                the step's one all-reduce and returned in :attr:`StepResult.flags`; a callable is called once the
                micro-batches' work is queued, just before the all-reduce.
        """
        self.model.train()
        pad, eps = self.config.model.pad_id, self.cfg.label_smoothing
        sums = torch.zeros(2, dtype=self.sum_dtype, device=self.device)  # loss, nll
        for i, batch in enumerate(batches):
            padded = batch.n_src_tokens < batch.src.numel()  # from the CPU batch: nothing read from the device
            batch = batch.to(self.device, non_blocking=True)
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or self.ddp is None else self.ddp.no_sync()
            with sync:
                with self.autocast():
                    if self.task == "classify":
                        logits = self.net(batch.src, src_padded=padded)  # (B, classes)
                    elif self.task == "mlm":
                        logits = self.net(batch.src, batch.masked, batch.positions, src_padded=padded)  # (N, V)
                    else:
                        logits = self.net(batch.src, batch.tgt_in, src_padded=padded)  # (B, T, V)
                if self.task == "classify":
                    loss, nll = classification_sums(logits, batch.labels, eps)
                elif self.task == "mlm":
                    loss, nll = masked_lm_sums(logits, batch.labels, eps, pad)
                else:
                    loss, nll = smoothed_nll_sums(logits, batch.tgt_out, eps, pad)
                (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            sums += torch.stack([loss.detach(), nll]).to(self.sum_dtype)
        n_tgt = sum(b.n_tgt_tokens for b in batches)
        n_src = sum(b.n_src_tokens for b in batches)
        flags = flags() if callable(flags) else flags
        counts = torch.tensor([n_tgt, n_src, *flags], dtype=self.sum_dtype).to(self.device, non_blocking=True)
        totals = all_reduce_tensor(torch.cat([sums, counts]))  # loss, nll, tokens, src tokens, flags...
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # (records whether the scaled gradients overflowed)
        # undo DDP's mean over ranks, divide by all target tokens (on the device: the count is not read back)
        scale = (self.dist.world_size / totals[2].clamp(min=1.0)).float()
        if grads:
            torch._foreach_mul_(grads, scale)
        # the norm is measured even without clipping: a finite loss can still have inf/NaN gradients, and one
        # Adam step with them would corrupt every weight (a non-finite norm leaves the weights untouched)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf  # inf: measure, never rescale
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm) if grads else torch.zeros((), device=self.device)
        values = torch.cat([totals, norm.detach().to(self.sum_dtype).reshape(1)]).tolist()  # the step's one read
        total_loss, total_nll, tokens, src_tokens = values[:4]
        reduced_flags, grad_norm = tuple(values[4:-1]), values[-1]
        tokens_i = int(tokens)
        loss_finite = math.isfinite(total_loss) and tokens_i > 0
        finite = loss_finite and math.isfinite(grad_norm)
        result = StepResult(
            loss=total_loss / max(tokens, 1.0),
            nll=total_nll / max(tokens, 1.0),
            tokens=tokens_i,
            src_tokens=int(src_tokens),
            lr=0.0,
            grad_norm=grad_norm if loss_finite else None,
            skipped=not finite,
            flags=reduced_flags,
        )
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler is not None:
                self.scaler.update()  # an overflow halves the scale
                result.overflow = loss_finite and self.scaler.get_scale() >= MIN_LOSS_SCALE
            if not result.overflow:
                self.nonfinite_in_row += 1
                self.nonfinite_total += 1
            return result
        self.nonfinite_in_row = 0
        self.step += 1
        result.lr = learning_rate(self.step, self.cfg, self.config.model.d_model, self.time_share)
        set_learning_rate(self.optimizer, result.lr)
        self.optimizer.step()  # (the gradients are finite: the scaler's own check would read the device again)
        if self.scaler is not None:
            self.scaler.update()
        # the fused optimizer writes the weights without bumping their version counters: bump them, so that what is
        # keyed on them (the packed weights of transduce.model.packed.project) sees the new values
        torch.autograd.graph.increment_version(self.params)
        self.optimizer.zero_grad(set_to_none=True)
        return result

    # ------------------------------------------------------------------------------------------------------------------
    # state (everything but the weights): tensors and plain types, loadable with torch.load(weights_only=True)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule position (the step), the skip counters and (fp16) the loss scaler."""
        state = {
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "nonfinite_in_row": self.nonfinite_in_row,
            "nonfinite_total": self.nonfinite_total,
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], *, source: str = "the checkpoint") -> None:
        """Restore what :meth:`state_dict` returned (from a resumed run, or a pretrained one's with the step reset).

        Adam's per-parameter state (its moments and their update count) comes from ``state``; its hyper-parameters
        (betas, eps, weight decay, the implementation) stay this run's config's, and the learning rate is the
        schedule's, so that a fine-tuning run or a resume's overrides train as configured. The log says what came
        from where (``source``).

        Raises:
            ValueError: the saved optimizer state does not fit this run's trainable parameters.
        """
        self._load_optimizer(state["optimizer"], source)
        self.step = int(state["step"])
        self.nonfinite_in_row = int(state["nonfinite_in_row"])
        self.nonfinite_total = int(state["nonfinite_total"])
        if self.scaler is not None and "scaler" in state:  # (a run switched to fp16 starts with a fresh scale)
            self.scaler.load_state_dict(state["scaler"])

    def _load_optimizer(self, saved: dict[str, Any], source: str) -> None:
        # Optimizer.load_state_dict would take every group option from the saved state (betas, eps, weight decay,
        # "fused"): give it this optimizer's groups and only the saved per-parameter state, matched by parameter
        saved_groups = saved["param_groups"]
        order = _saved_parameter_order(
            self.params, [len(g["params"]) for g in saved_groups], self.optimizer.param_groups
        )
        current = self.optimizer.state_dict()
        index_of = {id(p): i for i, p in enumerate(self.params)}
        current_id = {}  # model parameter index -> id in this optimizer's state dict
        for group, ids in zip(self.optimizer.param_groups, current["param_groups"], strict=True):
            for param, pid in zip(group["params"], ids["params"], strict=True):
                current_id[index_of[id(param)]] = pid
        state = {}
        for saved_id, index in zip((i for g in saved_groups for i in g["params"]), order, strict=True):
            if saved_id in saved["state"]:
                entry, shape = saved["state"][saved_id], tuple(self.params[index].shape)
                if tuple(entry["exp_avg"].shape) != shape:
                    raise ValueError(f"the saved optimizer state's parameter {index} has the shape "
                                     f"{tuple(entry['exp_avg'].shape)}, this run's {shape}")  # fmt: skip
                state[current_id[index]] = entry
        self.optimizer.load_state_dict({"state": state, "param_groups": current["param_groups"]})
        cfg, first = self.cfg, saved_groups[0]
        decay = max(g.get("weight_decay", 0.0) for g in saved_groups)
        ours = f"betas ({cfg.adam_beta1}, {cfg.adam_beta2}), eps {cfg.adam_eps:g}, weight decay {cfg.weight_decay:g}"
        theirs = f"betas {tuple(first['betas'])}, eps {first['eps']:g}, weight decay {decay:g}"
        differ = "" if ours == theirs else f" (the saved state had {theirs.removeprefix('betas ')})"
        log.info("optimizer: Adam's moments of %d tensors from %s; %s from the config%s; the learning rate from the "
                 "schedule", len(state), source, ours, differ)  # fmt: skip


def _saved_parameter_order(
    params: list[nn.Parameter], group_sizes: list[int], groups: list[dict[str, Any]]
) -> list[int]:
    """The index in ``params`` of each parameter of a saved optimizer state, in the state's order: its groups are
    those :func:`transduce.training.optim.build_optimizer` made for the same trainable parameters: one group for Adam;
    for AdamW matrices then the rest; or, as this run's optimizer ``groups`` are, also split by learning-rate scale."""
    if sum(group_sizes) != len(params):
        raise ValueError(f"the saved optimizer state holds {sum(group_sizes)} parameters, this run trains "
                         f"{len(params)}")  # fmt: skip
    if len(group_sizes) == 1:
        return list(range(len(params)))
    index_of = {id(p): i for i, p in enumerate(params)}
    ours = [[index_of[id(p)] for p in group["params"]] for group in groups]
    if group_sizes == [len(g) for g in ours]:
        return [i for g in ours for i in g]
    decay = [i for i, p in enumerate(params) if p.dim() >= 2]
    rest = [i for i, p in enumerate(params) if p.dim() < 2]
    if group_sizes != [len(decay), len(rest)]:
        raise ValueError(f"the saved optimizer state's groups hold {group_sizes} parameters, this run's matrices and "
                         f"others {[len(decay), len(rest)]}")  # fmt: skip
    return decay + rest


def rng_state() -> dict[str, Any]:
    """This process's random number generator states, as tensors and plain types."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this process's device only: another run may see other GPUs
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if isinstance(cuda, list | tuple):  # an older checkpoint held every visible GPU's: take the current one's
            index = torch.cuda.current_device()
            cuda = cuda[index] if index < len(cuda) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)  # the current device's: cuda:LOCAL_RANK (set by distributed.setup)
    if "mps" in state and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])
