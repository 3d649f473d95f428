"""Constrained decoding for parsing: at every step only the tokens that can still lead to a well-formed tree over
exactly the sentence's words may come next, so that every output is such a tree and :func:`~transduce.parsing.
linearize.delinearise` has nothing to mend (Vinyals et al., 2015, and most sequence-to-sequence parsers since).

The rules, per hypothesis, with ``n`` the sentence's words, ``depth`` the brackets open, ``leaves`` the leaves so far:

- an opening bracket while ``leaves < n``, inside the root or as the root (one tree, not several);
- a leaf only inside an open bracket and while ``leaves < n``; with word leaves (``data.tree_leaves: word``) only
  the next word's own token, or ``XX`` for a word the target vocabulary does not have, so that the decoder reads
  the sentence's words in order;
- a closing bracket only when the innermost open bracket holds a leaf, with its label (labelled closings), and
  closing the root only once every word has its leaf;
- EOS only when the root is closed over ``n`` leaves;
- nothing that would leave too few tokens before the maximum length to place the remaining leaves and close every
  bracket (``n - leaves + depth`` tokens, one more before the root is opened).

Special tokens (``<unk>``, PAD, BOS) and pieces that are neither brackets nor whole words never come.

:class:`InOrderConstraint` holds the same for the in-order linearisation (``data.tree_order: in-order``), where a
constituent's opening bracket follows its first child: a leaf only inside an open bracket, or as the very first
token; an opening bracket only right after a leaf or a closing bracket (it takes that as its first child); a
closing bracket whenever a bracket is open (the innermost one's label); EOS once one bracket spans every word.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from transduce.parsing.linearize import PLACEHOLDER
from transduce.search.common import NEG_INF

OTHER, OPEN, CLOSE, LEAF = 0, 1, 2, 3


class TreeVocabulary:
    """The target ids by role: opening brackets, closing brackets, leaves, EOS.

    Args:
        pieces: the target vocabulary's pieces, by id (SentencePiece's word-start mark ``▁`` is ignored).
        eos_id: the end-of-sentence id.
        device: where the lookup tensors live.
    """

    def __init__(self, pieces: Sequence[str], eos_id: int, device: torch.device | str = "cpu") -> None:
        kinds, labels = [], []
        names: dict[str, int] = {}
        closing_of: dict[str, int] = {}
        bare: int | None = None
        for i, piece in enumerate(pieces):
            word_start = piece.startswith("▁")
            token = piece.lstrip("▁")
            kind, label = OTHER, ""
            if i == eos_id or not token or (token.startswith("<") and token.endswith(">")):
                pass
            elif token.startswith("(") and len(token) > 1 and not token[1].startswith(("(", ")")):
                kind, label = OPEN, token[1:]
            elif token.startswith(")"):
                kind, label = CLOSE, token[1:]
                if label:
                    closing_of.setdefault(label, i)
                elif bare is None:
                    bare = i
            elif word_start or not any(p.startswith("▁") for p in pieces):
                kind = LEAF
            kinds.append(kind)
            labels.append(names.setdefault(label, len(names)) if kind == OPEN else 0)
        self.labelled = bare is None
        close_for_label = [0] * max(len(names), 1)
        for label, index in names.items():
            found = closing_of.get(label) if self.labelled else bare
            close_for_label[index] = -1 if found is None else found
        for i, kind in enumerate(kinds):  # an opening bracket the vocabulary cannot close is never opened
            if kind == OPEN and close_for_label[labels[i]] < 0:
                kinds[i] = OTHER
        if not any(k == OPEN for k in kinds) or not any(k == LEAF for k in kinds):
            raise ValueError("the target vocabulary has no opening brackets or no leaves: not a parsing model")
        self.eos_id = eos_id
        self.size = len(pieces)
        self.kind = torch.tensor(kinds, dtype=torch.long, device=device)  # (V,)
        self.label = torch.tensor(labels, dtype=torch.long, device=device)  # (V,): an opening bracket's label index
        self.close_for_label = torch.tensor(close_for_label, dtype=torch.long, device=device).clamp(min=0)
        self.leaf_of = {pieces[i].lstrip("▁"): i for i, kind in enumerate(kinds) if kind == LEAF}
        self.open_ids = self.kind.eq(OPEN).nonzero().squeeze(1)
        self.leaf_ids = self.kind.eq(LEAF).nonzero().squeeze(1)
        self.close_ids = self.kind.eq(CLOSE).nonzero().squeeze(1)

    def leaves_for(self, words: Sequence[str]) -> list[int]:
        """The leaf id each word must take: its own token, else ``XX``; -1 (any leaf) where there is neither
        (always, for a vocabulary whose only leaf is ``XX``, which every word takes anyway)."""
        if len(self.leaf_of) <= 1:
            return [-1] * len(words)
        fallback = self.leaf_of.get(PLACEHOLDER, -1)
        return [self.leaf_of.get(word, fallback) for word in words]


class TreeConstraint:
    """A :class:`transduce.search.constraints.SearchConstraint` for linearised trees over ``words[r]`` leaves in row
    ``r`` (see the module docstring).

    Args:
        vocab: the target vocabulary's roles.
        words: (R,) long, the number of words of each row's sentence.
        leaf_seq: (R, N) long, the leaf id each word of the row must take (see :meth:`TreeVocabulary.leaves_for`;
            -1: any leaf); ``None``: any leaf everywhere.

    The state: ``depth``, ``leaves``, ``opened`` (a bracket was produced) per row, and a stack per row of the open
    brackets' labels and whether each holds a leaf yet, (R, capacity), grown when a row gets deeper.
    """

    _STATE = ("words", "leaf_seq", "depth", "leaves", "opened", "labels", "has_leaf")  # per row, follows the beam

    def __init__(self, vocab: TreeVocabulary, words: Tensor, leaf_seq: Tensor | None = None) -> None:
        rows, device = words.shape[0], words.device
        self.vocab = vocab
        self.words = words
        if leaf_seq is None or leaf_seq.shape[1] == 0:
            leaf_seq = torch.full((rows, 1), -1, dtype=torch.long, device=device)
        self.leaf_seq = leaf_seq
        self.depth = torch.zeros(rows, dtype=torch.long, device=device)
        self.leaves = torch.zeros(rows, dtype=torch.long, device=device)
        self.labels = torch.zeros(rows, 8, dtype=torch.long, device=device)
        self._start()

    def _start(self) -> None:
        """The initial state beyond depth, leaves and labels."""
        self.opened = torch.zeros_like(self.depth, dtype=torch.bool)
        self.has_leaf = torch.zeros_like(self.labels, dtype=torch.bool)

    def _new(self, **state: Tensor) -> TreeConstraint:
        out = type(self).__new__(type(self))
        out.vocab = self.vocab
        for name in self._STATE:
            setattr(out, name, state.get(name, getattr(self, name)))
        return out

    def allowed(self, step: int, max_len: Tensor, nxt: Tensor | None = None) -> Tensor:
        """(R, V) bool: the tokens each row may take next, given ``step`` tokens so far and its maximum length
        (``nxt``: :meth:`_next_leaf`, when the caller has it already)."""
        depth, leaves, words = self.depth, self.leaves, self.words
        budget = max_len - step - 1  # tokens that may still follow the next one before the forced EOS
        left = words - leaves
        top = (depth - 1).clamp(min=0)[:, None]
        inside = depth > 0
        top_has_leaf = self.has_leaf.gather(1, top).squeeze(1) & inside
        can_open = (left > 0) & (inside | ~self.opened) & (left + depth + 1 <= budget)
        can_leaf = inside & (left > 0) & (left - 1 + depth <= budget)
        can_close = top_has_leaf & ((depth > 1) | (left == 0)) & (left + depth - 1 <= budget)
        can_eos = ~inside & self.opened & (left == 0)
        return self._fill(can_open, can_leaf, can_close, can_eos, nxt)

    def _fill(
        self, can_open: Tensor, can_leaf: Tensor, can_close: Tensor, can_eos: Tensor, nxt: Tensor | None
    ) -> Tensor:
        """(R, V) bool from what each row may do: open any bracket, place its next leaf, close its innermost bracket
        (with that bracket's label), end."""
        v = self.vocab
        allowed = torch.zeros(can_open.shape[0], v.size, dtype=torch.bool, device=can_open.device)
        allowed[:, v.open_ids] = can_open[:, None]
        nxt = self._next_leaf() if nxt is None else nxt
        forced = nxt >= 0
        allowed[:, v.leaf_ids] = (can_leaf & ~forced)[:, None]
        at = nxt.clamp(min=0)[:, None]  # (a row that is not forced writes its own value back)
        allowed.scatter_(1, at, allowed.gather(1, at) | (can_leaf & forced)[:, None])
        top = (self.depth - 1).clamp(min=0)[:, None]
        closing = v.close_for_label[self.labels.gather(1, top).squeeze(1)]  # (R,): the one closing that fits
        allowed.scatter_(1, closing[:, None], can_close[:, None])
        allowed[:, v.eos_id] = can_eos
        # a row that cannot reach a tree within its length (a maximum length below the words + 2) is left free:
        # delinearise mends its output
        allowed[~allowed.any(dim=1)] = True
        return allowed

    def _pushed_labels(self, tokens: Tensor, is_open: Tensor) -> Tensor:
        """The label stack after ``tokens``: an opening bracket's label in the slot above the row's depth."""
        labels, at = self._grown(self.labels, self.depth, is_open), self.depth[:, None]
        opened = self.vocab.label[tokens.clamp(0, self.vocab.size - 1)]
        labels.scatter_(1, at, torch.where(is_open, opened, labels.gather(1, at).squeeze(1))[:, None])
        return labels

    @staticmethod
    def _grown(table: Tensor, depth: Tensor, deeper: Tensor) -> Tensor:
        """A copy of a per-row stack (R, capacity) with room for one more level where a row gets ``deeper``."""
        if bool((depth + deeper.long() >= table.shape[1]).any()):
            return torch.cat([table, torch.zeros_like(table)], dim=1)
        return table.clone()

    def _next_leaf(self) -> Tensor:
        """(R,) the leaf id the next word must take; -1: any leaf."""
        at = self.leaves.clamp(0, self.leaf_seq.shape[1] - 1)[:, None]
        return self.leaf_seq.gather(1, at).squeeze(1)

    def mask(self, scores: Tensor, step: int, max_len: Tensor) -> Tensor:
        """Set to -inf, in place, what :meth:`allowed` rules out; returns ``scores`` (R, V).

        Where the next leaf is forced to be the next word's token, that token's score becomes the log of the total
        probability of all leaves (the logsumexp of their scores): the model decides between a leaf and a bracket
        by how likely any leaf is, and the word is the input's. Otherwise a model that is unsure which word comes
        next (a rare word) would open brackets instead of placing it."""
        nxt = self._next_leaf()
        allowed = self.allowed(step, max_len, nxt)
        at = nxt.clamp(min=0)[:, None]
        forced = (nxt >= 0) & allowed.gather(1, at).squeeze(1)
        leaf_total = scores[:, self.vocab.leaf_ids].logsumexp(dim=1) if len(self.vocab.leaf_ids) > 1 else None
        scores.masked_fill_(~allowed, NEG_INF)
        if leaf_total is not None:
            scores.scatter_(1, at, torch.where(forced, leaf_total, scores.gather(1, at).squeeze(1))[:, None])
        return scores

    def reorder(self, index: Tensor) -> TreeConstraint:
        """The state of rows ``index`` (R',)."""
        return self._new(**{name: getattr(self, name).index_select(0, index) for name in self._STATE})

    def advance(self, tokens: Tensor) -> TreeConstraint:
        """The state after each row appends ``tokens`` (R,); EOS and other tokens leave a row as it is."""
        kind = self.vocab.kind[tokens.clamp(0, self.vocab.size - 1)]
        # (a closing at depth 0 only reaches here in a beam's dead rows, the -inf candidates that fill it up)
        is_open, is_close, is_leaf = kind.eq(OPEN), kind.eq(CLOSE) & self.depth.gt(0), kind.eq(LEAF)
        labels = self._pushed_labels(tokens, is_open)
        has_leaf = self._grown(self.has_leaf, self.depth, is_open)
        depth = self.depth
        at = depth[:, None]  # an opening bracket's slot
        has_leaf.scatter_(1, at, (has_leaf.gather(1, at).squeeze(1) & ~is_open)[:, None])
        # a leaf marks the innermost open bracket; a closed bracket (it held a leaf) marks its parent
        new_depth = depth + is_open.long() - is_close.long()
        parent = (new_depth - 1).clamp(min=0)[:, None]
        mark = (is_leaf | is_close) & (new_depth > 0)
        has_leaf.scatter_(1, parent, (has_leaf.gather(1, parent).squeeze(1) | mark)[:, None])
        return self._new(
            depth=new_depth, leaves=self.leaves + is_leaf.long(), opened=self.opened | is_open,
            labels=labels, has_leaf=has_leaf,
        )  # fmt: skip

    @classmethod
    def for_rows(
        cls,
        vocab: TreeVocabulary,
        words: Sequence[int],
        device: torch.device | str = "cpu",
        leaves: Sequence[Sequence[int]] | None = None,
    ) -> TreeConstraint:
        """A constraint for rows over sentences of ``words[r]`` words; ``leaves[r]``: the leaf ids of row ``r``'s
        words (:meth:`TreeVocabulary.leaves_for`), or ``None`` for any leaf."""
        counts = torch.tensor(list(words), dtype=torch.long, device=device)
        if leaves is None:
            return cls(vocab, counts)
        seq = torch.full((len(leaves), max([1, *map(len, leaves)])), -1, dtype=torch.long)
        for row, ids in enumerate(leaves):
            seq[row, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        return cls(vocab, counts, seq.to(device))


NONE = 0  # InOrderConstraint.top: nothing at the top level yet


class InOrderConstraint(TreeConstraint):
    """:class:`TreeConstraint` for the in-order linearisation (see the module docstring).

    The state: ``depth``, ``leaves``, ``last`` (the role of the last token: OPEN, CLOSE, LEAF, or OTHER before the
    first), ``top`` (what stands at the top level outside every bracket: NONE, LEAF or, once a bracket there has
    closed, CLOSE) per row, and the stack of the open brackets' labels.
    """

    _STATE = ("words", "leaf_seq", "depth", "leaves", "last", "top", "labels")

    def _start(self) -> None:
        self.last = torch.full_like(self.depth, OTHER)
        self.top = torch.full_like(self.depth, NONE)

    @staticmethod
    def _to_finish(left: Tensor, depth: Tensor, top: Tensor) -> Tensor:
        """The fewest tokens that complete a tree from a state: the remaining leaves inside the innermost bracket and
        a closing per open bracket; at the top level an opening and a closing around the remaining leaves, unless a
        bracket already spans every word."""
        done = (depth == 0) & (top == CLOSE) & (left == 0)
        return torch.where(depth > 0, left + depth, torch.where(done, 0, left + 2))

    def allowed(self, step: int, max_len: Tensor, nxt: Tensor | None = None) -> Tensor:
        depth, left, top = self.depth, self.words - self.leaves, self.top
        budget = max_len - step - 1
        inside = depth > 0
        after_item = (self.last == LEAF) | (self.last == CLOSE)
        leaf_top = torch.where(inside, top, torch.full_like(top, LEAF))
        can_leaf = (left > 0) & (inside | (top == NONE)) & (self._to_finish(left - 1, depth, leaf_top) <= budget)
        can_open = after_item & (self._to_finish(left, depth + 1, top) <= budget)
        close_top = torch.where(depth == 1, torch.full_like(top, CLOSE), top)
        can_close = inside & (self._to_finish(left, depth - 1, close_top) <= budget)
        can_eos = ~inside & (top == CLOSE) & (left == 0)
        return self._fill(can_open, can_leaf, can_close, can_eos, nxt)

    def advance(self, tokens: Tensor) -> InOrderConstraint:
        kind = self.vocab.kind[tokens.clamp(0, self.vocab.size - 1)]
        is_open, is_close, is_leaf = kind.eq(OPEN), kind.eq(CLOSE) & self.depth.gt(0), kind.eq(LEAF)
        labels, depth = self._pushed_labels(tokens, is_open), self.depth
        new_depth = depth + is_open.long() - is_close.long()
        top = torch.where(is_leaf & (depth == 0), LEAF, self.top)
        top = torch.where(is_close & (new_depth == 0), CLOSE, top)
        last = torch.where(is_open | is_close | is_leaf, kind, self.last)
        return self._new(depth=new_depth, leaves=self.leaves + is_leaf.long(), last=last, top=top, labels=labels)
