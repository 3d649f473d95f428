"""Constrained decoding for parsing: with :class:`TreeConstraint` every search's output is a well-formed tree over
exactly the sentence's words (random untrained models, greedy, beam, sampling, tight length limits); a model whose
output is already such a tree keeps it; the constraint's state follows the beam (reorder and advance) as a state
recomputed from each hypothesis's prefix does."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from transduce.config import ModelConfig
from transduce.model import Transformer
from transduce.parsing.constrained import InOrderConstraint, TreeConstraint, TreeVocabulary
from transduce.parsing.linearize import delinearise, linearise
from transduce.parsing.trees import parse_trees, read_treebank
from transduce.search import beam_search, greedy_search, sample
from transduce.text.special import EOS_ID, PAD_ID

PIECES = ["<pad>", "<s>", "</s>", "<unk>", "▁XX", "▁(S", "▁)S", "▁(NP", "▁)NP", "▁(VP", "▁)VP", "▁(PP", "▁)PP"]
BARE = ["<pad>", "<s>", "</s>", "<unk>", "▁XX", "▁(S", "▁(NP", "▁(VP", "▁)"]
ORDERS = [(TreeConstraint, "top-down"), (InOrderConstraint, "in-order")]
PTB = Path(__file__).parents[2] / "shared" / "data" / "ptb_sample" / "wsj_0001-0169.mrg.tar.gz"


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_model(seed: int, vocab: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.preset("test", src_vocab_size=16, tgt_vocab_size=vocab, share_vocab=False)).eval()


def random_batch(seed: int, n: int) -> tuple[torch.Tensor, list[int]]:
    """``n`` source rows of 1 to 9 tokens and a number of words for each (1 to 12, unrelated to the source)."""
    rng = random.Random(seed)
    rows = [[rng.randrange(4, 16) for _ in range(rng.randint(1, 9))] + [EOS_ID] for _ in range(n)]
    width = max(map(len, rows))
    src = torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])
    return src, [rng.randint(1, 12) for _ in range(n)]


def check_trees(hyps: list[list[int]], words: list[int], pieces: list[str], order: str = "top-down") -> None:
    """Each output reads back, unmended, as a tree over its sentence's number of words."""
    for tokens, n in zip(hyps, words):
        text = [pieces[t].lstrip("▁") for t in tokens]
        tree, repair = delinearise(text, [f"w{i}" for i in range(n)], order)
        assert not repair.needed, (text, n, repair)
        assert len(tree.words()) == n and text.count("XX") == n


def repaired(hyps: list[list[int]], words: list[int], pieces: list[str], order: str = "top-down") -> int:
    return sum(
        delinearise([pieces[t].lstrip("▁") for t in tokens], [f"w{i}" for i in range(n)], order)[1].needed
        for tokens, n in zip(hyps, words)
    )


@pytest.mark.parametrize(("constraint", "order"), ORDERS, ids=["top-down", "in-order"])
@pytest.mark.parametrize("pieces", [PIECES, BARE], ids=["labelled", "bare"])
def test_random_models_give_well_formed_trees_greedy_beam_and_sampling(pieces, constraint, order):
    vocab = TreeVocabulary(pieces, EOS_ID)
    unconstrained_repairs = 0
    for seed in range(6):
        model = random_model(seed, len(pieces))
        src, words = random_batch(seed, 12)
        rule = constraint.for_rows(vocab, words)
        greedy = [h.tokens for h in greedy_search(model, src, max_len_b=40, constraint=rule)]
        check_trees(greedy, words, pieces, order)
        beams = beam_search(model, src, beam=4, nbest=4, length_penalty=0.3, max_len_b=40, constraint=rule)
        for k in range(4):
            check_trees([hyps[k].tokens for hyps in beams], words, pieces, order)
        drawn = sample(model, src, num_samples=3, max_len_b=40, constraint=rule,
                       generator=torch.Generator().manual_seed(seed))  # fmt: skip
        for k in range(3):
            check_trees([hyps[k].tokens for hyps in drawn], words, pieces, order)
        free = [h.tokens for h in greedy_search(model, src, max_len_b=40)]
        unconstrained_repairs += repaired(free, words, pieces, order)
    assert unconstrained_repairs > 36  # without the constraint, most of these random outputs are not such trees


