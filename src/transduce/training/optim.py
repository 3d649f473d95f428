"""The optimizer and the learning-rate schedule of the paper (§5.3).

Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 (AdamW when ``weight_decay`` > 0) and

    lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)              (schedule: noam)

times ``lr_scale``. ``inverse_sqrt`` is the same curve parametrised by its peak (fairseq's form):
``peak_lr · min(step / warmup, sqrt(warmup / step))``; ``cosine`` warms up the same way and then follows half a
cosine from ``peak_lr`` down to ``min_lr`` at ``max_steps``,
``min_lr + (peak_lr - min_lr) · (1 + cos(π · (step - warmup) / (max_steps - warmup))) / 2``, the schedule for a
fixed budget of updates (it ends with small steps, where inverse_sqrt still takes large ones; raising
``max_steps`` when resuming stretches the rest of the curve); ``constant`` is ``peak_lr`` throughout. The schedule
is a pure function of the step, so its whole state is the step number stored in every checkpoint.

With ``decay_by: time`` the cosine also follows the wall-time budget ``max_minutes``: when ``n`` updates have taken
a share ``t`` of the budget, the run's pace so far fits ``n / t`` updates into the whole budget, and the cosine
decays towards ``min(max_steps, n / t)`` instead of ``max_steps``. The rate is then continuous at the end of
warmup and reaches ``min_lr`` when the budget ends, on a machine of any speed; the curve depends on the wall clock,
so such a run is not reproducible to the bit (the time share is carried in the checkpoint and agreed between ranks).
``warmup_by: time`` makes the warmup follow the budget too: it ends at ``warmup_steps`` updates or at the share
``warmup_steps / max_steps`` of ``max_minutes``, whichever comes first (the rate is ``peak_lr`` times the larger of
the two fractions), and the cosine then decays from ``warmup_steps · min(1, (n / t) / max_steps)``, where the pace
puts that share. A machine that fits a third of ``max_steps`` thus warms up for a third of ``warmup_steps`` and keeps
the schedule's shape; with the warmup counted in updates it would spend most of its budget warming up (or all of
it, never decaying).
"""

from __future__ import annotations

import math

import torch

from transduce.config import TrainConfig


def learning_rate(step: int, cfg: TrainConfig, d_model: int, time_share: float = 0.0) -> float:
    """The learning rate of update number ``step`` (1-based: the first update is step 1).

    Args:
        step: the update about to be applied, >= 1.
        cfg: schedule, lr_scale, peak_lr, min_lr, warmup_steps, max_steps, decay_by and warmup_by.
        d_model: the model width (the noam schedule scales with d_model^-0.5).
        time_share: with ``decay_by: time``, the share of ``max_minutes`` the ``step - 1`` updates before this one
            took (0: none measured yet).
    """
    step = max(step, 1)
    warmup = cfg.warmup_steps
    if cfg.schedule == "noam":
        return cfg.lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    if cfg.schedule == "inverse_sqrt":
        return cfg.peak_lr * min(step / warmup, math.sqrt(warmup / step))
    if cfg.schedule == "cosine":
        end = cfg.max_steps
        if cfg.decay_by == "time" and time_share > 0:
            fit = (step - 1) / time_share  # the updates this pace fits into the budget
            if cfg.warmup_by == "time":
                # warm up until warmup_steps updates or the share warmup_steps / max_steps of the time, the first to
                # come (time only grows: the rate rises steadily however noisy the pace); decay from where the
                # pace puts that share
                warm = max(step / warmup, time_share * cfg.max_steps / warmup)
                if warm < 1.0:
                    return cfg.peak_lr * warm
                warmup = min(warmup, warmup * fit / cfg.max_steps)
            end = max(step, min(end, fit))
        if step <= warmup:
            return cfg.peak_lr * step / warmup
        progress = 1.0 if end <= warmup else min(1.0, max(0.0, step - warmup) / (end - warmup))
        return cfg.min_lr + (cfg.peak_lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress)) / 2.0
    return cfg.peak_lr  # constant


