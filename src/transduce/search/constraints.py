"""Per-search constraints on the next token beyond the generic ones of :func:`transduce.search.common.constrain`:
an optional object a search consults at every step, for tasks whose outputs must obey a grammar (constituency
parsing: :class:`transduce.parsing.constrained.TreeConstraint`).

A constraint follows the search's rows the way the decoder cache does: the search calls :meth:`mask` on the rows'
next-token scores, then :meth:`reorder` with the index of the row each surviving hypothesis comes from (beam
selection, finished rows dropped, rows repeated into beams) and :meth:`advance` with the tokens appended. Both return
the constraint for the new rows. Translation passes none, and its searches do exactly what they did without one.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class SearchConstraint(Protocol):
    """What a search needs from a constraint: the state of R rows (one per hypothesis)."""

    def mask(self, scores: Tensor, step: int, max_len: Tensor) -> Tensor:
        """Set to -inf (in place) the tokens that may not come next in each row; a constraint may also give a
        token the score of a set of tokens it stands for (parsing's word leaves: the next word gets the total
        probability of all leaves).

        Args:
            scores: (R, V) logits or log-probabilities of the next token, already masked by ``constrain``.
            step: tokens generated so far (the same for every row).
            max_len: (R,) long, the most tokens each row may have before its EOS (EOS is forced at that length).
        Returns:
            ``scores``, modified.
        """
        ...

    def reorder(self, index: Tensor) -> SearchConstraint:
        """The constraint for rows ``index`` (R',) of the current ones (repeated, moved or dropped)."""
        ...

    def advance(self, tokens: Tensor) -> SearchConstraint:
        """The constraint once each row has appended ``tokens`` (R,)."""
        ...