@pytest.mark.parametrize(("constraint", "order"), ORDERS, ids=["top-down", "in-order"])
@pytest.mark.parametrize(
    "rules",
    [{"min_len": 30}, {"no_repeat_ngram": 1}, {"no_repeat_ngram": 2, "min_len": 30}],
    ids=["min_len", "no_repeat_ngram", "both"],
)
def test_a_step_where_the_constraint_leaves_nothing_the_other_rules_allow_follows_the_constraint(
    rules, constraint, order
):
    """min_len masks the EOS of a complete tree, no_repeat_ngram the second XX leaf: the tree constraint is the
    rule that holds, so greedy search never takes PAD there, sampling never draws from an empty distribution and beam
    search never ends a sentence without a hypothesis."""
    vocab = TreeVocabulary(PIECES, EOS_ID)
    for seed in range(4):
        model = random_model(seed, len(PIECES))
        src, words = random_batch(seed, 8)
        greedy = greedy_search(model, src, max_len_b=40, constraint=constraint.for_rows(vocab, words), **rules)
        drawn = sample(model, src, num_samples=2, max_len_b=40, constraint=constraint.for_rows(vocab, words),
                       generator=torch.Generator().manual_seed(seed), **rules)  # fmt: skip
        beams = beam_search(model, src, beam=3, max_len_b=40, constraint=constraint.for_rows(vocab, words), **rules)
        assert [len(hyps) for hyps in beams] == [1] * len(words)
        outputs = [
            [h.tokens for h in greedy],
            [h[0].tokens for h in beams],
            *([h[k].tokens for h in drawn] for k in (0, 1)),
        ]
        for hyps in outputs:
            assert all(PAD_ID not in tokens for tokens in hyps)
            check_trees(hyps, words, PIECES, order)
        assert all(math.isfinite(h.log_prob) for h in greedy)


@pytest.mark.parametrize(("constraint", "order"), ORDERS, ids=["top-down", "in-order"])
def test_length_limit_forces_the_closings(constraint, order):
    """At a maximum length of words + 2 the only tree is one bracket over the words, and it is found; a row whose
    limit is too short for any tree is decoded unconstrained (and mended by delinearise)."""
    vocab = TreeVocabulary(PIECES, EOS_ID)
    model = random_model(3, len(PIECES))
    src, _ = random_batch(3, 8)
    words = [5] * 7 + [9]
    greedy = greedy_search(model, src, max_len_a=0, max_len_b=7, constraint=constraint.for_rows(vocab, words))
    beams = beam_search(model, src, beam=5, max_len_a=0, max_len_b=7, constraint=constraint.for_rows(vocab, words))
    for hyps in (greedy, [h[0] for h in beams]):
        for h in hyps[:7]:
            text = [PIECES[t].lstrip("▁") for t in h.tokens]
            if order == "in-order":  # XX (S XX XX XX XX )S
                assert len(text) == 7 and text[0] == "XX" and text[2:6] == ["XX"] * 4 and text[1][0] == "("
                assert text[6] == ")" + text[1][1:]
            else:  # (S XX XX XX XX XX )S
                assert len(text) == 7 and text[1:6] == ["XX"] * 5 and text[0][0] == "("
                assert text[6] == ")" + text[0][1:]
        assert len(hyps[7].tokens) <= 7


def gold_is_allowed(trees: list, order: str, closing: str) -> None:
    """Stepping every tree's own linearisation through the constraint, in one batch: each token is allowed when it
    comes, and EOS right after the last one."""
    lines = [linearise(tree, closing=closing, order=order) for tree in trees]
    pieces = ["<pad>", "<s>", "</s>", "<unk>", *sorted({"▁" + t for line in lines for t in line})]
    ids = {p[1:]: i for i, p in enumerate(pieces) if p.startswith("▁")}
    vocab = TreeVocabulary(pieces, EOS_ID)
    rule = (InOrderConstraint if order == "in-order" else TreeConstraint).for_rows(
        vocab, [len(t.words()) for t in trees]
    )
    width = max(map(len, lines)) + 1
    seqs = torch.tensor([[ids[t] for t in line] + [EOS_ID] * (width - len(line)) for line in lines])
    lengths = torch.tensor([len(line) for line in lines])
    max_len = lengths + 1  # as tight as it gets: the tree, then EOS
    for step in range(width):
        allowed = rule.allowed(step, max_len)
        live = step <= lengths
        assert allowed[live].gather(1, seqs[live, step : step + 1]).all(), step
        rule = rule.advance(seqs[:, step])


@pytest.mark.parametrize("order", ["top-down", "in-order"])
@pytest.mark.parametrize("closing", ["labelled", "bare"])
def test_the_constraint_allows_every_gold_tree(order, closing):
    trees = list(parse_trees(
        "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (PRP it)))) (. .)) (S (VP (VB Go)) (. !)) "
        "(NP (NN x)) (S (S (NP (NN a)) (VP (VB b))) (CC and) (S (NP (NN c)) (VP (VB d))))"
    ))  # fmt: skip
    gold_is_allowed(trees, order, closing)


