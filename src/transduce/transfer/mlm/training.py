"""What the training loop (:mod:`transduce.training.train`, :class:`transduce.training.trainer.Trainer`) calls for a
masked language model: the loss, the training batches and the validation (masked-LM loss and accuracy; the best
checkpoint is chosen by the loss unless ``train.best_metric`` says accuracy).

The loss is the cross-entropy over the source vocabulary of the original piece at every chosen position and nowhere
else (the model scores only those: :meth:`transduce.transfer.mlm.model.MaskedLM.forward` with ``positions``), summed
(the trainer divides by the chosen positions of the whole update, as it divides a translation loss by its target
tokens); ``train.label_smoothing`` spreads its share as the translation loss does (the mlm config sets 0: BERT's plain
cross-entropy).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from transduce.config import Config
from transduce.data import ParallelDataset
from transduce.training.distributed import Dist
from transduce.training.loss import smoothed_nll_sums
from transduce.training.validate import ValidResult, label_validation
from transduce.transfer.mlm.data import FixedMasking, MaskedBatch, MaskedEpochs, batch_sampler, collate_masked
from transduce.transfer.mlm.masking import Masker


def loss_sums(logits: Tensor, labels: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """``(loss_sum, nll_sum)`` over the chosen positions, as 0-d float32 tensors: the label-smoothed and the plain
    cross-entropy of each position's original piece.

    Shape: logits (N, V) of the chosen positions, labels (N,) their original ids (never ``pad_id``).
    """
    return smoothed_nll_sums(logits, labels, eps, pad_id)


def training_batches(prepared, config: Config, *, rank: int, world_size: int) -> MaskedEpochs:
    """The training split, masked anew every epoch: dataset and sampler in one (:class:`MaskedEpochs`)."""
    dataset = ParallelDataset(prepared, "train")
    return MaskedEpochs(dataset, Masker.for_model(config.model), config.train.max_tokens, seed=config.train.seed,
                        rank=rank, world_size=world_size)  # fmt: skip


def collate(config: Config):
    """The collate function of the model's ids, for :func:`transduce.training.train._batches`."""
    pad, eos = config.model.pad_id, config.model.eos_id
    return lambda texts: collate_masked(texts, pad, eos)


@torch.no_grad()
def validate(model: torch.nn.Module, dataset: ParallelDataset, config: Config, device: torch.device, dist: Dist,
             autocast) -> ValidResult:  # fmt: skip
    """Masked-LM loss, negative log-likelihood and accuracy over the whole split, masked the same way every time
    (:class:`~transduce.transfer.mlm.data.FixedMasking`); every rank a share, combined. ``tokens`` counts the chosen
    positions and ``accuracy`` is the percentage of them whose best-scored piece is the original."""
    model.eval()
    masked = FixedMasking(dataset, Masker.for_model(config.model))
    sampler = batch_sampler(dataset, config.train.max_tokens, seed=0, shuffle=False, rank=dist.rank,
                            world_size=dist.world_size)  # fmt: skip
    make = collate(config)

    def outputs() -> Iterator[tuple[Tensor, Tensor]]:
        for indices in sampler.iter_from(0):
            batch: MaskedBatch = make([masked[i] for i in indices]).to(device)
            with autocast():
                logits = model(batch.src, batch.masked, batch.positions)  # (N, V)
            yield logits, batch.labels

    eps, pad = config.train.label_smoothing, config.model.pad_id
    return label_validation(outputs(), lambda logits, labels: loss_sums(logits, labels, eps, pad), device)


__all__ = ["collate", "loss_sums", "training_batches", "validate"]
