"""Linearisation and its inverse: the identity on every tree, and well-formed trees from any output."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from transduce.parsing.linearize import PLACEHOLDER, delinearise, linearise
from transduce.parsing.trees import Tree, parse_trees, read_treebank

PTB = Path(__file__).parents[2] / "shared" / "data" / "ptb_sample" / "wsj_0001-0169.mrg.tar.gz"
TREE = next(parse_trees("(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (PRP it)))) (. .))"))
WORDS = TREE.words()


def xx(tree: Tree) -> Tree:
    """The tree with every part-of-speech tag replaced by XX (what delinearise gives back)."""
    if tree.is_preterminal():
        return Tree(PLACEHOLDER, list(tree.children))
    return Tree(tree.label, [xx(c) for c in tree.children])  # type: ignore[arg-type]


def well_formed(tree: Tree, words: list[str]) -> bool:
    """Every node has children, pre-terminals hold one word each, the words are the sentence's."""
    return tree.words() == words and all(
        node.children and (node.is_preterminal() or all(isinstance(c, Tree) for c in node.children))
        for node in tree.subtrees()
    )


def test_linearise_variants():
    assert " ".join(linearise(TREE)) == "(S (NP XX XX )NP (VP XX (PP XX (NP XX )NP )PP )VP XX )S"
    assert " ".join(linearise(TREE, closing="bare")) == "(S (NP XX XX ) (VP XX (PP XX (NP XX ) ) ) XX )"
    assert " ".join(linearise(TREE, leaves="word")) == ("(S (NP The cat )NP (VP sat (PP on (NP it )NP )PP )VP . )S")
    # words outside `known` (the rare words of the training trees) are XX; with XX leaves `known` changes nothing
    assert " ".join(linearise(TREE, leaves="word", known={"The", "sat", "."})) == (
        "(S (NP The XX )NP (VP sat (PP XX (NP XX )NP )PP )VP . )S"
    )
    assert linearise(TREE, known={"The"}) == linearise(TREE)
    with pytest.raises(ValueError, match="closing: 'x' is not one of labelled, bare"):
        linearise(TREE, closing="x")
    with pytest.raises(ValueError, match="order: 'x' is not one of top-down, in-order"):
        linearise(TREE, order="x")


def test_in_order_linearisation():
    # a constituent's first child, then its label, then the other children: (VP sat (PP on (NP it))) is
    # "sat (VP on (PP it (NP )NP )PP )VP"; the unary (NP it) is "it (NP )NP"
    assert " ".join(linearise(TREE, order="in-order")) == "XX (NP XX )NP (S XX (VP XX (PP XX (NP )NP )PP )VP XX )S"
    assert " ".join(linearise(TREE, leaves="word", closing="bare", order="in-order")) == (
        "The (NP cat ) (S sat (VP on (PP it (NP ) ) ) . )"
    )
    unary = next(parse_trees("(S (VP (VB Go)) (. !))"))  # a unary chain over the first child
    assert linearise(unary, leaves="word", order="in-order") == ["Go", "(VP", ")VP", "(S", "!", ")S"]
    assert sorted(linearise(TREE, order="in-order")) == sorted(linearise(TREE))  # the same tokens, reordered


@pytest.mark.parametrize("order", ["top-down", "in-order"])
@pytest.mark.parametrize("leaves", ["xx", "word"])
@pytest.mark.parametrize("closing", ["labelled", "bare"])
def test_delinearise_inverts_linearise(leaves, closing, order):
    tree, repair = delinearise(linearise(TREE, leaves=leaves, closing=closing, order=order), WORDS, order)
    assert tree == xx(TREE) and not repair.needed


@pytest.mark.shared
@pytest.mark.parametrize(("closing", "order"), [("labelled", "top-down"), ("bare", "top-down"),
                                                ("labelled", "in-order"), ("bare", "in-order")])  # fmt: skip
def test_linearise_then_delinearise_is_the_identity_on_every_training_tree(closing, order):
    if not PTB.exists():
        pytest.skip(f"{PTB} not found (../shared beside the checkout)")
    trees = read_treebank(f"{PTB}:wsj_0001-wsj_0139")
    assert len(trees) == 3068
    for tree in trees:
        back, repair = delinearise(linearise(tree, closing=closing, order=order), tree.words(), order)
        assert back == xx(tree) and not repair.needed, tree


