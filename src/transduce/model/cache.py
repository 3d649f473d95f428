"""Values passed between the encoder, the decoder and a search: the encoder's memory and the decoder's KV cache.

Both are plain immutable values: re-indexing returns a new object and never changes the one it was called on, so a
search can keep an old cache around (for tests, or to branch) without surprises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from transduce.model.layers import KV


@dataclass(frozen=True)
class Memory:
    """The encoder's output for a batch of source sentences.

    Attributes:
        states: (B, S, d_model) encoder output.
        mask: (B, 1, 1, S) bool, True at real source tokens; None when the batch has no padding.
    """

    states: Tensor
    mask: Tensor | None

    def index_select(self, index: Tensor) -> Memory:
        """Rows ``index`` (1-D long) of the batch, e.g. each sentence repeated ``beam`` times."""
        return Memory(
            self.states.index_select(0, index), None if self.mask is None else self.mask.index_select(0, index)
        )

    def __len__(self) -> int:
        return self.states.shape[0]


@dataclass(frozen=True)
class DecoderCache:
    """Everything the decoder needs to extend a batch of prefixes by more tokens.

    Rows may come in groups that share one source sentence (the beams of a sentence in beam search): row ``r`` reads
    the cross-attention keys/values of sentence ``r // group``, which are stored once per sentence, not once per row,
    and the decoder attends with the queries of a whole group at once.

    Re-indexing rows does not copy the self-attention keys/values: it records the new ``order`` of their rows, and
    the next :meth:`Transformer.decode` gathers them in that order into a new tensor with room for the new
    positions, one copy of the cache per step instead of two (``index_select`` then ``torch.cat``). The keys and
    values of all layers live in one tensor, so that this takes one operation per step, not two per layer.

    Stored by position (``table`` set; what :func:`transduce.model.step.decode_step` makes when transduce's kernels
    run the attention): the keys and values of each position are written once, at the step that computes them,
    into a slab of a storage that grows by doubling, and a (B, t) table says which slab row each batch row reads
    at each position. Re-indexing rows re-indexes the table (B x t ids), and no step copies the cache: copying it
    was 8% of a Multi30k beam search and half of beam search's time at 400 tokens. The storage is shared by the
    caches of one search, each seeing only its first ``length`` positions; decoding twice from one cache (a
    search that branches) copies the storage first, so every cache still means what it meant.

    Attributes:
        self_kv: (layers, 2, B', h, t, d_k): ``self_kv[i]`` is decoder layer i's self-attention keys (``[i, 0]``)
            and values (``[i, 1]``) of every position decoded so far; with ``table``, the storage (layers, 2,
            capacity, slab rows, h, d_k) instead: position p of batch row b is ``self_kv[:, :, p, table[b, p]]``.
        cross_kv: per decoder layer, the cross-attention (k, v) of the encoder output, each (B / group, h, S, d_k);
            computed once per source sentence.
        memory_mask: (B / group, 1, 1, S) bool source mask, or None.
        group: consecutive rows that share one row of ``cross_kv`` and ``memory_mask``.
        order: (B,) long: row ``r`` of the batch is row ``order[r]`` of ``self_kv``; None: the identity (B' = B).
        step_weights: the decoder's weights as :func:`transduce.model.step.decode_step` reads them, gathered at the
            first step of a search and passed on with the cache (None until then).
        table: (B, t) long, for a cache stored by position; None otherwise.
        written: for a cache stored by position, ``[n]``, shared by every cache on the same storage: the positions
            written to it so far (a step writes in place only when its cache has seen them all).
    """

    self_kv: Tensor
    cross_kv: tuple[KV, ...]
    memory_mask: Tensor | None
    group: int = 1
    order: Tensor | None = None
    step_weights: Any = field(default=None, compare=False, repr=False)
    table: Tensor | None = None
    written: list[int] | None = field(default=None, compare=False, repr=False)

    @property
    def length(self) -> int:
        """Number of target positions already in the cache (the next token's position)."""
        return self.self_kv.shape[4] if self.table is None else self.table.shape[1]

    @property
    def batch_size(self) -> int:
        return self.cross_kv[0][0].shape[0] * self.group

    def rows(self) -> Tensor:
        """The self-attention keys/values (layers, 2, B, h, t, d_k) in the batch's row order (a copy when rows
        were re-indexed since the last decoding step, and for a cache stored by position)."""
        if self.table is not None:
            positions = torch.arange(self.length, device=self.table.device)
            kv = self.self_kv[:, :, positions[None, :], self.table]  # (layers, 2, B, t, h, d_k)
            return kv.transpose(3, 4).contiguous()
        return self.self_kv if self.order is None else self.self_kv.index_select(2, self.order)

    def _take(self, index: Tensor) -> Tensor:
        """The ``order`` after taking the batch rows ``index`` (the ``table``'s rows, for a cache stored by
        position)."""
        if self.table is not None:
            return self.table.index_select(0, index)
        return index if self.order is None else self.order.index_select(0, index)

    def _with(self, rows: Tensor, sentences: Tensor | None, group: int) -> DecoderCache:
        """This cache with the self-attention rows ``rows`` (what :meth:`_take` gives: the new ``order``, or the new
        ``table``) and the cross-attention rows ``sentences`` (None: unchanged)."""
        cross_kv, mask = self.cross_kv, self.memory_mask
        if sentences is not None:
            cross_kv = tuple((k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in cross_kv)
            mask = None if mask is None else mask.index_select(0, sentences)
        if self.table is not None:
            return DecoderCache(self.self_kv, cross_kv, mask, group, None, self.step_weights, rows, self.written)
        return DecoderCache(self.self_kv, cross_kv, mask, group, rows, self.step_weights)

    def reorder(self, index: Tensor) -> DecoderCache:
        """Cache for the rows ``index`` (1-D long, rows may repeat, in any order).

        When ``index`` takes whole groups (``group`` consecutive rows of one sentence, in order, as when a search
        drops finished sentences) the result keeps one cross-attention row per sentence; otherwise every row gets its
        own (``group`` becomes 1)."""
        order, g = self._take(index), self.group
        if g == 1:
            return self._with(order, index, 1)
        if index.numel() % g == 0:
            sentences = index[::g].div(g, rounding_mode="floor")
            whole = sentences[:, None] * g + torch.arange(g, device=index.device)
            if torch.equal(whole.view(-1), index):
                return self._with(order, sentences, g)
        return self._with(order, index.div(g, rounding_mode="floor"), 1)

    def reorder_beams(self, index: Tensor) -> DecoderCache:
        """:meth:`reorder` for an ``index`` that only moves rows between the beams of one sentence: the
        cross-attention keys/values (and the source mask) stay, since they are the same for all of a sentence's
        beams (copying them every step was ~30% of beam-search time). Rows must stay in their sentence's group;
        nothing checks it."""
        return self._with(self._take(index), None, self.group)

    def repeat(self, copies: int) -> DecoderCache:
        """Each row ``copies`` times in a row (the beams of a sentence after the first step of beam search); the
        cross-attention keys/values are not copied: the groups grow instead."""
        rows = self.batch_size
        index = torch.arange(rows, device=self.cross_kv[0][0].device).repeat_interleave(copies)
        return self._with(self._take(index), None, self.group * copies)

    def select(self, index: Tensor) -> DecoderCache:
        """Cache restricted to the rows ``index`` (1-D long): drops finished sentences from the batch. The same
        operation as :meth:`reorder`, named for what the search means by it."""
        return self.reorder(index)
