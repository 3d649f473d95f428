"""Baselines for scale: a probabilistic context-free grammar read off the training trees, and right-branching trees.

:class:`PCFG` is the treebank grammar of Charniak (1996) and Johnson (1998): rule probabilities by relative frequency
from the training trees after binarisation, Viterbi (CKY) parsing. The trees are first put into a form CKY handles:

- unary chains between phrases are collapsed into one node (``S -> VP -> ...`` becomes ``S+VP``), so that the only
  unary rules left rewrite a phrase as a single part-of-speech tag (``NP -> PRP``);
- phrases with more than two children are binarised to the right, with ``markov`` previous siblings of horizontal
  context in the intermediate labels (``@NP|DT,JJ``); ``parent`` adds the parent's label to every phrase
  (Johnson's parent annotation, ``NP^S``).

Words seen once in training also count as their word class (capitalised, number, suffix, ...: :func:`signature`);
an unknown word takes the tag probabilities of its class. The parser runs over the whole chart one span length at a
time with tensor operations; parses come back with these transformations undone.

    pcfg = PCFG.train(train_trees, markov=2)
    tree = pcfg.parse("The cat sat .".split())
    right_branching("The cat sat .".split(), ...)
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Sequence

import torch

from transduce.parsing.trees import Tree

log = logging.getLogger(__name__)

UNARY_JOIN = "+"  # joins the labels of a collapsed unary chain
BIN_PREFIX = "@"  # starts the label of a binarisation node
PARENT_SEP = "^"


def signature(word: str) -> str:
    """The class of an unknown word: its shape (capitalised, digits, hyphen) and a telling suffix."""
    parts = ["UNK"]
    if any(c.isdigit() for c in word):
        parts.append("NUM")
    if word[:1].isupper():
        parts.append("CAP")
    elif any(c.isupper() for c in word):
        parts.append("MIXED")
    if "-" in word:
        parts.append("DASH")
    lower = word.lower()
    for suffix in ("ing", "ed", "ly", "ion", "er", "est", "al", "ity", "ive", "ous", "s"):
        if lower.endswith(suffix) and len(lower) > len(suffix) + 2:
            parts.append(suffix)
            break
    return "-".join(parts)


# ----------------------------------------------------------------------------------------------------------------------
# tree transformations


def _collapse_unaries(node: Tree) -> Tree:
    if node.is_preterminal():
        return node
    label, children = node.label, node.children
    while len(children) == 1 and isinstance(children[0], Tree) and not children[0].is_preterminal():
        label, children = label + UNARY_JOIN + children[0].label, children[0].children
    return Tree(label, [_collapse_unaries(c) for c in children if isinstance(c, Tree)])


def _binarise(node: Tree, markov: int, parent: str | None) -> Tree:
    if node.is_preterminal():
        return node
    label = node.label + (PARENT_SEP + parent if parent is not None else "")
    base = node.label.split(UNARY_JOIN)[-1]
    kids = [_binarise(c, markov, base if parent is not None else None) for c in node.children]  # type: ignore[arg-type]
    names = [c.label if c.is_preterminal() else c.label.split(PARENT_SEP)[0] for c in node.children]  # type: ignore
    while len(kids) > 2:  # right-factored: the intermediate node remembers the last `markov` siblings to its left
        # the node made here covers kids[-2:], so its left context is the siblings before them
        first = len(kids) - 2
        context = ",".join(names[max(0, first - markov) : first]) if markov else ""
        inter = Tree(f"{BIN_PREFIX}{node.label}|{context}", kids[-2:])
        kids = [*kids[:-2], inter]
    return Tree(label, kids)


def _debinarise(node: Tree) -> list[Tree]:
    """Undo binarisation, parent annotation and unary collapsing; returns the node's replacement(s)."""
    if node.is_preterminal():
        return [node]
    children: list[Tree | str] = []
    for child in node.children:
        assert isinstance(child, Tree)
        children.extend(_debinarise(child))
    if node.label.startswith(BIN_PREFIX):
        return children  # type: ignore[return-value]
    labels = node.label.split(PARENT_SEP)[0].split(UNARY_JOIN)
    tree = Tree(labels[-1], children)
    for label in reversed(labels[:-1]):
        tree = Tree(label, [tree])
    return [tree]


# ----------------------------------------------------------------------------------------------------------------------
# the grammar