@pytest.mark.parametrize(
    ("output", "expected", "repairs"),
    [
        # too few leaves: the missing words go into the innermost open bracket, which is then closed
        ("(S (NP XX XX )NP (VP XX", "(S (NP (XX The) (XX cat)) (VP (XX sat) (XX on) (XX it) (XX .)))",
         {"missing_leaves": 3, "unclosed": 2}),
        # the tree closed too early: the missing words go at the end of it
        ("(S (NP XX XX )NP )S", "(S (NP (XX The) (XX cat)) (XX sat) (XX on) (XX it) (XX .))", {"missing_leaves": 4}),
        # too many leaves: the extra ones are dropped
        ("(S (NP XX XX XX XX )NP (VP XX XX XX XX )VP )S",
         "(S (NP (XX The) (XX cat) (XX sat) (XX on)) (VP (XX it) (XX .)))", {"extra_leaves": 2}),
        # a closing bracket with nothing open is dropped; a mismatched label closes the open bracket
        (")S (S (NP XX XX )VP (VP XX XX XX XX )VP )S )S",
         "(S (NP (XX The) (XX cat)) (VP (XX sat) (XX on) (XX it) (XX .)))",
         {"unmatched_closings": 2, "mismatched_closings": 1}),
        # an empty constituent is dropped; several top-level pieces go under TOP
        ("(NP XX XX )NP (ADJP )ADJP (VP XX XX XX XX )VP",
         "(TOP (NP (XX The) (XX cat)) (VP (XX sat) (XX on) (XX it) (XX .)))",
         {"empty_constituents": 1, "wrapped_root": True}),
        # nothing at all: every word under TOP
        ("", "(TOP (XX The) (XX cat) (XX sat) (XX on) (XX it) (XX .))", {"missing_leaves": 6, "wrapped_root": True}),
        # special tokens and label-less brackets are dropped
        ("( (S <unk> XX XX XX XX XX XX )S", "(S (XX The) (XX cat) (XX sat) (XX on) (XX it) (XX .))",
         {"malformed_tokens": 2}),
    ],
)  # fmt: skip
def test_repair(output, expected, repairs):
    tree, repair = delinearise(output, WORDS)
    assert tree.to_string() == expected
    assert repair.needed
    for name, value in repairs.items():
        assert getattr(repair, name) == value, name
    assert well_formed(tree, WORDS)


@pytest.mark.parametrize(
    ("output", "expected", "repairs"),
    [
        # an opening bracket with nothing before it opens empty (and takes what follows)
        ("(S XX XX XX XX XX XX )S", "(S (XX The) (XX cat) (XX sat) (XX on) (XX it) (XX .))", {"empty_openings": 1}),
        # an opening right after an opening takes the outer one's first child (the outer one then holds the inner
        # one alone); the missing words go at the end of the one tree
        ("XX (NP (S XX )S )NP", "(NP (S (XX The) (XX cat)) (XX sat) (XX on) (XX it) (XX .))", {"missing_leaves": 4}),
        # a bare leaf at the top: the words under TOP
        ("XX XX (NP )NP", "(TOP (XX The) (NP (XX cat)) (XX sat) (XX on) (XX it) (XX .))",
         {"missing_leaves": 4, "wrapped_root": True}),
    ],
)  # fmt: skip
def test_repair_in_order(output, expected, repairs):
    tree, repair = delinearise(output, WORDS, "in-order")
    assert tree.to_string() == expected
    for name, value in repairs.items():
        assert getattr(repair, name) == value, name
    assert well_formed(tree, WORDS)


@pytest.mark.parametrize("order", ["top-down", "in-order"])
def test_any_token_sequence_gives_a_well_formed_tree_over_the_words(order):
    rng = random.Random(0)
    vocab = ["(S", "(NP", "(VP", "(PP", ")S", ")NP", ")VP", ")", "XX", "XX", "XX", "<unk>", "("]
    for _ in range(2000):
        words = [f"w{i}" for i in range(rng.randint(0, 8))]
        tokens = [rng.choice(vocab) for _ in range(rng.randint(0, 30))]
        tree, _ = delinearise(tokens, words, order)
        assert tree.words() == words, tokens
        if words:
            assert well_formed(tree, words), tokens
            # and it reads back to itself: linearising the repaired tree needs no repair
            again, repair = delinearise(linearise(tree, order=order), words, order)
            assert again == tree and not repair.needed, tokens
