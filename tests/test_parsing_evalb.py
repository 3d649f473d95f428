"""The EVALB scorer: hand-computed COLLINS.prm cases, and agreement with PYEVALB (an independent implementation)."""

from __future__ import annotations

import random
import sys
import types
from pathlib import Path

import pytest

from transduce.errors import DataError
from transduce.parsing.evalb import COLLINS, PLAIN, EvalbParams, brackets, evalb, score_tree
from transduce.parsing.linearize import delinearise, linearise
from transduce.parsing.pcfg import right_branching
from transduce.parsing.trees import Tree, parse_trees, read_treebank

PTB = Path(__file__).parents[2] / "shared" / "data" / "ptb_sample" / "wsj_0001-0169.mrg.tar.gz"


def tree(text: str) -> Tree:
    return next(parse_trees(text))


GOLD = tree("(S (NP (DT The) (NN cat)) (VP (VBD sat) (ADVP (RB down))) (. .))")


def test_punctuation_deleted_advp_equals_prt_part_of_speech_not_counted():
    test = tree("(S (NP (XX The)) (VP (XX cat) (XX sat) (PRT (XX down))) (XX .))")
    # after deleting "." (by the gold tag): gold S(0,4) NP(0,2) VP(2,4) ADVP(3,4); test S(0,4) NP(0,1) VP(1,4)
    # PRT(3,4) = ADVP(3,4): S and ADVP match
    assert brackets(GOLD) == {("S", 0, 4): 1, ("NP", 0, 2): 1, ("VP", 2, 4): 1, ("ADVP", 3, 4): 1}
    s = score_tree(GOLD, test)
    assert (s.gold, s.test, s.matched, s.words, s.exact) == (4, 4, 2, 4, False)
    score = evalb([GOLD], [test])
    assert (score.precision, score.recall, score.f1, score.exact) == (50.0, 50.0, 50.0, 0.0)


def test_without_the_collins_parameters_everything_counts():
    test = tree("(S (NP (XX The)) (VP (XX cat) (XX sat) (PRT (XX down))) (XX .))")
    s = score_tree(GOLD, test, PLAIN)
    assert (s.gold, s.test, s.matched, s.words) == (4, 4, 1, 5)  # S(0,5) only; PRT is not ADVP


def test_top_brackets_and_brackets_over_punctuation_alone_are_not_counted():
    gold = tree("(S (NP (NN x)) (PRN (, ,) (: --)) (VP (VBZ y)) (. .))")
    test = tree("(TOP (S (NP (XX x)) (XX ,) (XX --) (VP (XX y)) (XX .)))")
    s = score_tree(gold, test)
    assert (s.gold, s.test, s.matched, s.exact) == (3, 3, 3, True)  # PRN spans no word; TOP is the root


def test_brackets_are_multisets():
    gold = tree("(S (NP (NP (NN x))) (VP (VBZ y)))")
    test = tree("(S (NP (XX x)) (VP (XX y)))")
    s = score_tree(gold, test)
    assert (s.gold, s.test, s.matched) == (4, 3, 3)
    s = score_tree(test, tree("(S (NP (NP (XX x))) (VP (XX y)))"))
    assert (s.gold, s.test, s.matched) == (3, 4, 3)


def test_function_tags_are_cut_and_unlabelled_scoring_ignores_labels():
    gold = tree("(S (NP-SBJ (NN x)) (VP (VBZ y)))")
    test = tree("(S (NP (XX x)) (NP (XX y)))")
    assert score_tree(gold, test).matched == 2
    unlabelled = EvalbParams(delete_labels=COLLINS.delete_labels, labelled=False)
    assert score_tree(gold, test, unlabelled).matched == 3


def test_corpus_scores_are_micro_averages_with_exact_match_and_repairs():
    golds = [tree("(S (NP (NN a)) (VP (VBZ b)))"), tree("(S (NP (NN c) (NN d)) (VP (VBZ e)))")]
    tests = [tree("(S (NP (XX a)) (VP (XX b)))"), tree("(S (XX c) (VP (XX d) (XX e)))")]
    score = evalb(golds, tests, repaired=[False, True])
    assert (score.gold, score.test, score.matched, score.exact_sentences) == (6, 5, 4, 1)
    assert score.precision == pytest.approx(80.0) and score.recall == pytest.approx(400 / 6)
    assert score.f1 == pytest.approx(2 * 80 * (400 / 6) / (80 + 400 / 6))
    assert (score.exact, score.repaired, score.repaired_share) == (50.0, 1, 50.0)