@pytest.mark.shared
@pytest.mark.parametrize("order", ["top-down", "in-order"])
def test_the_constraint_allows_every_training_tree(order):
    if not PTB.exists():
        pytest.skip(f"{PTB} not found (../shared beside the checkout)")
    gold_is_allowed(read_treebank(f"{PTB}:wsj_0001-wsj_0139"), order, "labelled")


class Steered:
    """A random model with a bonus on one fixed token sequence (then EOS), position by position, so that its
    unconstrained beam output is that sequence. Decodes without the cache (the prefix tells the position)."""

    def __init__(self, model: Transformer, target: list[int], bonus: float):
        self.model, self.config, self.target, self.bonus = model, model.config, target, bonus

    def encode(self, src):
        return self.model.encode(src)

    def init_cache(self, memory):
        return self.model.init_cache(memory)

    def decode(self, tgt, memory, cache=None):
        logits, cache = self.model.decode(tgt, memory, cache)
        position = tgt.shape[1] - 1
        favoured = self.target[position] if position < len(self.target) else EOS_ID
        logits = logits.clone()
        logits[:, -1, favoured] += self.bonus
        return logits, cache


def test_beam_keeps_an_output_that_is_already_a_tree():
    vocab = TreeVocabulary(PIECES, EOS_ID)
    ids = {p.lstrip("▁"): i for i, p in enumerate(PIECES)}
    target = [ids[t] for t in ["(S", "(NP", "XX", "XX", ")NP", "(VP", "XX", "(PP", "XX", "XX", ")PP", ")VP", ")S"]]
    for seed in range(3):
        model = Steered(random_model(seed, len(PIECES)), target, bonus=6.0)
        src, _ = random_batch(seed, 5)
        free = beam_search(model, src, beam=21, length_penalty=0.3, max_len_b=20, use_cache=False)
        assert all(hyps[0].tokens == target for hyps in free)  # the premise: already a tree over 5 words
        rule = TreeConstraint.for_rows(vocab, [5] * 5)
        held = beam_search(model, src, beam=21, length_penalty=0.3, max_len_b=20, use_cache=False, constraint=rule)
        for a, b in zip(free, held):
            assert b[0].tokens == a[0].tokens
            assert b[0].score == pytest.approx(a[0].score, abs=1e-5)
            assert b[0].log_prob == pytest.approx(a[0].log_prob, abs=1e-5)


def state(rule: TreeConstraint) -> list[tuple]:
    """Each row's state: every per-row value, the stacks (labels, whether each holds a leaf) as deep as the row."""
    return [
        tuple(getattr(rule, name)[r, :d].tolist() if name in ("labels", "has_leaf") else getattr(rule, name)[r].tolist()
              for name in rule._STATE)
        for r, d in enumerate(rule.depth.tolist())
    ]  # fmt: skip


class Recomputed:
    """A TreeConstraint that also keeps each row's prefix and, at every step, checks its state and its mask against a
    TreeConstraint advanced token by token through the prefixes, from scratch."""

    def __init__(self, rule: TreeConstraint, prefixes: list[list[int]], seen: list):
        self.rule, self.prefixes, self.seen = rule, prefixes, seen

    def mask(self, scores, step, max_len):
        fresh = type(self.rule)(self.rule.vocab, self.rule.words)
        for k in range(step):
            fresh = fresh.advance(torch.tensor([p[k] for p in self.prefixes]))
        assert state(self.rule) == state(fresh)
        assert torch.equal(self.rule.allowed(step, max_len), fresh.allowed(step, max_len))
        self.seen.append([tuple(p) for p in self.prefixes])
        return self.rule.mask(scores, step, max_len)

    def reorder(self, index):
        return Recomputed(self.rule.reorder(index), [self.prefixes[i] for i in index.tolist()], self.seen)

    def advance(self, tokens):
        return Recomputed(self.rule.advance(tokens), [[*p, t] for p, t in zip(self.prefixes, tokens.tolist())],
                          self.seen)  # fmt: skip