def build_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, lr_scales: dict[int, float] | None = None
) -> torch.optim.Optimizer:
    """Adam (the paper) or, with ``weight_decay`` > 0, AdamW with decay on matrices only (not biases, norms).

    The learning rate is set before every update by the trainer from :func:`learning_rate`. Where every parameter
    is a floating-point tensor on the CPU or a CUDA device, the fused implementation updates them all in one operator
    call: the per-tensor loop that PyTorch otherwise uses on the CPU took 13.6 ms per update for the ``tiny``
    model's 133 tensors on one core here, the fused one 3.3 ms.

    ``lr_scales`` (``{id(parameter): multiplier}``: a classifier's or a parser's pretrained encoder at
    ``train.pretrained_lr_scale``) puts those parameters into groups of their own, after the others, whose
    ``lr_scale`` multiplies the schedule's rate (:func:`set_learning_rate`); without it the groups are as they always
    were.
    """
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() yields a tied tensor once
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    scales = lr_scales or {}
    groups = []
    for scale in dict.fromkeys([1.0, *(scales[id(p)] for p in params if id(p) in scales)]):  # first seen, in order
        members = [p for p in params if scales.get(id(p), 1.0) == scale]
        if cfg.weight_decay == 0:
            groups.append({"params": members, "lr_scale": scale})
            continue
        groups.append({"params": [p for p in members if p.dim() >= 2], "weight_decay": cfg.weight_decay,
                       "lr_scale": scale})  # fmt: skip
        groups.append({"params": [p for p in members if p.dim() < 2], "weight_decay": 0.0, "lr_scale": scale})
    groups = [g for g in groups if g["params"] or g["lr_scale"] == 1.0]  # the plain groups even when empty
    if cfg.weight_decay == 0:
        return torch.optim.Adam(groups, lr=0.0, betas=betas, eps=cfg.adam_eps, fused=fused or None)
    return torch.optim.AdamW(groups, lr=0.0, betas=betas, eps=cfg.adam_eps, fused=fused or None)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set ``lr`` on every parameter group, times the group's ``lr_scale`` (see :func:`build_optimizer`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


# ----------------------------------------------------------------------------------------------------------------------
# what a run's schedule makes of its settings, said before it trains


def ignored_settings(cfg: TrainConfig) -> list[str]:
    """One line for each learning-rate setting that ``cfg.schedule`` ignores although it is set away from its default
    (``peak_lr`` under noam, ``lr_scale`` under the others, ``min_lr`` but under cosine, ``warmup_steps`` under
    constant): a value that does nothing is a mistake, as a fine-tuning config's ``peak_lr`` under noam was."""
    default, schedule, lines = TrainConfig(), cfg.schedule, []

    def ignored(key: str, why: str) -> None:
        value = getattr(cfg, key)
        if value != getattr(default, key):
            lines.append(f"train.{key}={value:g} has no effect under train.schedule={schedule}{why}")

    if schedule == "noam":
        ignored("peak_lr", ", whose rate is lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5): set "
                "train.schedule to inverse_sqrt, cosine or constant to train with it, or leave it out")  # fmt: skip
    else:
        ignored("lr_scale", ": it scales the noam schedule only; set train.peak_lr instead, or leave it out")
    if schedule != "cosine":
        ignored("min_lr", ": only cosine decays to it; leave it out")
    if schedule == "constant":
        ignored("warmup_steps", ", which has no warmup; leave it out")
    return lines


def warmup_beyond_run(cfg: TrainConfig, d_model: int) -> str | None:
    """A line when the warmup of ``cfg``'s schedule lasts longer than the run (``max_steps``), naming the rate the
    run ends at; None otherwise (cosine refuses such a config; constant has no warmup)."""
    if cfg.schedule not in ("noam", "inverse_sqrt") or cfg.warmup_steps <= cfg.max_steps:
        return None
    end, peak = learning_rate(cfg.max_steps, cfg, d_model), learning_rate(cfg.warmup_steps, cfg, d_model)
    return (f"train.warmup_steps={cfg.warmup_steps} is longer than the run (train.max_steps={cfg.max_steps}): the "
            f"learning rate only rises, to {end:.1e} at the last update, {100 * end / peak:.1f}% of the {peak:.1e} it "
            f"would reach at update {cfg.warmup_steps}; lower train.warmup_steps (e.g. {max(1, cfg.max_steps // 10)}, "
            "a tenth of max_steps)")  # fmt: skip


def describe_schedule(cfg: TrainConfig, d_model: int) -> str:
    """The schedule of ``cfg`` in words, for the log: its name, its peak and where it reaches it."""
    warmup, peak = cfg.warmup_steps, learning_rate(cfg.warmup_steps, cfg, d_model)
    if cfg.schedule == "noam":
        return (f"noam: rising to {peak:.3g} (lr_scale * d_model^-0.5 * warmup_steps^-0.5) at update {warmup}, "
                "then falling as 1/sqrt(update)")  # fmt: skip
    if cfg.schedule == "constant":
        return f"constant: train.peak_lr={cfg.peak_lr:g} throughout"
    if cfg.schedule == "inverse_sqrt":
        name, then = "inverse_sqrt", "falling as 1/sqrt(update)"
        if cfg.init_from:
            name += " (the default when fine-tuning from train.init_from)"
    else:
        name, then = "cosine", f"half a cosine down to train.min_lr={cfg.min_lr:g} at update {cfg.max_steps}"
        if cfg.decay_by == "time":
            then += " or when train.max_minutes ends"
    at = f"update {warmup}"
    if cfg.schedule == "cosine" and cfg.warmup_by == "time":
        share = cfg.max_minutes * warmup / cfg.max_steps
        at += f" or after {share:.4g} of the {cfg.max_minutes:g} minutes (the first to come)"
    return f"{name}: rising to train.peak_lr={cfg.peak_lr:g} at {at}, then {then}"
