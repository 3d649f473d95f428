"""Turning a list of id pairs into padded tensors for teacher forcing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from transduce.text.special import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    """A training batch: batch-first ``torch.long`` tensors, right-padded with the pad id.

    Shape:
        src: ``(B, S)`` source ids + eos, S = longest source + 1.
        tgt_in: ``(B, T)`` bos + target ids: the decoder input.
        tgt_out: ``(B, T)`` target ids + eos: what the decoder must predict at each position.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_src_tokens: int  # real source tokens (eos included, padding not)
    n_tgt_tokens: int  # real target tokens = positions with a loss (eos included, padding not)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on ``device``."""
        return Batch(
            src=self.src.to(device, non_blocking=non_blocking),
            tgt_in=self.tgt_in.to(device, non_blocking=non_blocking),
            tgt_out=self.tgt_out.to(device, non_blocking=non_blocking),
            n_src_tokens=self.n_src_tokens,
            n_tgt_tokens=self.n_tgt_tokens,
        )

    def pin_memory(self) -> Batch:
        """Pinned host copies (``DataLoader(pin_memory=True)`` calls this)."""
        return Batch(
            self.src.pin_memory(),
            self.tgt_in.pin_memory(),
            self.tgt_out.pin_memory(),
            self.n_src_tokens,
            self.n_tgt_tokens,
        )

    def __len__(self) -> int:
        return self.src.shape[0]


def _pad(seqs: Sequence[np.ndarray], pad_id: int, before: int | None, after: int | None) -> tuple[np.ndarray, int]:
    """Right-padded ``(B, max_len + 1)`` array with ``before`` prepended or ``after`` appended; real token count."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    width = int(lengths.max(initial=0)) + 1
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)
    start = 1 if before is not None else 0
    for row, seq in enumerate(seqs):
        out[row, start : start + len(seq)] = seq
    rows = np.arange(len(seqs))
    if before is not None:
        out[:, 0] = before
    else:
        out[rows, lengths] = after
    return out, int(lengths.sum()) + len(seqs)


def collate(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> Batch:
    """Pad a list of ``(src_ids, tgt_ids)`` (no specials) into a :class:`Batch`.

    ``src`` = ids + [eos]; ``tgt_in`` = [bos] + ids; ``tgt_out`` = ids + [eos]; all right-padded with ``pad_id``.

    Args:
        pairs: id sequences (lists or numpy arrays), e.g. ``[dataset[i] for i in batch_indices]``.

    Returns:
        The batch (on the CPU).
    """
    if not pairs:
        raise ValueError("collate: empty batch")
    srcs = [np.asarray(s, dtype=np.int64) for s, _ in pairs]
    tgts = [np.asarray(t, dtype=np.int64) for _, t in pairs]
    src, n_src = _pad(srcs, pad_id, None, eos_id)
    tgt_in, _ = _pad(tgts, pad_id, bos_id, None)
    tgt_out, n_tgt = _pad(tgts, pad_id, None, eos_id)
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), n_src, n_tgt)