@pytest.mark.parametrize(("constraint", "order"), ORDERS, ids=["top-down", "in-order"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_constraint_state_follows_the_beam(use_cache, constraint, order):
    vocab = TreeVocabulary(PIECES, EOS_ID)
    model = random_model(7, len(PIECES))
    src, words = random_batch(7, 6)
    seen: list = []
    rule = Recomputed(constraint.for_rows(vocab, words), [[] for _ in words], seen)
    got = beam_search(model, src, beam=5, nbest=5, length_penalty=0.3, max_len_b=40, use_cache=use_cache,
                      constraint=rule)  # fmt: skip
    # the prefixes the constraint followed are the search's own: every finished hypothesis was one of them
    followed = {p for step in seen for p in step}
    for hyps in got:
        for h in hyps:
            assert tuple(h.tokens) in followed
    assert len(seen) > max(words)
    plain = beam_search(model, src, beam=5, nbest=5, length_penalty=0.3, max_len_b=40, use_cache=use_cache,
                        constraint=constraint.for_rows(vocab, words))  # fmt: skip
    assert [[h.tokens for h in x] for x in got] == [[h.tokens for h in x] for x in plain]


def test_vocabulary_roles_and_refusal():
    vocab = TreeVocabulary(PIECES, EOS_ID)
    assert vocab.labelled and vocab.leaf_ids.tolist() == [4] and vocab.open_ids.tolist() == [5, 7, 9, 11]
    assert vocab.close_for_label[vocab.label[7]].item() == 8
    assert not TreeVocabulary(BARE, EOS_ID).labelled
    assert TreeVocabulary([*PIECES, "▁(ADJP"], EOS_ID).kind[-1].item() == 0  # no )ADJP to close it: never opened
    with pytest.raises(ValueError, match="no opening brackets or no leaves"):
        TreeVocabulary(["<pad>", "<s>", "</s>", "<unk>", "▁a", "▁b"], EOS_ID)


WORDS = [*PIECES, "▁the", "▁cat", "▁sat"]  # a word-leaf vocabulary: XX stands for the words it lacks


@pytest.mark.parametrize(("constraint", "order"), ORDERS, ids=["top-down", "in-order"])
def test_word_leaves_are_forced_to_the_next_word(constraint, order):
    """With word leaves, every leaf of every output is the sentence's next word in order, or XX for a word the
    vocabulary lacks; random models, greedy, beam and sampling."""
    vocab = TreeVocabulary(WORDS, EOS_ID)
    assert vocab.leaves_for(["the", "dog", "sat"]) == [13, 4, 15]
    assert TreeVocabulary(PIECES, EOS_ID).leaves_for(["the", "dog"]) == [-1, -1]  # XX only: any leaf, as before
    rng = random.Random(0)
    for seed in range(4):
        model = random_model(seed, len(WORDS))
        src, _ = random_batch(seed, 10)
        sentences = [[rng.choice(["the", "cat", "sat", "dog"]) for _ in range(rng.randint(1, 8))] for _ in range(10)]
        rule = constraint.for_rows(vocab, [len(s) for s in sentences], "cpu",
                                   [vocab.leaves_for(s) for s in sentences])  # fmt: skip
        outputs = [[h.tokens for h in greedy_search(model, src, max_len_b=40, constraint=rule)]]
        beams = beam_search(model, src, beam=4, nbest=4, length_penalty=0.3, max_len_b=40, constraint=rule)
        outputs += [[hyps[k].tokens for hyps in beams] for k in range(4)]
        drawn = sample(model, src, num_samples=2, max_len_b=40, constraint=rule,
                       generator=torch.Generator().manual_seed(seed))  # fmt: skip
        outputs += [[hyps[k].tokens for hyps in drawn] for k in range(2)]
        for hyps in outputs:
            for tokens, words in zip(hyps, sentences):
                text = [WORDS[t].lstrip("▁") for t in tokens]
                leaves = [t for t in text if not t.startswith(("(", ")"))]
                assert leaves == [w if w != "dog" else "XX" for w in words], (text, words)
                assert not delinearise(text, words, order)[1].needed


def test_a_forced_word_leaf_scores_as_all_leaves_together():
    """Leaf probabilities 0.1 (XX), 0.2 (the), 0.3 (cat), 0.1 (sat) and 0.3 for "(S": inside the root, with "cat"
    next, the token "cat" gets log(0.7), every other leaf -inf, the bracket keeps log(0.3)."""
    vocab = TreeVocabulary(WORDS, EOS_ID)
    rule = TreeConstraint.for_rows(vocab, [2], "cpu", [vocab.leaves_for(["cat", "sat"])])
    rule = rule.advance(torch.tensor([5]))  # (S opened
    probs = torch.full((1, len(WORDS)), 1e-9)
    probs[0, [4, 13, 14, 15, 7]] = torch.tensor([0.1, 0.2, 0.3, 0.1, 0.3])  # XX the cat sat (NP
    scores = rule.mask(probs.log(), step=1, max_len=torch.tensor([20]))
    assert scores[0, 14].exp().item() == pytest.approx(0.7, abs=1e-6)
    assert scores[0, 7].exp().item() == pytest.approx(0.3, abs=1e-6)
    assert torch.isinf(scores[0, [4, 13, 15]]).all()
