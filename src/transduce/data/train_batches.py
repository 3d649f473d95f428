"""The training split and its batches, as a training run reads them: the prepared pairs (segmented anew every epoch
with BPE-dropout, ``data.bpe_dropout``), with the ``mix`` split mixed into every batch (``data.mix``)."""

from __future__ import annotations

from typing import Any

from transduce.data.binary import MIX_SPLIT, ParallelDataset
from transduce.data.bpe_dropout import BPEDropoutEpochs
from transduce.data.sampler import MixedBatchSampler, TokenBatchSampler


class ConcatPairs:
    """Two datasets as one: indices below ``len(first)`` are ``first``'s, the rest ``second``'s (offset)."""

    def __init__(self, first, second) -> None:
        self.first, self.second, self.offset = first, second, len(first)

    def __len__(self) -> int:
        return self.offset + len(self.second)

    def __getitem__(self, i: int):
        return self.first[i] if i < self.offset else self.second[i - self.offset]


def training_data(
    prepared, max_tokens: int, mix_share: float, *, seed: int, rank: int = 0, world_size: int = 1,
    bpe_dropout: float = 0.0, tokenizer=None, max_len: int = 0,
) -> tuple[ParallelDataset | ConcatPairs, TokenBatchSampler | MixedBatchSampler, TokenBatchSampler]:  # fmt: skip
    """The training split of a prepared directory and its batches: ``(dataset, sampler, main sampler)``.

    With ``mix_share`` > 0 the prepared ``mix`` split (``data.mix``) is mixed into every batch
    (:class:`MixedBatchSampler`; the training pairs' batches get ``max_tokens * (1 - mix_share)``), and the dataset
    covers both; else the sampler is the main one. With ``bpe_dropout`` > 0 the training pairs are segmented anew
    every epoch with ``tokenizer`` (:class:`~transduce.data.bpe_dropout.BPEDropoutEpochs`; the mixed-in pairs keep
    their prepared segmentation; a pair that it makes longer than ``max_len`` pieces keeps its prepared one); the
    main sampler returned is then the one of the prepared segmentation.
    """
    train = ParallelDataset(prepared, "train")
    budget = max(1, int(max_tokens * (1 - mix_share)))
    dataset: ParallelDataset | Any = train
    if bpe_dropout > 0:
        main: Any = BPEDropoutEpochs(train, tokenizer, bpe_dropout, budget, seed=seed, rank=rank,
                                     world_size=world_size, max_len=max_len)  # fmt: skip
        dataset, plain = main.dataset, main.sampler
    else:
        main = plain = TokenBatchSampler(train.src_lengths, train.tgt_lengths, budget, seed=seed, rank=rank,
                                         world_size=world_size)  # fmt: skip
    if mix_share <= 0:
        return dataset, main, plain
    mix = ParallelDataset(prepared, MIX_SPLIT)
    sampler = MixedBatchSampler(main, mix.src_lengths, mix.tgt_lengths, mix_share, offset=len(train), seed=seed)
    return ConcatPairs(dataset, mix), sampler, plain
