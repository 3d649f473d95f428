"""The baselines: the binarised treebank PCFG with Viterbi CKY, and right-branching trees."""

from __future__ import annotations

import math

import pytest

from transduce.parsing.pcfg import (
    PCFG,
    _binarise,
    _collapse_unaries,
    _debinarise,
    right_branching,
    right_branching_labels,
    signature,
)
from transduce.parsing.trees import parse_trees

TREES = [
    next(parse_trees(text))
    for text in (
        "(S (NP (DT the) (NN dog)) (VP (VBZ sees) (NP (DT a) (JJ big) (JJ red) (NN cat))) (. .))",
        "(S (NP (NNP Kim)) (VP (VBZ sleeps)) (. .))",
        "(S (NP (DT the) (NN cat)) (VP (VBZ sees) (NP (NNP Kim)) (PP (IN with) (NP (DT a) (NN hat)))) (. .))",
        "(SINV (S (VP (VBZ sleeps))) (VP (VBD said)) (NP (NNP Lee)) (. .))",
    )
]


@pytest.mark.parametrize(("markov", "parent"), [(0, False), (1, False), (2, True), (99, True)])
def test_binarisation_and_unary_collapsing_are_undone(markov, parent):
    for tree in TREES:
        binary = _binarise(_collapse_unaries(tree), markov, "ROOT" if parent else None)
        for node in binary.subtrees():
            assert len(node.children) <= 2
            if len(node.children) == 1:  # the only unaries left rewrite a phrase as a tag
                assert isinstance(node.children[0], str) or node.children[0].is_preterminal()
        assert _debinarise(binary) == [tree]


def test_the_treebank_grammar_has_relative_frequency_probabilities():
    g = PCFG.train(TREES, markov=99)
    rules = {}
    for (a, b, c), lp in zip(g.binary.tolist(), g.binary_logp.tolist()):
        rules[(g.symbols[a], g.symbols[b], g.symbols[c])] = lp
    # the three S nodes (the fourth tree's S -> VP is the collapsed S+VP) are all S -> NP @S|NP
    assert rules[("S", "NP", "@S|NP")] == pytest.approx(0.0)
    # four VP nodes: VBZ NP, VBZ @VP|VBZ (for VBZ NP PP), and the unaries VP -> VBZ, VP -> VBD
    assert rules[("VP", "VBZ", "NP")] == pytest.approx(math.log(1 / 4))
    assert rules[("@VP|VBZ", "NP", "PP")] == pytest.approx(0.0)
    assert g.lexicon["sees"][g.index["VBZ"]] == pytest.approx(math.log(2 / 4))


def test_viterbi_parses_the_training_sentences_back_and_unknown_words_by_their_class():
    g = PCFG.train(TREES, markov=99)
    for tree in TREES[:3]:
        assert g.parse(tree.words()) == tree
    parsed = g.parse(["the", "hat", "sees", "Lee", "."])  # hat: a noun once, Lee: an unknown capitalised word
    assert parsed.to_string() == "(S (NP (DT the) (NN hat)) (VP (VBZ sees) (NP (NNP Lee))) (. .))"
    assert g.failures == 0


def test_a_sentence_without_a_parse_gets_a_flat_tree():
    g = PCFG.train(TREES[:1], markov=99)
    tree = g.parse(["dog", "the"])
    assert tree.to_string() == "(S (NN dog) (DT the))" and g.failures == 1


def test_signature():
    assert signature("Corp.") == "UNK-CAP"
    assert signature("1990s") == "UNK-NUM-s"
    assert signature("walking") == "UNK-ing"
    assert signature("long-term") == "UNK-DASH"


def test_right_branching():
    assert right_branching(["a"]).to_string() == "(S (XX a))"
    assert right_branching(["a", "b"]).to_string() == "(S (XX a) (XX b))"
    assert right_branching(list("abcd"), "S", "VP").to_string() == ("(S (XX a) (VP (XX b) (VP (XX c) (XX d))))")
    assert right_branching_labels(TREES) == ("S", "VP")
