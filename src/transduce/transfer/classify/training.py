"""What the training loop (:mod:`transduce.training.train`, :class:`transduce.training.trainer.Trainer`) calls for a
classifier: the loss, the training batches and the validation (loss and accuracy; the best checkpoint is chosen by
accuracy).

The loss is the cross-entropy of each example's label, summed over the examples (the trainer divides by the
examples of the whole update, as it divides a translation loss by its target tokens), with ``train.label_smoothing``
spread uniformly over the classes as :func:`torch.nn.functional.cross_entropy` does (the classify configs set 0:
plain cross-entropy).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from transduce.config import Config
from transduce.data import ParallelDataset
from transduce.training.distributed import Dist
from transduce.training.validate import ValidResult, label_validation
from transduce.transfer.classify.data import ClassBatch, batch_sampler, collate_classes


def loss_sums(logits: Tensor, labels: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(loss_sum, nll_sum)`` over the batch: the label-smoothed and the plain cross-entropy, as 0-d float32 tensors.

    Shape: logits (B, C), labels (B,).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, C)
    nll = -logp.gather(1, labels[:, None]).sum()
    if eps == 0:
        return nll, nll.detach()
    uniform = -logp.mean(dim=-1).sum()
    return (1.0 - eps) * nll + eps * uniform, nll.detach()


def training_batches(prepared, config: Config, *, rank: int, world_size: int):
    """``(dataset, sampler)`` of the training split (see :func:`transduce.transfer.classify.data.batch_sampler`)."""
    dataset = ParallelDataset(prepared, "train")
    sampler = batch_sampler(dataset, config.train.max_tokens, cls=config.model.pooling == "cls",
                            seed=config.train.seed, rank=rank, world_size=world_size)  # fmt: skip
    return dataset, sampler


def collate(config: Config):
    """The collate function of the model's ids, for :func:`transduce.training.train._batches`."""
    pad, eos = config.model.pad_id, config.model.eos_id
    return lambda examples: collate_classes(examples, pad, eos)


@torch.no_grad()
def validate(model: torch.nn.Module, dataset: ParallelDataset, config: Config, device: torch.device, dist: Dist,
             autocast) -> ValidResult:  # fmt: skip
    """Loss, negative log-likelihood and accuracy over the whole split (every rank a share, combined)."""
    model.eval()
    sampler = batch_sampler(dataset, config.train.max_tokens, cls=config.model.pooling == "cls", seed=0,
                            shuffle=False, rank=dist.rank, world_size=dist.world_size)  # fmt: skip
    make = collate(config)

    def outputs() -> Iterator[tuple[Tensor, Tensor]]:
        for indices in sampler.iter_from(0):
            batch: ClassBatch = make([dataset[i] for i in indices]).to(device)
            with autocast():
                logits = model(batch.src)  # (B, C)
            yield logits, batch.labels

    eps = config.train.label_smoothing
    return label_validation(outputs(), lambda logits, labels: loss_sums(logits, labels, eps), device)


__all__ = ["collate", "loss_sums", "training_batches", "validate"]
