"""Token-budget batching: pairs of similar length share a batch whose padded size stays under ``max_tokens``.

How batches are made (once, in the constructor):

1. Pairs are sorted by the longer side's length, then target length, then source length, ties broken by a
   permutation drawn from ``seed`` (so different seeds give different batch compositions). Sorting by the longer
   side first keeps padding low on both sides (Multi30k, 4,096 tokens: 4% padding; by target length alone the
   source side had 12%).
2. A greedy pass cuts the sorted list into batches. A batch of ``n`` pairs costs ``n * (max_len + 1)`` tokens per
   side (padding included, +1 for the eos / bos each side gets); both sides must fit ``max_tokens``. A pair that
   alone exceeds the budget gets a batch of its own (and one warning for all such pairs), never a crash.
3. With ``world_size`` ranks, while the number of batches is not divisible by ``world_size`` the batch with the
   most sentences is cut in two (a smaller extra batch); when every batch holds one pair, neighbouring pairs are
   merged instead (over budget, with a warning). So no pair is dropped or repeated: every pair is seen
   exactly once per epoch across all ranks, and every rank gets the same number of batches, as DDP needs.

Each epoch (``set_epoch``) the batches are shuffled from ``(seed, epoch)`` in groups of ``world_size`` neighbours
in length order, and rank ``r`` takes the ``r``-th batch of every group: at any step all ranks hold batches of
similar shape, so none waits long for the others. The order is a pure function of ``(seed, epoch)``, so training
resumes exactly with ``iter_from(epoch, position)`` or ``load_state_dict``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from transduce.errors import DataError

log = logging.getLogger(__name__)


class TokenBatchSampler:
    """Yields lists of pair indices, each a batch within the token budget.

    Args:
        src_lengths, tgt_lengths: lengths of every pair without specials (e.g. ``dataset.src_lengths``).
        max_tokens: budget per side, padding and the one special token per sentence included.
        seed: seeds batch composition and the per-epoch order.
        shuffle: shuffle batches each epoch; ``False`` yields them in length order (validation).
        rank, world_size: data-parallel position; each rank gets ``len(self)`` distinct batches per epoch.
        max_sentences: also cap the sentences per batch; 0: no cap.

    Raises:
        DataError: fewer pairs than ranks (some rank would get no batch).
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        *,
        seed: int,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        max_sentences: int = 0,
    ) -> None:
        src = np.asarray(src_lengths, dtype=np.int64)
        tgt = np.asarray(tgt_lengths, dtype=np.int64)
        if src.shape != tgt.shape or src.ndim != 1:
            raise ValueError(f"src_lengths {src.shape} and tgt_lengths {tgt.shape} must be equal 1-d shapes")
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if 0 < len(src) < world_size:
            raise DataError(f"{len(src)} sentence pairs cannot be shared among {world_size} ranks")
        self.src_lengths, self.tgt_lengths = src, tgt
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.seed, self.shuffle = seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._start = 0  # position at which the next __iter__ starts
        self._position = 0  # batches yielded by the current iteration

        self._order = _length_order(src, tgt, seed if shuffle else None)
        self._bounds = _greedy_bounds(src[self._order] + 1, tgt[self._order] + 1, max_tokens, max_sentences)
        self._bounds = _split_until_divisible(self._bounds, world_size)
        oversized = int(np.count_nonzero(np.maximum(src, tgt) + 1 > max_tokens))
        if oversized:
            log.warning(
                "%d sentence pairs are longer than max_tokens=%d allows; each gets a batch of its own",
                oversized,
                max_tokens,
            )

    # ------------------------------------------------------------------------------------------------------------------

    @property
    def num_batches(self) -> int:
        """Batches per epoch over all ranks."""
        return len(self._bounds) - 1

    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank)."""
        return self.num_batches // self.world_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration follows (from its beginning)."""
        self.epoch, self._start = epoch, 0

    def batch(self, b: int) -> list[int]:
        """Global batch ``b`` (in length order) as a list of pair indices."""
        return self._order[self._bounds[b] : self._bounds[b + 1]].tolist()

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The global batch numbers this rank visits in ``epoch``, in order."""
        b = self.num_batches
        if not self.shuffle:
            return np.arange(self.rank, b, self.world_size)
        groups = np.random.default_rng([self.seed, epoch]).permutation(b // self.world_size)
        return groups * self.world_size + self.rank

    def iter_from(self, epoch: int, position: int = 0) -> Iterator[list[int]]:
        """This rank's batches of ``epoch``, skipping the first ``position`` (a resumed run)."""
        self.epoch = epoch
        self._position = position
        for b in self.epoch_order(epoch)[position:]:
            self._position += 1
            yield self.batch(int(b))

    def __iter__(self) -> Iterator[list[int]]:
        start, self._start = self._start, 0
        return self.iter_from(self.epoch, start)

    def state_dict(self) -> dict[str, Any]:
        """Where this sampler is: the epoch and how many batches of it were yielded.

        With a prefetching ``DataLoader`` the sampler runs ahead of training; store the number of batches the
        trainer consumed instead and resume with ``iter_from(epoch, consumed)``.
        """
        return {
            "epoch": self.epoch,
            "position": self._position,
            "seed": self.seed,
            "world_size": self.world_size,
            "num_batches": self.num_batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``iter(self)`` continues ``state['epoch']`` after ``state['position']`` batches.

        Raises:
            ValueError: the state comes from a sampler with another seed, world size or corpus.
        """
        for key in ("seed", "world_size", "num_batches"):
            if state[key] != getattr(self, key):
                raise ValueError(f"cannot resume batching: {key} was {state[key]}, now {getattr(self, key)}")
        self.epoch, self._start, self._position = state["epoch"], state["position"], state["position"]


def _length_order(src: np.ndarray, tgt: np.ndarray, seed: int | None) -> np.ndarray:
    """Indices sorted by (longer side, target, source length, a seeded random tiebreak, or the index)."""
    n = len(src)
    tiebreak = np.random.default_rng(seed).permutation(n) if seed is not None else np.arange(n)
    base = int(max(src.max(initial=0), tgt.max(initial=0))) + 1
    if base**3 * max(n, 1) < 2**62:  # one int64 key: a single argsort, a quarter of lexsort's memory
        key = (np.maximum(src, tgt) * base + tgt) * base + src
        return np.argsort(key * n + tiebreak, kind="stable")
    return np.lexsort((tiebreak, src, tgt, np.maximum(src, tgt)))  # the last key sorts first


def _greedy_bounds(src_cost: np.ndarray, tgt_cost: np.ndarray, max_tokens: int, max_sentences: int) -> np.ndarray:
    """Batch boundaries over pairs in order: a batch grows while ``n * max(cost) <= max_tokens`` on both sides."""
    bounds = [0]
    n = max_s = max_t = 0
    cap = max_sentences or len(src_cost) + 1
    for i, (s, t) in enumerate(zip(src_cost.tolist(), tgt_cost.tolist())):
        new_s = s if s > max_s else max_s
        new_t = t if t > max_t else max_t
        if n and ((n + 1) * new_s > max_tokens or (n + 1) * new_t > max_tokens or n + 1 > cap):
            bounds.append(i)
            n, new_s, new_t = 0, s, t
        n, max_s, max_t = n + 1, new_s, new_t
    if n:
        bounds.append(len(src_cost))
    return np.asarray(bounds, dtype=np.int64)


def _split_until_divisible(bounds: np.ndarray, world_size: int) -> np.ndarray:
    """Make the batch count divisible by ``world_size`` without an empty batch or a lost pair.

    While the count is not divisible, the batch with most sentences is cut in two. When every batch holds a single
    pair (``max_sentences=1``, or every pair over the budget) nothing can be cut: the shortest neighbouring pairs are
    merged instead, two by two, and those few batches exceed the budget (with a warning).
    """
    bounds = bounds.copy()
    while (len(bounds) - 1) % world_size:
        sizes = np.diff(bounds)
        b = int(np.argmax(sizes))
        if sizes[b] < 2:
            break
        bounds = np.insert(bounds, b + 1, bounds[b] + sizes[b] // 2)
    excess = (len(bounds) - 1) % world_size
    if excess:
        # Every batch is a single pair, so the count is the number of pairs n >= world_size, and 2 * excess <= n:
        # merging batches (0, 1), (2, 3), ... (the shortest pairs, in length order) is always possible.
        bounds = np.delete(bounds, np.arange(1, 2 * excess, 2))
        log.warning(
            "merged %d pair(s) of single-sentence batches (over the batch budget) "
            "so that %d ranks get equal batch counts",
            excess,
            world_size,
        )
    return bounds


def padding_stats(sampler: TokenBatchSampler) -> dict[str, float]:
    """How much of the batches (all ranks, one epoch) is padding.

    Returns:
        ``batches``, ``sentences``; ``src_padding_share``, ``tgt_padding_share`` and ``padding_share`` (both
        sides): padded positions / all positions, specials counted as real tokens; ``max_src_cost``,
        ``max_tgt_cost``: the largest ``n * (max_len + 1)`` of any batch; ``mean_tokens``: mean padded target
        size of a batch.
    """
    bounds = sampler._bounds
    if len(bounds) < 2:
        return {
            "batches": 0,
            "sentences": 0,
            "src_padding_share": 0.0,
            "tgt_padding_share": 0.0,
            "padding_share": 0.0,
            "max_src_cost": 0,
            "max_tgt_cost": 0,
            "mean_tokens": 0.0,
        }
    starts, sizes = bounds[:-1], np.diff(bounds)
    out: dict[str, float] = {"batches": len(sizes), "sentences": int(sizes.sum())}
    real_total = padded_total = 0
    for side, lengths in (("src", sampler.src_lengths), ("tgt", sampler.tgt_lengths)):
        cost = lengths[sampler._order] + 1
        padded = np.maximum.reduceat(cost, starts) * sizes
        real, total = int(cost.sum()), int(padded.sum())
        out[f"{side}_padding_share"] = 1 - real / total
        out[f"max_{side}_cost"] = int(padded.max())
        if side == "tgt":
            out["mean_tokens"] = total / len(sizes)
        real_total += real
        padded_total += total
    out["padding_share"] = 1 - real_total / padded_total
    return out


class MixedBatchSampler:
    """Adds pairs of a second corpus (``data.mix``, e.g. general-domain text against forgetting) to every batch of
    a :class:`TokenBatchSampler`, so that a share ``share`` of the sentences comes from it.

    A batch of ``n`` pairs gets ``k`` pairs of the second corpus, ``k`` the stochastic rounding of
    ``n * share / (1 - share)``: over many batches ``sum(k) / sum(n + k)`` tends to ``share``. They are drawn
    uniformly among its pairs no longer than the batch's longest (the shortest ones when none is), so padding does
    not grow; build ``main`` with ``max_tokens * (1 - share)`` to keep batches within the budget. Indices of the
    second corpus are returned offset by ``offset`` (see :class:`ConcatPairs`). The draw is a pure function of
    ``(seed, epoch, position, rank)``, so resuming is exact.
    """

    def __init__(
        self, main: TokenBatchSampler, src_lengths: np.ndarray, tgt_lengths: np.ndarray, share: float, *,
        offset: int, seed: int,
    ) -> None:  # fmt: skip
        if not 0.0 < share < 1.0:
            raise ValueError(f"share must be in (0, 1), got {share}")
        longest = np.maximum(np.asarray(src_lengths, np.int64), np.asarray(tgt_lengths, np.int64))
        if len(longest) == 0:
            raise DataError("the corpus to mix in (data.mix) has no sentence pairs")
        self.main, self.share, self.offset, self.seed = main, share, offset, seed
        self._order = np.argsort(longest, kind="stable")
        self._sorted = longest[self._order]

    def __len__(self) -> int:
        return len(self.main)

    def _mixed(self, indices: list[int], epoch: int, position: int) -> list[int]:
        rng = np.random.default_rng([self.seed, epoch, position, self.main.rank])
        n = len(indices)
        expected = n * self.share / (1.0 - self.share)
        k = int(expected) + int(rng.random() < expected - int(expected))
        if k == 0:
            return indices
        longest = int(max(max(self.main.src_lengths[i], self.main.tgt_lengths[i]) for i in indices))
        # those that fit (drawn with replacement when they are fewer than k), else the k shortest
        fitting = int(np.searchsorted(self._sorted, longest, side="right")) or min(k, len(self._sorted))
        chosen = self._order[rng.choice(fitting, size=k, replace=k > fitting)]
        return indices + (chosen + self.offset).tolist()

    def iter_from(self, epoch: int, position: int = 0) -> Iterator[list[int]]:
        """This rank's batches of ``epoch`` from ``position`` on, each with its share of the second corpus."""
        for p, indices in enumerate(self.main.iter_from(epoch, position), start=position):
            yield self._mixed(indices, epoch, p)