class PCFG:
    """A binarised treebank grammar with a Viterbi CKY parser (see the module docstring)."""

    def __init__(self, markov: int, parent: bool) -> None:
        self.markov, self.parent = markov, parent
        self.symbols: list[str] = []
        self.index: dict[str, int] = {}
        self.tags: set[int] = set()
        self.binary: torch.Tensor = torch.zeros(0, 3, dtype=torch.long)  # (R, 3): parent, left, right
        self.binary_logp = torch.zeros(0)
        self.unary: torch.Tensor = torch.zeros(0, 2, dtype=torch.long)  # (U, 2): parent, tag
        self.unary_logp = torch.zeros(0)
        self.lexicon: dict[str, dict[int, float]] = {}  # word or signature -> {tag: log P(word | tag)}
        self.roots: list[int] = []
        self.failures = 0  # sentences parsed by the fallback (no parse under the grammar)

    def _id(self, label: str) -> int:
        if label not in self.index:
            self.index[label] = len(self.symbols)
            self.symbols.append(label)
        return self.index[label]

    @classmethod
    def train(cls, trees: Sequence[Tree], *, markov: int = 2, parent: bool = False) -> PCFG:
        """Read the grammar off ``trees`` (preprocessed, with part-of-speech tags).

        Args:
            trees: the training trees.
            markov: horizontal Markov order of binarisation (siblings remembered); large: none forgotten.
            parent: annotate phrases with their parent's label.
        """
        g = cls(markov, parent)
        rules: collections.Counter = collections.Counter()
        lhs: collections.Counter = collections.Counter()
        emissions: collections.Counter = collections.Counter()
        tag_count: collections.Counter = collections.Counter()
        word_count = collections.Counter(w for t in trees for w in t.words())
        roots: collections.Counter = collections.Counter()
        for tree in trees:
            root = _binarise(_collapse_unaries(tree), markov, "ROOT" if parent else None)
            roots[root.label] += 1
            for node in root.subtrees():
                if node.is_preterminal():
                    word = node.children[0]
                    assert isinstance(word, str)
                    emissions[(node.label, word)] += 1
                    if word_count[word] == 1:
                        emissions[(node.label, signature(word))] += 1
                    tag_count[node.label] += 1
                    continue
                rules[(node.label, *(c.label for c in node.children))] += 1  # type: ignore[union-attr]
                lhs[node.label] += 1
        for tag in tag_count:
            g.tags.add(g._id(tag))
        binary, unary = [], []
        for rule, n in rules.items():
            ids = [g._id(label) for label in rule]
            (binary if len(ids) == 3 else unary).append((ids, math.log(n / lhs[rule[0]])))
        g.binary = torch.tensor([r for r, _ in binary], dtype=torch.long).reshape(-1, 3)
        g.binary_logp = torch.tensor([p for _, p in binary], dtype=torch.float32)
        g.unary = torch.tensor([r for r, _ in unary], dtype=torch.long).reshape(-1, 2)
        g.unary_logp = torch.tensor([p for _, p in unary], dtype=torch.float32)
        for (tag, word), n in emissions.items():
            g.lexicon.setdefault(word, {})[g.index[tag]] = math.log(n / tag_count[tag])
        g.roots = [g.index[label] for label in roots]
        log.info("PCFG: %d symbols, %d binary and %d unary rules, %d words and classes, from %d trees",
                 len(g.symbols), len(binary), len(unary), len(g.lexicon), len(trees))  # fmt: skip
        return g

    def _tag_scores(self, word: str) -> dict[int, float]:
        if word in self.lexicon:
            return self.lexicon[word]
        sig = signature(word)
        while sig not in self.lexicon and "-" in sig:  # back off to a coarser class
            sig = sig.rsplit("-", 1)[0]
        if sig in self.lexicon:
            return self.lexicon[sig]
        return dict.fromkeys(self.tags, math.log(1e-6))  # a class never seen: any tag

    @torch.no_grad()
    def parse(self, words: Sequence[str]) -> Tree:
        """The Viterbi tree of ``words`` under the grammar (tags included); a flat ``S`` when there is none."""
        n, N = len(words), len(self.symbols)
        neg = float("-inf")
        if n == 0:
            return Tree("S", [])
        chart = torch.full((n + 1, n + 1, N), neg)  # chart[i, j, A]: best log-probability of A over words i..j-1
        back_rule = torch.full((n + 1, n + 1, N), -1, dtype=torch.long)  # binary rule index, or -2 - unary index
        back_split = torch.zeros((n + 1, n + 1, N), dtype=torch.long)
        for i, word in enumerate(words):
            for tag, lp in self._tag_scores(word).items():
                chart[i, i + 1, tag] = lp
            self._unaries(chart, back_rule, i, i + 1)
        parents, lefts, rights = self.binary[:, 0], self.binary[:, 1], self.binary[:, 2]
        rule_ids = torch.arange(len(self.binary))
        for length in range(2, n + 1):
            starts = torch.arange(0, n - length + 1)  # (S,)
            splits = torch.arange(1, length)  # (K,)
            mid = starts[:, None] + splits[None, :]  # (S, K)
            left = chart[starts[:, None], mid]  # (S, K, N)
            right = chart[mid, (starts + length)[:, None]]  # (S, K, N)
            scores = left[:, :, lefts] + right[:, :, rights]  # (S, K, R)
            best, best_k = scores.max(dim=1)  # (S, R)
            best = best + self.binary_logp
            cell = torch.full((len(starts), N), neg).scatter_reduce(1, parents.expand_as(best), best, "amax")
            hit = (best == cell[:, parents]) & torch.isfinite(best)
            rule = torch.full((len(starts), N), -1, dtype=torch.long)
            rule = rule.scatter_reduce(1, parents.expand_as(best), torch.where(hit, rule_ids, -1), "amax")
            chart[starts, starts + length] = cell
            back_rule[starts, starts + length] = rule
            split = best_k.gather(1, rule.clamp(min=0))  # (S, N): the split of the chosen rule
            back_split[starts, starts + length] = starts[:, None] + 1 + split
        top = chart[0, n, self.roots]
        if not torch.isfinite(top.max()):
            self.failures += 1
            return Tree("S", [Tree(self.symbols[max(self._tag_scores(w), key=self._tag_scores(w).get)], [w])
                              for w in words])  # fmt: skip
        root = self.roots[int(top.argmax())]
        tree = self._build(words, back_rule, back_split, 0, n, root)
        (out,) = _debinarise(tree)
        return out

    def _unaries(self, chart: torch.Tensor, back_rule: torch.Tensor, i: int, j: int) -> None:
        """Phrase -> tag rules over the one-word cell (i, j); tags keep their own scores."""
        if not len(self.unary):
            return
        best = chart[i, j, self.unary[:, 1]] + self.unary_logp  # (U,)
        cell = torch.full((chart.shape[2],), float("-inf")).scatter_reduce(0, self.unary[:, 0], best, "amax")
        hit = (best == cell[self.unary[:, 0]]) & torch.isfinite(best)
        ids = torch.where(hit, torch.arange(len(self.unary)), -1)
        rule = torch.full((chart.shape[2],), -1, dtype=torch.long).scatter_reduce(0, self.unary[:, 0], ids, "amax")
        better = cell > chart[i, j]
        chart[i, j] = torch.where(better, cell, chart[i, j])
        back_rule[i, j] = torch.where(better & (rule >= 0), -2 - rule, back_rule[i, j])

    def _build(self, words: Sequence[str], back_rule, back_split, i: int, j: int, symbol: int) -> Tree:
        label = self.symbols[symbol]
        r = int(back_rule[i, j, symbol])
        if j - i == 1 and r < -1:  # phrase -> tag
            tag = int(self.unary[-2 - r, 1])
            return Tree(label, [Tree(self.symbols[tag], [words[i]])])
        if j - i == 1:
            return Tree(label, [words[i]])
        k = int(back_split[i, j, symbol])
        _, left, right = (int(x) for x in self.binary[r])
        return Tree(label, [self._build(words, back_rule, back_split, i, k, left),
                            self._build(words, back_rule, back_split, k, j, right)])  # fmt: skip


