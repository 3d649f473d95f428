"""From raw parallel text to training batches.

- :func:`prepare` (``transduce prepare``): vocabulary + cleaned, binarised corpus in a prepared directory;
- :class:`ParallelDataset`: one split of it, memory-mapped;
- :class:`TokenBatchSampler`: length-grouped batches under a token budget, shuffled per epoch, sharded by rank;
- :func:`collate` -> :class:`Batch`: padded tensors for teacher forcing;
- :func:`padding_stats`: how much of the batches is padding.

Reading raw text line by line (plain or gzip, strict UTF-8 with line numbers) is in :mod:`transduce.text.textio`.

    manifest = prepare(cfg.data, "data/multi30k")
    train = ParallelDataset("data/multi30k", "train")
    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, 4096, seed=1)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collate([train[i] for i in indices]).to(device)
"""

from transduce.data.batch import Batch, collate
from transduce.data.binary import ParallelDataset, read_manifest
from transduce.data.preparation import prepare
from transduce.data.sampler import TokenBatchSampler, padding_stats
from transduce.text.textio import read_lines, read_parallel

__all__ = [
    "Batch",
    "ParallelDataset",
    "TokenBatchSampler",
    "collate",
    "padding_stats",
    "prepare",
    "read_lines",
    "read_manifest",
    "read_parallel",
]
