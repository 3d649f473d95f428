"""Values passed between the encoder, the decoder and a search: the encoder's memory and the decoder's KV cache.

Both are plain immutable values: re-indexing returns a new object and never changes the one it was called on, so a
search can keep an old cache around (for tests, or to branch) without surprises.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    Attributes:
        self_kv: per decoder layer, the self-attention (k, v) of every position decoded so far, each (B, h, t, d_k).
        cross_kv: per decoder layer, the cross-attention (k, v) of the encoder output, each (B, h, S, d_k); computed
            once per source sentence.
        memory_mask: (B, 1, 1, S) bool source mask, or None.
    """

    self_kv: tuple[KV, ...]
    cross_kv: tuple[KV, ...]
    memory_mask: Tensor | None

    @property
    def length(self) -> int:
        """Number of target positions already in the cache (the next token's position)."""
        return self.self_kv[0][0].shape[2] if self.self_kv else 0

    @property
    def batch_size(self) -> int:
        return self.cross_kv[0][0].shape[0]

    def reorder(self, index: Tensor) -> DecoderCache:
        """Cache for the hypotheses ``index`` (1-D long, rows may repeat): called by beam search after each selection
        with the beam each surviving hypothesis came from."""
        return DecoderCache(
            self_kv=tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in self.self_kv),
            cross_kv=tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in self.cross_kv),
            memory_mask=None if self.memory_mask is None else self.memory_mask.index_select(0, index),
        )

    def reorder_beams(self, index: Tensor) -> DecoderCache:
        """:meth:`reorder` for an ``index`` that only moves rows between the beams of one sentence: only the
        self-attention keys/values move, since the cross-attention ones (and the source mask) are the same for all
        of a sentence's beams (copying them every step was ~30% of beam-search time)."""
        self_kv = tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in self.self_kv)
        return DecoderCache(self_kv, self.cross_kv, self.memory_mask)

    def select(self, index: Tensor) -> DecoderCache:
        """Cache restricted to the rows ``index`` (1-D long): drops finished sentences from the batch. The same
        operation as :meth:`reorder`, named for what the search means by it."""
        return self.reorder(index)
