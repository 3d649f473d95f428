"""Labelled bracketing precision, recall and F1 as EVALB computes them (Sekine and Collins, 1997).

With :data:`COLLINS` (EVALB's standard parameter file ``COLLINS.prm``): words tagged ``,`` ``:`` ``` `` ``` ``''``
``.`` are deleted before spans are counted; brackets labelled ``TOP`` (the root) are not counted, nor brackets left
without words; labels are cut at the first ``-`` or ``=``; ``ADVP`` and ``PRT`` are the same label. Part-of-speech
brackets are not constituents. Each gold bracket matches at most one test bracket (brackets are multisets, so a unary
chain ``(NP (NP ...))`` counts twice). A sentence matches exactly when every bracket matches both ways.

EVALB deletes a word by the tag each tree gives it, and gives up on a sentence whose two trees then differ in length.
A parser that does not tag (the ``XX`` pre-terminals of :func:`~transduce.parsing.linearize.delinearise`) would lose
every sentence with punctuation that way, so here the test tree takes the gold tree's tags, as is usual for such
parsers: the same words are deleted on both sides.

    score = evalb(gold_trees, test_trees)
    print(score.f1, score.exact, score.summary())
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from transduce.errors import DataError
from transduce.parsing.trees import Tree


@dataclass(frozen=True)
class EvalbParams:
    """The parts of an EVALB parameter file that concern labelled bracketing."""

    delete_labels: frozenset[str] = frozenset()  # DELETE_LABEL: brackets not counted, words with these tags deleted
    equal_labels: tuple[tuple[str, str], ...] = ()  # EQ_LABEL pairs
    labelled: bool = True  # LABELED: brackets match by label and span; False: by span alone

    @staticmethod
    def strip(label: str) -> str:
        """EVALB's modify_label: the label cut at its first ``-`` or ``=`` (``-LRB-``-like labels stay whole)."""
        if label.startswith("-"):
            return label
        return label.split("-", 1)[0].split("=", 1)[0]

    def counted(self, label: str) -> bool:
        """Whether brackets with this label are counted (not a DELETE_LABEL once stripped)."""
        return self.strip(label) not in self.delete_labels

    def canonical(self, label: str) -> str:
        """The label as compared: stripped, equal labels mapped to one; ``""`` when unlabelled."""
        if not self.labelled:
            return ""
        label = self.strip(label)
        for a, b in self.equal_labels:
            if label == b:
                return a
        return label


#: EVALB's COLLINS.prm
COLLINS = EvalbParams(
    delete_labels=frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."}),
    equal_labels=(("ADVP", "PRT"),),
)
#: every bracket counted, nothing deleted or merged (for comparison with simpler scorers)
PLAIN = EvalbParams()


def brackets(tree: Tree, tags: Sequence[str] | None = None, params: EvalbParams = COLLINS) -> collections.Counter:
    """The multiset of ``(label, start, end)`` of the constituents of ``tree`` that EVALB counts.

    Args:
        tree: a tree over words (pre-terminals over words).
        tags: the part-of-speech tag of each word that decides its deletion; default: the tree's own.
        params: the parameters.

    Returns:
        A counter of brackets; ``start``/``end`` index the words left after deletion.
    """
    tags = list(tags) if tags is not None else tree.tags()
    out: collections.Counter = collections.Counter()
    position = 0  # words kept so far
    index = 0  # words seen so far

    def walk(node: Tree) -> None:
        nonlocal position, index
        if node.is_preterminal():
            if tags[index] not in params.delete_labels:
                position += 1
            index += 1
            return
        start = position
        for child in node.children:
            if isinstance(child, Tree):
                walk(child)
            else:  # a bare word directly under a phrase counts as a word with no tag
                position += 1
                index += 1
        if position > start and params.counted(node.label):
            out[(params.canonical(node.label), start, position)] += 1

    walk(tree)
    return out


@dataclass
class SentenceScore:
    """The counts of one sentence pair."""

    gold: int  # gold brackets counted
    test: int  # test brackets counted
    matched: int
    words: int  # words left after deletion

    @property
    def exact(self) -> bool:
        return self.gold == self.test == self.matched