def test_errors_name_the_sentence():
    with pytest.raises(DataError, match="2 gold trees but 1 test trees"):
        evalb([GOLD, GOLD], [GOLD])
    with pytest.raises(DataError, match="^sentence 1: the test tree's words differ"):
        evalb([GOLD], [tree("(S (XX The) (XX dog) (XX sat) (XX down) (XX .))")])
    with pytest.raises(DataError, match=r"length unmatch \(4\|5\)"):
        score_tree(GOLD, tree("(S (XX The) (XX cat) (XX sat) (XX down) (XX .))"), gold_tags=False)


# ----------------------------------------------------------------------------------------------------------------------
# PYEVALB


def _pyevalb():
    sys.modules.setdefault("pytablewriter", types.ModuleType("pytablewriter"))  # only its table writer needs it
    return pytest.importorskip("PYEVALB.scorer"), pytest.importorskip("PYEVALB.parser")


def _has_duplicates(t: Tree) -> bool:
    return any(n > 1 for n in brackets(t, params=PLAIN).values())


def _corrupt(gold: Tree, rng: random.Random) -> Tree:
    """A test tree: the gold linearisation with random tokens dropped, duplicated or moved, then repaired."""
    tokens = linearise(gold)
    for _ in range(rng.randint(0, 6)):
        i = rng.randrange(len(tokens))
        action = rng.random()
        if action < 0.4:
            del tokens[i]
        elif action < 0.7:
            tokens.insert(rng.randrange(len(tokens) + 1), tokens[i])
        else:
            tokens.insert(rng.randrange(len(tokens) + 1), tokens.pop(i))
        if not tokens:
            break
    return delinearise(tokens, gold.words())[0]


def _compare_with_pyevalb(golds: list[Tree], rng: random.Random) -> int:
    """Score (gold, test) pairs with PLAIN parameters here and with PYEVALB (which counts every bracket, the root
    included, matches them as sets and deletes nothing); pairs with duplicate brackets are left out."""
    scorer_mod, parser_mod = _pyevalb()
    scorer = scorer_mod.Scorer()
    compared = 0
    for gold in golds:
        for test in (_corrupt(gold, rng), right_branching(gold.words())):
            if _has_duplicates(gold) or _has_duplicates(test):
                continue
            ours = score_tree(gold, test, PLAIN)
            ref = scorer.score_trees(parser_mod.create_from_bracket_string(gold.to_string()),
                                     parser_mod.create_from_bracket_string(test.to_string()))  # fmt: skip
            assert (ours.gold, ours.test, ours.matched) == (
                ref.gold_brackets,
                ref.test_brackets,
                ref.matched_brackets,
            ), (gold.to_string(), test.to_string())
            compared += 1
    return compared


def test_plain_scores_equal_pyevalb_on_hand_written_trees():
    golds = [
        GOLD,
        tree("(S (NP (NNP John)) (VP (VBD saw) (NP (DT the) (NN man)) (PP (IN with) (NP (DT a) (NN telescope)))))"),
        tree("(SINV (VP (VBD said)) (NP (NNP Mr.) (NNP Smith)) (. .))"),
        tree("(S (S (NP (PRP It)) (VP (VBD rained))) (, ,) (CC and) (S (NP (PRP we)) (VP (VBD left))) (. .))"),
    ]
    assert _compare_with_pyevalb(golds * 10, random.Random(1)) >= 60


@pytest.mark.shared
def test_plain_scores_equal_pyevalb_on_the_development_trees():
    if not PTB.exists():
        pytest.skip(f"{PTB} not found (../shared beside the checkout)")
    golds = [t for t in read_treebank(f"{PTB}:wsj_0140-wsj_0169") if "_" not in " ".join(t.words())]
    assert _compare_with_pyevalb(golds, random.Random(2)) > 600
