"""BERT's masking (Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding", §3.1 "Task #1: Masked LM" and appendix C.2).

Of the real pieces of a text (never padding, bos or eos), :data:`MASK_RATE` (15%) are chosen, at least one where
the text has any: ``floor(0.15 n + u)`` of its ``n`` pieces with ``u`` uniform in [0, 1), so that the expected count
is exactly 15% of every text's length (rounding to the nearest would give an 11-piece text 2 chosen pieces, 18%, and
a 9-piece one 1, 11%), then drawn uniformly without replacement. Each chosen piece is, independently, replaced by the
mask (:data:`MASK_SHARE`, 80%), by a random ordinary piece (:data:`RANDOM_SHARE`, 10%; any id but pad, bos, eos and
unk, drawn uniformly: it may be the piece itself, as in BERT) or kept as it is (the other 10%). The model predicts
the original piece at every chosen position and nowhere else.

The mask is a learned vector (:attr:`transduce.transfer.mlm.model.MaskedLM.mask_embed`), not a vocabulary id, so that an
existing vocabulary needs no new entry; the ids of a masked position are set to ``unk`` (whose embedding the mask
vector replaces), so that no input id gives the answer away.

Every draw comes from the generator it is handed: :class:`Masker` is a pure function of ``(ids, generator)``; the
callers seed one generator per text (:mod:`transduce.transfer.mlm.data`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transduce.config import ModelConfig

MASK_RATE = 0.15  # the share of a text's pieces that are chosen for prediction
MASK_SHARE = 0.8  # of the chosen pieces: replaced by the mask vector
RANDOM_SHARE = 0.1  # of the chosen pieces: replaced by a random ordinary piece; the rest (0.1) are kept


@dataclass(frozen=True)
class MaskedText:
    """One text's masked-LM example.

    Attributes:
        ids: ``(n,)`` the input ids: the text's, with the random pieces in place and ``unk`` where the mask goes.
        masked: ``(m,)`` the positions (sorted) whose input is the mask vector.
        chosen: ``(k,)`` the positions (sorted) whose original piece the model predicts (the masked ones included).
        labels: ``(k,)`` the original ids at ``chosen``.
    """

    ids: np.ndarray
    masked: np.ndarray
    chosen: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class Masker:
    """Chooses and replaces the pieces of a text (see the module docstring).

    Attributes:
        never_chosen: the ids that are never chosen (pad, bos, eos).
        ordinary: the ids a random replacement is drawn from, ascending (every id but pad, bos, eos and unk).
        unk_id: the id written at masked positions.
    """

    never_chosen: tuple[int, ...]
    ordinary: np.ndarray
    unk_id: int

    @classmethod
    def for_model(cls, config: ModelConfig) -> Masker:
        """The masker of a model's source vocabulary and special ids."""
        never = (config.pad_id, config.bos_id, config.eos_id)
        special = np.asarray([*never, config.unk_id])
        ordinary = np.setdiff1d(np.arange(config.src_vocab_size), special)
        if not len(ordinary):
            raise ValueError(f"a vocabulary of {config.src_vocab_size} ids has no ordinary piece to draw")
        return cls(never, ordinary, config.unk_id)

    def __call__(self, ids: np.ndarray, rng: np.random.Generator) -> MaskedText:
        """Mask one text.

        Args:
            ids: ``(n,)`` the text's ids (no bos/eos: the collate adds eos; any special id is left alone).
            rng: the generator of every draw.
        """
        ids = np.asarray(ids, dtype=np.int64)
        real = np.flatnonzero(~np.isin(ids, self.never_chosen))  # the positions that may be chosen
        n = len(real)
        k = min(n, max(1, int(MASK_RATE * n + rng.random()))) if n else 0
        chosen = np.sort(rng.choice(real, size=k, replace=False)) if k else real[:0]
        draw = rng.random(k)
        masked = chosen[draw < MASK_SHARE]
        randomised = chosen[(draw >= MASK_SHARE) & (draw < MASK_SHARE + RANDOM_SHARE)]
        out = ids.copy()
        out[randomised] = self.ordinary[rng.integers(len(self.ordinary), size=len(randomised))]
        out[masked] = self.unk_id
        return MaskedText(out, masked, chosen, ids[chosen])


__all__ = ["MASK_RATE", "MASK_SHARE", "RANDOM_SHARE", "MaskedText", "Masker"]
