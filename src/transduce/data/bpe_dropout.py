"""BPE-dropout (Provilkov et al., 2020): the training pairs segmented anew every epoch (``data.bpe_dropout``).

A BPE vocabulary segments every word one way, so a model never sees how a word it knows is built from smaller
pieces. BPE-dropout segments training text with the vocabulary's own merges, but at every merge step each possible
merge is left out with probability ``p``: a word comes in a different, usually finer segmentation from epoch to
epoch. Translation and validation segment deterministically, as always.

- :class:`BPEDropout` segments text with a SentencePiece BPE model: with ``p = 0`` exactly as SentencePiece does
  (tested), with ``p > 0`` the paper's algorithm, drawing from a NumPy generator (SentencePiece's own sampling
  cannot be seeded reproducibly across processes, and it drops a merge for good once drawn, not for one step);
- :class:`BPEDropoutEpochs` is the training split's dataset and batch sampler in one, since an epoch's batches
  depend on that epoch's lengths: every pair's text is decoded once from the prepared ids (SentencePiece decoding is
  lossless), segmented anew when an epoch starts, and batched under the token budget as the prepared lengths are
  (:class:`~transduce.data.sampler.TokenBatchSampler`). A source's target-language token (``>>ces<<``,
  :mod:`transduce.text.langs`) is one piece put before the text by id, not text: it is kept out of the
  segmentation and put back in front of every epoch's pieces.

An epoch's segmentation is a pure function of ``(seed, epoch)``, the same on every rank, so that resuming is exact
and data-parallel ranks agree on the batches. It stays within ``data.max_len`` (the limit the prepared pairs were
cleaned by, and what a learned position table is sized for): a pair that dropout makes longer keeps its prepared
segmentation in that epoch, and the epoch's log line counts them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence

import numpy as np
import sentencepiece as spm

from transduce.data.binary import ParallelDataset
from transduce.data.sampler import TokenBatchSampler
from transduce.errors import DataError
from transduce.text.spm_proto import model_type
from transduce.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class BPEDropout:
    """Segments text with a SentencePiece BPE model, each possible merge left out with probability ``p`` at every
    merge step (BPE-dropout; ``p = 0`` is SentencePiece's own segmentation).

    Words are segmented one by one (SentencePiece's BPE never merges across a word boundary): ``▁`` + the word's
    characters, then, until no merge is left, the adjacent pair whose concatenation is the best-scored piece among
    those not dropped at this step is merged (the leftmost of equal ones). A word with a character outside the
    vocabulary is left to SentencePiece (byte fallback), deterministically.

    Args:
        proto: a serialised SentencePiece BPE model.
    """

    def __init__(self, proto: bytes) -> None:
        self.proc = spm.SentencePieceProcessor(model_proto=proto)
        self.ids: dict[str, int] = {}
        self.scores: dict[str, float] = {}
        for i in range(self.proc.get_piece_size()):
            if self.proc.is_control(i) or self.proc.is_unknown(i) or self.proc.is_byte(i) or self.proc.is_unused(i):
                continue
            piece = self.proc.id_to_piece(i)
            self.ids[piece], self.scores[piece] = i, self.proc.get_score(i)

    def encode(self, texts: Sequence[str], p: float, rng: np.random.Generator) -> list[list[int]]:
        """The ids of every text (normalised already, e.g. decoded from ids), segmented with BPE-dropout ``p``."""
        ids, scores = self.ids, self.scores
        draws = _Uniforms(rng)
        out = []
        for text in texts:
            sentence: list[int] = []
            for word in text.split():
                symbols = ["\u2581", *word]
                if not all(c in ids for c in word):
                    sentence += self.proc.encode(word)
                    continue
                while len(symbols) > 1:
                    best, at = -math.inf, -1
                    for i in range(len(symbols) - 1):
                        score = scores.get(symbols[i] + symbols[i + 1])
                        # only a merge that would win needs its draw: the best one kept wins either way
                        if score is not None and score > best and (p == 0.0 or draws.next() >= p):
                            best, at = score, i
                    if at < 0:
                        break
                    symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
                sentence += [ids[s] for s in symbols]
            out.append(sentence)
        return out


class _Uniforms:
    """Uniform draws in [0, 1) from ``rng``, handed out one by one from blocks (faster than one call each)."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 16) -> None:
        self.rng, self.block = rng, block
        self._it = iter(())

    def next(self) -> float:
        try:
            return next(self._it)
        except StopIteration:
            self._it = iter(self.rng.random(self.block).tolist())
            return next(self._it)


def _leading(ids: np.ndarray, lang_ids: set[int]) -> list[int]:
    """The target-language token ids at the start of a source (``[]`` for none)."""
    n = 0
    while n < len(ids) and int(ids[n]) in lang_ids:
        n += 1
    return [int(i) for i in ids[:n]]


class SegmentedPairs:
    """The pairs of one segmentation: ``self[i] -> (src_ids, tgt_ids)``, like a :class:`ParallelDataset`."""

    def __init__(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pairs[i]


class BPEDropoutEpochs:
    """Batches of the training split, segmented with BPE-dropout ``dropout`` anew for every epoch.

    A batch sampler (``iter_from(epoch, position)``, ``len``, ``rank``, the lengths) whose :attr:`dataset` holds
    the pairs in the segmentation of the epoch last entered (the prepared one before any): entering ``epoch``
    segments it and batches it as a :class:`~transduce.data.sampler.TokenBatchSampler` would over its lengths.

    Args:
        dataset: the prepared training split.
        tokenizer: its vocabulary; each side must be a SentencePiece BPE model.
        dropout: the probability of skipping a merge, in (0, 1).
        max_tokens, seed, rank, world_size: as for :class:`~transduce.data.sampler.TokenBatchSampler`.
        max_len: the most pieces a side may have (``data.max_len``); a pair that dropout makes longer keeps its
            prepared segmentation. 0: no limit.

    Raises:
        DataError: the vocabulary is not BPE.
    """

    def __init__(
        self, dataset: ParallelDataset, tokenizer: Tokenizer, dropout: float, max_tokens: int, *, seed: int,
        rank: int = 0, world_size: int = 1, max_len: int = 0,
    ) -> None:  # fmt: skip
        if not 0.0 < dropout < 1.0:
            raise ValueError(f"dropout must be in (0, 1), got {dropout}")
        if not isinstance(tokenizer, Tokenizer):
            raise DataError(f"data.bpe_dropout: needs a SentencePiece BPE vocabulary (data.vocab_type: bpe), not "
                            f"{type(tokenizer).__name__}")  # fmt: skip
        src_proto, tgt_proto = tokenizer.model_protos()
        for side, proto in (("source", src_proto), ("target", tgt_proto)):
            kind = model_type(proto)
            if kind != "bpe":
                raise DataError(f"data.bpe_dropout: the {side} vocabulary is a SentencePiece {kind} model; "
                                "BPE-dropout needs a BPE one (data.vocab_type: bpe)")  # fmt: skip
        self.src_bpe = BPEDropout(src_proto)
        self.tgt_bpe = self.src_bpe if tgt_proto == src_proto else BPEDropout(tgt_proto)
        self.dropout, self.max_len = dropout, max_len
        self.prepared = dataset  # a too-long pair's segmentation
        self.max_tokens, self.seed, self.rank, self.world_size = max_tokens, seed, rank, world_size
        self.dataset = SegmentedPairs([dataset[i] for i in range(len(dataset))])
        lang_ids = set(tokenizer.lang_tokens().values())
        self.src_prefix = [_leading(src, lang_ids) for src, _ in self.dataset.pairs]  # a language token, or []
        self.src_text = [tokenizer.decode_src(src[len(pre) :]) for (src, _), pre in zip(self.dataset.pairs,
                                                                                       self.src_prefix)]  # fmt: skip
        self.tgt_text = [tokenizer.decode_tgt(tgt) for _, tgt in self.dataset.pairs]
        self.prepared_pieces = int(dataset.src_lengths.sum()) + int(dataset.tgt_lengths.sum())
        self.epoch: int | None = None  # the epoch whose segmentation self.dataset holds; None: the prepared one
        self._sampler = self._batches(dataset.src_lengths, dataset.tgt_lengths)

    def _batches(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> TokenBatchSampler:
        return TokenBatchSampler(src_lengths, tgt_lengths, self.max_tokens, seed=self.seed, rank=self.rank,
                                 world_size=self.world_size)  # fmt: skip

    def segment(self, epoch: int) -> tuple[list[list[int]], list[list[int]]]:
        """The source and target ids of every pair in ``epoch``'s segmentation (the same on every call)."""
        return self._segment(epoch)[:2]

    def _segment(self, epoch: int) -> tuple[list[list[int]], list[list[int]], int]:
        """:meth:`segment`, and how many pairs kept their prepared segmentation (dropout made them too long)."""
        rng = np.random.default_rng([self.seed, epoch])
        src = [pre + ids for pre, ids in zip(self.src_prefix, self.src_bpe.encode(self.src_text, self.dropout, rng))]
        tgt = self.tgt_bpe.encode(self.tgt_text, self.dropout, rng)
        too_long = 0
        if self.max_len:
            for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
                if len(s) > self.max_len or len(t) > self.max_len:
                    prepared = self.prepared[i]
                    src[i], tgt[i] = prepared[0].tolist(), prepared[1].tolist()
                    too_long += 1
        return src, tgt, too_long

    def _enter(self, epoch: int) -> None:
        if epoch == self.epoch:
            return
        src, tgt, too_long = self._segment(epoch)
        self.dataset.pairs = [(np.asarray(s, np.int64), np.asarray(t, np.int64)) for s, t in zip(src, tgt, strict=True)]
        src_lengths = np.fromiter(map(len, src), np.int64, len(src))
        tgt_lengths = np.fromiter(map(len, tgt), np.int64, len(tgt))
        self._sampler = self._batches(src_lengths, tgt_lengths)
        self.epoch = epoch
        more = (src_lengths.sum() + tgt_lengths.sum()) / max(1, self.prepared_pieces) - 1
        if self.rank == 0:  # (every rank segments the same way)
            kept = (f"; {too_long} pairs it made longer than data.max_len={self.max_len} keep their prepared "
                    "segmentation") if too_long else ""  # fmt: skip
            log.info("epoch %d: BPE-dropout %g segments the training pairs into %.1f%% more pieces, %d batches%s",
                     epoch, self.dropout, 100 * more, self._sampler.num_batches, kept)  # fmt: skip

    def iter_from(self, epoch: int, position: int = 0) -> Iterator[list[int]]:
        """This rank's batches of ``epoch`` (segmented for it), skipping the first ``position``."""
        self._enter(epoch)
        return self._sampler.iter_from(epoch, position)

    def __len__(self) -> int:
        """Batches per epoch for this rank, in the current segmentation."""
        return len(self._sampler)

    @property
    def sampler(self) -> TokenBatchSampler:
        """The batches of the current segmentation."""
        return self._sampler

    @property
    def src_lengths(self) -> np.ndarray:
        return self._sampler.src_lengths

    @property
    def tgt_lengths(self) -> np.ndarray:
        return self._sampler.tgt_lengths