def right_branching(words: Sequence[str], root_label: str = "S", label: str = "VP") -> Tree:
    """The right-branching tree: every constituent runs from a word to the end of the sentence.

    ``(S w1 (VP w2 (VP w3 w4)))`` with pre-terminals ``XX``; ``root_label`` and ``label`` name the brackets (the
    most frequent root label and label of sentence-final constituents in training, for a labelled score).
    """
    leaves = [Tree("XX", [w]) for w in words]
    if len(leaves) <= 2:
        return Tree(root_label, list(leaves))
    node = Tree(label, leaves[-2:])
    for leaf in reversed(leaves[1:-2]):
        node = Tree(label, [leaf, node])
    return Tree(root_label, [leaves[0], node])


def right_branching_labels(trees: Sequence[Tree]) -> tuple[str, str]:
    """The most frequent root label and the most frequent label of the other constituents that end a sentence."""
    roots = collections.Counter(t.label for t in trees)
    finals: collections.Counter = collections.Counter()
    for tree in trees:
        node = tree
        while not node.is_preterminal():
            last = node.children[-1]
            if not isinstance(last, Tree) or last.is_preterminal():
                break
            finals[last.label] += 1
            node = last
    return roots.most_common(1)[0][0], (finals.most_common(1) or [("VP", 0)])[0][0]