def score_tree(gold: Tree, test: Tree, params: EvalbParams = COLLINS, *, gold_tags: bool = True) -> SentenceScore:
    """EVALB's counts for one pair of trees over the same words.

    Args:
        gold: the reference tree (its tags decide which words are punctuation).
        test: the parser's tree.
        params: :data:`COLLINS` or others.
        gold_tags: delete the test tree's words by the gold tags (see the module docstring); ``False`` uses the test
            tree's own tags, as EVALB does, and then a length mismatch raises.

    Raises:
        DataError: the words differ, or (without ``gold_tags``) the lengths after deletion differ.
    """
    gold_words, test_words = gold.words(), test.words()
    if gold_words != test_words:
        raise DataError(f"the test tree's words differ from the gold tree's: {' '.join(test_words[:20])!r} against "
                        f"{' '.join(gold_words[:20])!r}")  # fmt: skip
    tags = gold.tags()
    g = brackets(gold, tags, params)
    t = brackets(test, tags if gold_tags else None, params)
    words = sum(tag not in params.delete_labels for tag in tags)
    if not gold_tags:
        test_len = sum(tag not in params.delete_labels for tag in test.tags())
        if test_len != words:
            raise DataError(f"length unmatch ({words}|{test_len}) after deleting punctuation by each tree's tags")
    return SentenceScore(gold=sum(g.values()), test=sum(t.values()), matched=sum((g & t).values()), words=words)


@dataclass
class Score:
    """Corpus-level labelled bracketing scores (percentages, as EVALB prints them)."""

    sentences: int = 0
    gold: int = 0
    test: int = 0
    matched: int = 0
    exact_sentences: int = 0
    repaired: int = 0  # outputs that :func:`delinearise` had to mend (when known)
    per_sentence: list[SentenceScore] = field(default_factory=list, repr=False)

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test if self.test else 0.0

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def exact(self) -> float:
        """Percentage of sentences whose brackets all match."""
        return 100.0 * self.exact_sentences / self.sentences if self.sentences else 0.0

    @property
    def repaired_share(self) -> float:
        """Percentage of outputs that needed repair."""
        return 100.0 * self.repaired / self.sentences if self.sentences else 0.0

    def to_dict(self) -> dict:
        return {
            "sentences": self.sentences, "precision": round(self.precision, 2), "recall": round(self.recall, 2),
            "f1": round(self.f1, 2), "exact_match": round(self.exact, 2), "gold_brackets": self.gold,
            "test_brackets": self.test, "matched_brackets": self.matched, "repaired": self.repaired,
            "repaired_share": round(self.repaired_share, 2),
        }  # fmt: skip

    def summary(self) -> str:
        """One line: ``F1 .. P .. R .. exact .. (n sentences, k repaired)``."""
        return (f"F1 {self.f1:.2f}  P {self.precision:.2f}  R {self.recall:.2f}  exact {self.exact:.2f}%  "
                f"({self.sentences} sentences, {self.repaired} repaired = {self.repaired_share:.1f}%)")  # fmt: skip


def evalb(
    golds: Iterable[Tree], tests: Iterable[Tree], params: EvalbParams = COLLINS, *, gold_tags: bool = True,
    repaired: Iterable[bool] | None = None,
) -> Score:  # fmt: skip
    """Score a corpus: micro-averaged bracket counts over the sentence pairs (see :func:`score_tree`).

    Args:
        golds, tests: the trees, pair by pair (equal numbers).
        params: the parameters (:data:`COLLINS`).
        gold_tags: delete punctuation by the gold tags on both sides.
        repaired: for each test tree, whether it was repaired (counted into :attr:`Score.repaired`).

    Raises:
        DataError: the numbers of trees differ, or a pair's words differ (naming the sentence).
    """
    golds, tests = list(golds), list(tests)
    if len(golds) != len(tests):
        raise DataError(f"{len(golds)} gold trees but {len(tests)} test trees")
    score = Score()
    for i, (gold, test) in enumerate(zip(golds, tests)):
        try:
            s = score_tree(gold, test, params, gold_tags=gold_tags)
        except DataError as e:
            raise DataError(f"sentence {i + 1}: {e}") from None
        score.per_sentence.append(s)
        score.sentences += 1
        score.gold, score.test, score.matched = score.gold + s.gold, score.test + s.test, score.matched + s.matched
        score.exact_sentences += s.exact
    if repaired is not None:
        score.repaired = sum(bool(r) for r in repaired)
    return score
