"""Trees as token sequences for the decoder (Vinyals et al., 2015, "Grammar as a Foreign Language"), and back.

A tree becomes its bracketing read left to right: an opening bracket with its label, ``(NP``; a placeholder ``XX``
for each word (``leaves="xx"``) or the word itself (``leaves="word"``); a closing bracket with its label, ``)NP``
(``closing="labelled"``) or a bare ``)`` (``closing="bare"``). Part-of-speech tags are left out, as in the paper::

    (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))  ->  (S (NP XX XX )NP (VP XX )VP XX )S

That is the top-down order (``order="top-down"``): a constituent's label comes before its words. The in-order
alternative (``order="in-order"``, after Liu and Zhang's in-order transition system, 2017) writes a constituent's
first child first, then its opening bracket, then the other children and the closing bracket, so that the decoder
names a constituent once it has read its first word and attaches what follows afterwards::

    (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))  ->  XX (NP XX )NP (S XX (VP )VP XX )S

:func:`delinearise` maps any token sequence back to a tree over the given words, **always well-formed**: every word
appears exactly once and in order, each under a pre-terminal labelled ``XX``; brackets are balanced. What it had to
mend is reported in a :class:`Repair`.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from transduce.parsing.trees import ROOT_LABEL, Tree

PLACEHOLDER = "XX"  # the leaf token, and the part-of-speech label of the words of a delinearised tree
LEAVES = ("xx", "word")
CLOSINGS = ("labelled", "bare")
ORDERS = ("top-down", "in-order")


def linearise(
    tree: Tree,
    *,
    leaves: str = "xx",
    closing: str = "labelled",
    known: Container[str] | None = None,
    order: str = "top-down",
) -> list[str]:
    """The decoder's tokens for ``tree`` (see the module docstring).

    Args:
        tree: a preprocessed tree (pre-terminals over words).
        leaves: ``"xx"``: ``XX`` for every word; ``"word"``: the word (``XX`` for a word starting with a bracket,
            which would read as one).
        closing: ``"labelled"``: ``)LABEL``; ``"bare"``: ``)``.
        known: with ``leaves="word"``, the words that are written as themselves; any other word is ``XX`` (the
            rare words of the training trees, so that the model learns what to write for a word it never saw).
            ``None``: every word.
        order: ``"top-down"``: a bracket opens before its first child; ``"in-order"``: after it.
    """
    if order not in ORDERS:
        raise ValueError(f"order: {order!r} is not one of {', '.join(ORDERS)}")
    if leaves not in LEAVES:
        raise ValueError(f"leaves: {leaves!r} is not one of {', '.join(LEAVES)}")
    if closing not in CLOSINGS:
        raise ValueError(f"closing: {closing!r} is not one of {', '.join(CLOSINGS)}")
    out: list[str] = []

    def walk(node: Tree | str) -> None:
        if isinstance(node, str) or node.is_preterminal():
            word = node if isinstance(node, str) else node.children[0]
            assert isinstance(word, str)
            as_word = leaves == "word" and not word.startswith(("(", ")")) and (known is None or word in known)
            out.append(word if as_word else PLACEHOLDER)
            return
        first, *rest = node.children
        if order == "in-order":
            walk(first)
        out.append("(" + node.label)
        for child in rest if order == "in-order" else node.children:
            walk(child)
        out.append(")" + node.label if closing == "labelled" else ")")

    walk(tree)
    return out


@dataclass
class Repair:
    """What :func:`delinearise` mended; all zero for a well-formed output."""

    extra_leaves: int = 0  # leaves beyond the number of words, dropped
    missing_leaves: int = 0  # words without a leaf, attached at the end (see delinearise)
    unmatched_closings: int = 0  # closing brackets with no open bracket, dropped
    mismatched_closings: int = 0  # ")NP" closing an open "(VP": closed as the open one
    unclosed: int = 0  # brackets still open at the end, closed there
    empty_constituents: int = 0  # brackets closed without a word inside, dropped
    malformed_tokens: int = 0  # "(" without a label, or a special token, dropped
    empty_openings: int = 0  # in-order: an opening bracket with no constituent before it to take as its first child
    wrapped_root: bool = False  # the output was not one constituent: put under a TOP root
    notes: list[str] = field(default_factory=list)

    @property
    def needed(self) -> bool:
        """True when anything was mended."""
        return bool(
            self.extra_leaves or self.missing_leaves or self.unmatched_closings or self.mismatched_closings
            or self.unclosed or self.empty_constituents or self.malformed_tokens or self.empty_openings
            or self.wrapped_root
        )  # fmt: skip


def delinearise(tokens: list[str] | str, words: list[str], order: str = "top-down") -> tuple[Tree, Repair]:
    """A well-formed tree over ``words`` from decoder tokens, whatever they are.

    Leaves are matched to words one to one, in order: a leaf token (``XX`` or any token that is not a bracket) takes
    the next word; leaves beyond the words are dropped; words left over are attached, in order, at the end of the
    innermost bracket still open at the end, or of the output's one tree when it closed everything. Closing brackets
    close the innermost open bracket, whatever label they carry; one with nothing open is dropped; brackets still
    open at the end are closed. Constituents without words are dropped. When the result is not a single constituent
    over all the words it goes under a ``TOP`` root (which EVALB does not count). In the in-order order an opening
    bracket takes the constituent or leaf just before it (the last one in the innermost open bracket) as its first
    child; one with nothing there opens empty.

    Args:
        tokens: the decoder's tokens, or the same as one space-separated string.
        words: the sentence.
        order: the linearisation's order (:func:`linearise`).

    Returns:
        The tree (pre-terminals labelled ``XX``) and the :class:`Repair` made.
    """
    if order not in ORDERS:
        raise ValueError(f"order: {order!r} is not one of {', '.join(ORDERS)}")
    if isinstance(tokens, str):
        tokens = tokens.split()
    repair = Repair()
    root = Tree(ROOT_LABEL, [])
    stack = [root]
    used = 0
    for token in tokens:
        if token.startswith("("):
            label = token[1:]
            if not label or label.startswith(("(", ")")):
                repair.malformed_tokens += 1
                continue
            node = Tree(label, [])
            if order == "in-order":
                if stack[-1].children:
                    node.children.append(stack[-1].children.pop())
                else:
                    repair.empty_openings += 1
            stack[-1].children.append(node)
            stack.append(node)
        elif token.startswith(")"):
            if len(stack) == 1:
                repair.unmatched_closings += 1
                continue
            label = token[1:]
            if label and label != stack[-1].label:
                repair.mismatched_closings += 1
            _close(stack, repair)
        elif token.startswith("<") and token.endswith(">"):  # <unk>, </s>, ...: not a leaf the model meant
            repair.malformed_tokens += 1
        elif used < len(words):
            stack[-1].children.append(Tree(PLACEHOLDER, [words[used]]))
            used += 1
        else:
            repair.extra_leaves += 1
    if used < len(words):
        repair.missing_leaves = len(words) - used
        host = stack[-1]
        if len(stack) == 1 and len(root.children) == 1 and not root.children[0].is_preterminal():  # type: ignore
            host = root.children[0]  # type: ignore[assignment]  (the output closed its one tree too early)
        host.children.extend(Tree(PLACEHOLDER, [w]) for w in words[used:])
    while len(stack) > 1:
        repair.unclosed += 1
        _close(stack, repair)
    if len(root.children) == 1 and not root.children[0].is_preterminal():  # type: ignore[union-attr]
        tree = root.children[0]
        assert isinstance(tree, Tree)
        return tree, repair
    if words:
        repair.wrapped_root = True
    return root, repair


def _close(stack: list[Tree], repair: Repair) -> None:
    """Pop the innermost open bracket; drop it from its parent when it holds no word."""
    node = stack.pop()
    if not node.children:
        stack[-1].children.pop()
        repair.empty_constituents += 1
