"""Search tests: an oracle decoder with hand-written probability tables (exact hypotheses and scores), then
equivalences on random models (cache == no cache, beam 1 == greedy, scores == recomputed log-probabilities,
batched == one by one) and a trained reversal model (exact output)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from decodekit import one_thread, reversal_model, task_batch
from transduce import fastpaths
from transduce.config import DecodeConfig, ModelConfig
from transduce.model import Memory, Transformer, kernels
from transduce.search import (
    Hypothesis,
    beam_search,
    beam_step,
    filter_logits,
    generate,
    greedy_search,
    length_penalty,
    max_lengths,
    rescore,
    sample,
)
from transduce.search.common import next_token_log_probs
from transduce.text.special import BOS_ID, EOS_ID, PAD_ID


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


A, B, C = 4, 5, 6  # oracle vocabulary: pad, bos, eos, unk, a, b, c
VOCAB = 7


# ----------------------------------------------------------------------------------------------------------------------
# the oracle: probability tables keyed by the prefix generated so far


@dataclass(frozen=True)
class OracleCache:
    prefix: torch.Tensor  # (R, t) decoder inputs so far, BOS first
    sent: torch.Tensor  # (R,) which table each row reads

    def reorder(self, index: torch.Tensor) -> OracleCache:
        return OracleCache(self.prefix.index_select(0, index), self.sent.index_select(0, index))

    select = reorder


class Oracle:
    """A model whose next-token distribution is ``tables[s][prefix]`` for the sentence whose source starts with
    token ``4 + s``; a prefix missing from the table ends the sentence (EOS with probability 1)."""

    def __init__(self, tables: list[dict[tuple[int, ...], dict[int, float]]]):
        self.tables = tables
        self.config = SimpleNamespace(pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, tgt_vocab_size=VOCAB)
        self.calls = 0

    def encode(self, src: torch.Tensor) -> Memory:
        return Memory((src[:, :1] - 4).float()[:, :, None], None)

    def init_cache(self, memory: Memory) -> OracleCache:
        n = memory.states.shape[0]
        return OracleCache(torch.empty(n, 0, dtype=torch.long), memory.states[:, 0, 0].long())

    def decode(self, tgt: torch.Tensor, memory: Memory, cache: OracleCache | None = None):
        self.calls += 1
        cache = cache or self.init_cache(memory)
        full = torch.cat([cache.prefix, tgt], dim=1)
        t0 = cache.prefix.shape[1]
        logits = torch.full((tgt.shape[0], tgt.shape[1], VOCAB), float("-inf"))
        for r in range(tgt.shape[0]):
            table = self.tables[int(cache.sent[r])]
            for p in range(tgt.shape[1]):
                context = tuple(full[r, 1 : t0 + p + 1].tolist())
                for token, prob in table.get(context, {EOS_ID: 1.0}).items():
                    logits[r, p, token] = math.log(prob)
        return logits, OracleCache(full, cache.sent)


def src_for(*sentences: int) -> torch.Tensor:
    """Source rows selecting the oracle tables (two real tokens each, so max_len_a * 2 + b)."""
    return torch.tensor([[4 + s, 4, EOS_ID] for s in sentences])


# Table A: two EOS candidates win step 1; both are finished and the search stops (no penalty).
TABLE_A = {
    (): {A: 0.6, B: 0.3, EOS_ID: 0.1},
    (A,): {EOS_ID: 0.5, B: 0.4, A: 0.1},
    (B,): {EOS_ID: 0.9, A: 0.1},
}
# Table B: the empty output wins on raw log-probability, the three-token one with the length penalty.
TABLE_B = {
    (): {EOS_ID: 0.4, A: 0.6},
    (A,): {B: 0.8, EOS_ID: 0.2},
    (A, B): {C: 0.8, EOS_ID: 0.2},
    (A, B, C): {EOS_ID: 1.0},
}
ln = math.log


def lp(n: int, alpha: float = 0.6) -> float:
    return ((5 + n) / 6) ** alpha


def test_oracle_average_length_norm_ranks_differently():
    # |Y| ** 1 (fairseq's average log-probability per token): "a b" (ln 0.096 / 3 = -0.78) now beats "" (ln 0.4 / 1 =
    # -0.92), which GNMT's ((5 + |Y|) / 6) ** 0.6 ranked second (ln 0.096 / 1.19 = -1.97); "a b c" wins both ways. The
    # search must go on after step 2, when "a b c" is still live: its bound ln 0.384 / 13 beats the finished ones.
    got = beam_search(Oracle([TABLE_B]), src_for(0), beam=2, nbest=2, length_penalty=1.0, length_norm="length",
                      max_len_b=10)  # fmt: skip
    assert_hyps(got[0], [([A, B, C], ln(0.384), ln(0.384) / 4), ([A, B], ln(0.096), ln(0.096) / 3)])
    gnmt = beam_search(Oracle([TABLE_B]), src_for(0), beam=2, nbest=2, length_penalty=1.0, max_len_b=10)
    assert [h.tokens for h in gnmt[0]] == [[A, B, C], []]
    greedy = greedy_search(Oracle([TABLE_B]), src_for(0), length_penalty=0.5, length_norm="length", max_len_b=10)
    assert_hyps(greedy, [([A, B, C], ln(0.384), ln(0.384) / 2)])  # 4 ** 0.5: only the score changes
    with pytest.raises(ValueError, match="length_norm must be one of gnmt, length, got 'avg'"):
        beam_search(Oracle([TABLE_B]), src_for(0), length_norm="avg")


def assert_hyps(got: list[Hypothesis], expected: list[tuple[list[int], float, float]]) -> None:
    assert [h.tokens for h in got] == [e[0] for e in expected]
    for h, (_, log_prob, score) in zip(got, expected):
        assert h.log_prob == pytest.approx(log_prob, abs=1e-6)
        assert h.score == pytest.approx(score, abs=1e-6)


def test_oracle_two_eos_candidates_finish_together():
    got = beam_search(Oracle([TABLE_A]), src_for(0), beam=2, nbest=2, length_penalty=0.0, max_len_b=10)
    assert_hyps(got[0], [([A], ln(0.3), ln(0.3)), ([B], ln(0.27), ln(0.27))])


def test_oracle_no_penalty_prefers_short():
    got = beam_search(Oracle([TABLE_B]), src_for(0), beam=2, nbest=2, length_penalty=0.0, max_len_b=10)
    assert_hyps(got[0], [([], ln(0.4), ln(0.4)), ([A, B, C], ln(0.384), ln(0.384))])


def test_oracle_length_penalty_flips_the_order():
    got = beam_search(Oracle([TABLE_B]), src_for(0), beam=2, nbest=2, length_penalty=0.6, max_len_b=10)
    assert_hyps(got[0], [([A, B, C], ln(0.384), ln(0.384) / lp(4)), ([], ln(0.4), ln(0.4) / lp(1))])


def test_oracle_max_length_forces_eos_with_its_true_probability():
    # max_len = 0 * 2 + 2: after "a b" only EOS may follow; its log-probability is counted as the model gives it
    got = beam_search(Oracle([TABLE_B]), src_for(0), beam=3, nbest=3, length_penalty=0.0, max_len_a=0, max_len_b=2)
    assert_hyps(got[0], [([], ln(0.4), ln(0.4)), ([A], ln(0.12), ln(0.12)), ([A, B], ln(0.096), ln(0.096))])
    zero = beam_search(Oracle([TABLE_B]), src_for(0), beam=2, length_penalty=0.0, max_len_a=0, max_len_b=0)
    assert_hyps(zero[0], [([], ln(0.4), ln(0.4))])


def test_oracle_min_length_blocks_early_eos_but_keeps_true_scores():
    got = beam_search(Oracle([TABLE_B]), src_for(0), beam=2, nbest=2, length_penalty=0.0, min_len=1, max_len_b=10)
    assert_hyps(got[0], [([A, B, C], ln(0.384), ln(0.384)), ([A], ln(0.12), ln(0.12))])


def test_oracle_early_stopping_stops_at_beam_finished_hypotheses():
    # beam 2: "" and "a" finish at steps 0 and 1; the exact search goes on and finds "a b c", which the length
    # penalty ranks first (test above), early stopping returns what it has after two decoder calls
    oracle = Oracle([TABLE_B])
    got = beam_search(oracle, src_for(0), beam=2, nbest=2, length_penalty=0.6, max_len_b=10, early_stopping=True)
    assert_hyps(got[0], [([], ln(0.4), ln(0.4) / lp(1)), ([A], ln(0.12), ln(0.12) / lp(2))])
    assert oracle.calls == 2
    exact = Oracle([TABLE_B])
    assert beam_search(exact, src_for(0), beam=2, length_penalty=0.6, max_len_b=10)[0][0].tokens == [A, B, C]
    assert exact.calls == 4
    # a sentence without `beam` finished hypotheses goes on as before (table A finishes both at step 1)
    got = beam_search(Oracle([TABLE_A]), src_for(0), beam=2, nbest=2, length_penalty=0.0, max_len_b=10,
                      early_stopping=True)  # fmt: skip
    assert_hyps(got[0], [([A], ln(0.3), ln(0.3)), ([B], ln(0.27), ln(0.27))])


def test_oracle_batch_drops_finished_sentences():
    oracle = Oracle([TABLE_A, TABLE_B])
    got = beam_search(oracle, src_for(0, 1), beam=2, nbest=2, length_penalty=0.6, max_len_b=10)
    assert_hyps(got[0], [([A], ln(0.3), ln(0.3) / lp(2)), ([B], ln(0.27), ln(0.27) / lp(2))])
    assert_hyps(got[1], [([A, B, C], ln(0.384), ln(0.384) / lp(4)), ([], ln(0.4), ln(0.4) / lp(1))])
    assert oracle.calls == 4  # steps 0-3; sentence A left the batch after step 1


def test_oracle_max_len_a_counts_real_source_tokens():
    src = torch.tensor([[4, 4, 4, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]])
    assert max_lengths(Oracle([{}, {}]), src, 1.5, 1).tolist() == [5, 2]  # floor(1.5 * 3 + 1), floor(1.5 + 1)


def test_oracle_greedy_and_sampling():
    oracle = Oracle([TABLE_B])
    (g,) = greedy_search(oracle, src_for(0), max_len_b=10)
    assert (g.tokens, g.log_prob) == ([A, B, C], pytest.approx(ln(0.384)))
    (s,) = sample(oracle, src_for(0), num_samples=1, top_k=1, max_len_b=10)
    assert s[0].tokens == [A, B, C]
    gen = torch.Generator().manual_seed(0)
    draws = sample(oracle, src_for(0), num_samples=200, max_len_b=10, generator=gen)[0]
    assert {tuple(h.tokens) for h in draws} <= {(), (A,), (A, B), (A, B, C)}
    assert 0.25 < sum(not h.tokens for h in draws) / 200 < 0.55  # p(empty) = 0.4
    assert [h.score for h in draws] == sorted((h.score for h in draws), reverse=True)


# ----------------------------------------------------------------------------------------------------------------------
# the step policy and helpers on their own


def test_next_token_log_probs_equal_log_softmax_of_the_last_position():
    g = torch.Generator().manual_seed(0)
    one_step = torch.randn(3, 1, 50, generator=g) * 4  # float32, contiguous: computed in place
    expected = torch.log_softmax(one_step[:, -1], dim=-1)
    out = next_token_log_probs(one_step)
    assert torch.allclose(out, expected, atol=1e-6) and out.data_ptr() == one_step.data_ptr()
    several = torch.randn(3, 4, 50, generator=g)  # the last position of several: a copy, input untouched
    before = several.clone()
    assert torch.allclose(next_token_log_probs(several), torch.log_softmax(several[:, -1], dim=-1), atol=1e-6)
    assert torch.equal(several, before)
    low = several.bfloat16()  # other dtypes: float32 output, input untouched
    out = next_token_log_probs(low)
    assert out.dtype == torch.float32 and torch.equal(low, before.bfloat16())


@pytest.mark.parametrize("vocab", [8000, 1000, 256, 250, 8003, 7])
def test_top_candidates_equal_one_topk_over_all_beams(vocab):
    from transduce.search import candidates as candidates_module

    g = torch.Generator().manual_seed(vocab)
    total = torch.log_softmax(torch.randn(6, 4, vocab, generator=g) * 3, dim=-1)
    total[1] = float("-inf")  # constrained rows: only EOS (id 2) is allowed
    total[1, :, EOS_ID] = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    total[2, 1:] = float("-inf")  # one live beam
    for size in (8, 3):
        got = candidates_module.top_candidates(total, size)  # through the chunked top-k where it applies
        top, flat = total.view(6, -1).topk(size, dim=1)
        want = top, flat.remainder(vocab), flat.div(vocab, rounding_mode="floor")
        assert torch.equal(got[0], want[0])  # the same values, best first
        finite = torch.isfinite(want[0])
        for a, b in zip(got[1:], want[1:]):  # the same tokens and beams where the score is finite (no ties here)
            assert torch.equal(a[finite], b[finite])
        assert all(0 <= int(t) < vocab for t in got[1].flatten()) and all(0 <= int(b) < 4 for b in got[2].flatten())
    # 4 x 250, 4 x 8003 and 4 x 7 are no multiple of 16: one torch.topk
    assert (candidates_module._chunked_topk(total.view(6, -1), 8) is None) == (vocab in (250, 8003, 7))


@pytest.mark.parametrize("vocab", [8000, 37, 7])
@pytest.mark.parametrize("width", [1, 4])
def test_candidates_from_logits_equal_beam_step_of_the_log_softmax(vocab, width):
    """Beam search takes its candidates from the logits (a row's normaliser, then its largest logits) where the
    kernels apply: the same as beam_step over the log-softmax, -inf (disallowed) tokens, empty beams and fewer
    candidates than asked for (4 x 7 < 32) included."""
    from transduce.model import kernels
    from transduce.search.candidates import candidates_from_row_tops

    if not kernels.applies(torch.zeros(1)):
        pytest.skip("transduce's kernels are not available (TRANSDUCE_KERNELS=0 or no compiler)")
    g = torch.Generator().manual_seed(vocab + width)
    logits = torch.randn(5 * width, vocab, generator=g) * 4
    normaliser = torch.logsumexp(logits, dim=1)
    logits[0] = float("-inf")  # a row forced to EOS
    logits[0, EOS_ID] = 1.5
    logits[1:, PAD_ID] = float("-inf")
    scores = torch.randn(5, width, generator=g) - 3
    if width > 1:
        scores[2, 1:] = float("-inf")  # one live beam
    for size in (8, 3, 32):
        values, tokens = kernels.row_topk(logits.clone(), min(size, vocab))
        got = candidates_from_row_tops(values, tokens, normaliser, scores, size)
        want = beam_step((logits - normaliser[:, None]).view(5, width, vocab), scores, size)
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)  # the same values, best first
        finite = torch.isfinite(want[0])
        assert torch.equal(torch.isfinite(got[0]), finite)
        for a, b in zip(got[1:], want[1:]):  # the same tokens and beams where the score is finite (no ties here)
            assert torch.equal(a[finite], b[finite])
        assert got[1].shape == got[2].shape == (5, size)


@pytest.mark.parametrize("width,k", [(1, 8), (4, 8), (4, 1)])
def test_beam_advance_kernel_equals_the_python_selection(width, k, monkeypatch):
    """A beam step's selection from each row's best logits in one kernel call (beam_advance) gives what PyTorch's
    operations give: the candidates (ties by the smaller index, -inf rows, fewer candidates than asked for), the
    survivors without EOS first, their rows, tokens and history, and the two flags."""
    from transduce.search import beam as beam_module
    from transduce.search.beam import advance

    if kernels.compiled() is None or not kernels.applies(torch.zeros(1)):
        pytest.skip("transduce's kernels are not available (TRANSDUCE_KERNELS=0 or no compiler)")
    beam, n = 4, 6
    g = torch.Generator().manual_seed(width * 10 + k)
    values = (torch.randn(n * width, k, generator=g) * 2).sort(dim=1, descending=True).values
    values[1] = values[1].round()  # equal scores within a row and across rows
    values[n * width - 1] = float("-inf")  # a row with nothing allowed
    tokens = torch.randint(4, 40, (n * width, k), generator=g)
    tokens[0, :2] = EOS_ID  # EOS among the best candidates of sentence 0
    tokens[width, 0] = EOS_ID
    normalisers = torch.randn(n * width, generator=g)
    normalisers[1] = 0.0
    scores = torch.randn(n, width, generator=g) - 2
    if width > 1:
        scores[2, 1:] = float("-inf")  # one live beam
        scores[1] = scores[1].round()
    scores[n - 1] = float("-inf")  # a sentence with no live hypothesis
    history = torch.randint(4, 40, (n * width, 3), generator=g)

    def run(kernel_on):
        if not kernel_on:
            monkeypatch.setattr(beam_module, "kernels", SimpleNamespace(applies=lambda t: False, compiled=lambda: None))
        tops = (values.clone(), tokens.clone(), normalisers.clone())
        out = advance(None, tops, scores.clone(), history.clone(), beam, EOS_ID)
        monkeypatch.undo()
        return out

    fast, slow = run(True), run(False)
    assert torch.equal(fast[0][0], slow[0][0]) and torch.equal(fast[1], slow[1])  # the same scores, in order
    # the kernel's order, by a plain Python reference: score descending, the smaller index in width x k first
    total = ((values - normalisers[:, None]).view(n, width, k) + scores[:, :, None]).view(n, width * k)
    size = 2 * beam
    for i in range(n):
        ranked = sorted(range(width * k), key=lambda c: (-total[i, c].item(), c))[:size]
        for j, c in enumerate(ranked):
            if math.isfinite(total[i, c].item()):
                assert fast[0][1][i, j].item() == tokens[i * width + c // k, c % k].item()
                assert fast[0][2][i, j].item() == c // k
    # PyTorch's top-k orders equal scores its own way: the same (score, token, beam) triples where finite
    finite = fast[0][0].isfinite()
    for i in range(n):
        triples = [sorted(zip(*(t[i][finite[i]].tolist() for t in out[0]))) for out in (fast, slow)]
        assert triples[0] == triples[1]
    live = fast[1].isfinite().view(-1)
    rows = fast[2][live]
    assert torch.equal(fast[4][live], torch.cat([history[rows], fast[3][live]], dim=1))
    assert fast[5] is True and slow[5] is True  # sentence 0's best candidate ends with EOS
    assert fast[6] is True and slow[6] is None  # sentence n - 1 has nothing to extend (the kernel says so)
    survivors = fast[3].view(n, beam)
    eos_candidates = fast[0][1].eq(EOS_ID).sum(dim=1)
    for i in range(n):  # EOS survives only where fewer than `beam` other candidates are left
        assert survivors[i].eq(EOS_ID).sum().item() == max(0, beam - (size - eos_candidates[i].item()))


@pytest.mark.parametrize("options", [{}, {"min_len": 3, "no_repeat_ngram": 2}, {"max_len_b": 2}])
def test_beam_search_from_logits_equals_beam_search_from_log_probs(options, monkeypatch):
    """The candidates from the logits (through row_candidates where every row masks the same tokens, else
    logsumexp and row_topk) equal those of a full log-softmax (the kernels off), with every kind of mask."""
    calls = {"row_candidates": 0, "logsumexp": 0}
    for name in calls:
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _real=real, _name=name: calls.update({_name: calls[_name] + 1})
                            or _real(*a))  # fmt: skip
    for seed in range(6):
        model, src = random_model(seed), random_src(seed, n=5)
        kw = {"beam": 4, "nbest": 4, "max_len_a": 1.0, "max_len_b": 6, **options}
        got = beam_search(model, src, **kw)
        with fastpaths.override(kernels=False):
            same(got, beam_search(model, src, **kw), tol=1e-5)
    built = kernels.compiled() is not None
    assert bool(calls["row_candidates"]) == built  # the one-kernel path ran at the usual steps ...
    if options:  # ... and two calls where rows mask different tokens
        assert bool(calls["logsumexp"]) == built


@pytest.mark.parametrize("options", [{}, {"min_len": 3, "no_repeat_ngram": 2}, {"max_len_b": 2}])
def test_greedy_search_from_logits_equals_greedy_search_from_log_probs(options, monkeypatch):
    """Greedy search's token and log-probability from row_candidates (k = 1), where every row masks the same
    tokens, equal the argmax of the full log-softmax and its value, with every kind of mask."""
    calls = []
    real = kernels.row_candidates
    monkeypatch.setattr(kernels, "row_candidates", lambda *a: calls.append(1) or real(*a))
    for seed in range(6):
        model, src = random_model(seed), random_src(seed, n=5)
        kw = {"max_len_a": 1.0, "max_len_b": 6, **options}
        got = greedy_search(model, src, **kw)
        with fastpaths.override(kernels=False):
            want = greedy_search(model, src, **kw)
        assert [h.tokens for h in got] == [h.tokens for h in want]
        for a, b in zip(got, want, strict=True):
            assert a.log_prob == pytest.approx(b.log_prob, abs=1e-5)
    assert bool(calls) == (kernels.compiled() is not None)  # the kernel path ran


def test_beam_step_takes_top_2k_across_beams():
    log_probs = torch.log(torch.tensor([[[0.1, 0.2, 0.7], [0.5, 0.4, 0.1]]]))  # (N=1, beam=2, V=3)
    scores = torch.log(torch.tensor([[0.5, 0.5]]))
    s, tokens, beams = beam_step(log_probs, scores, 4)
    assert torch.allclose(s.exp(), torch.tensor([[0.35, 0.25, 0.2, 0.1]]))
    assert tokens.tolist() == [[2, 0, 1, 1]] and beams.tolist() == [[0, 1, 1, 0]]
    # empty beam slots (-inf) never produce valid candidates
    s, _, beams = beam_step(log_probs, torch.tensor([[0.0, float("-inf")]]), 4)
    assert beams[0, :3].tolist() == [0, 0, 0] and torch.isinf(s[0, 3])


def test_length_penalty_is_gnmt_or_a_power_of_the_length():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(7, 0.0) == 1.0
    assert length_penalty(7, 0.6, "length") == pytest.approx(7.0**0.6)
    assert length_penalty(7, 1.0, "length") == 7.0
    assert length_penalty(7, 0.0, "length") == 1.0
    assert length_penalty(torch.tensor([1.0, 4.0]), 0.5, "length").tolist() == [1.0, 2.0]


def test_filter_logits_top_k_and_top_p():
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(filter_logits(lp, top_k=2)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(lp, top_p=0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(lp, top_p=0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(filter_logits(lp, top_p=0.1)).tolist() == [[True, False, False, False]]


# ----------------------------------------------------------------------------------------------------------------------
# random models


def random_model(seed: int, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("test", src_vocab_size=16, tgt_vocab_size=16, **overrides)
    return Transformer(cfg).eval()


def random_src(seed: int, n: int = 4, max_len: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n,), generator=g).tolist()
    rows = [[*torch.randint(4, 16, (k,), generator=g).tolist(), EOS_ID] for k in lengths]
    width = max(map(len, rows))
    return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])


def same(a: list[list[Hypothesis]], b: list[list[Hypothesis]], tol: float = 1e-4) -> None:
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]
    for x, y in zip(a, b):
        for h, k in zip(x, y):
            assert h.score == pytest.approx(k.score, abs=tol) and h.log_prob == pytest.approx(k.log_prob, abs=tol)


@pytest.mark.parametrize(("alpha", "norm"), [(0.0, "gnmt"), (0.6, "gnmt"), (1.0, "length")])
def test_cache_equals_no_cache(alpha, norm):
    for seed in range(12):
        model, src = random_model(seed), random_src(seed)
        kw = dict(beam=4, nbest=4, length_penalty=alpha, length_norm=norm, max_len_a=1.0, max_len_b=3)
        same(beam_search(model, src, **kw), beam_search(model, src, **kw, use_cache=False), tol=1e-5)


@pytest.mark.skipif(not fastpaths.settings.kernels, reason="TRANSDUCE_KERNELS=0: no cache stored by position")
def test_cache_stored_by_position_equals_no_cache(monkeypatch):
    """With the kernels, long sources get a self-attention cache stored by position (never gathered); searches
    through it (beams re-ordered, finished sentences dropped, the storage grown past its first capacity) equal
    searches without a cache."""
    from transduce.model import step as step_module

    monkeypatch.setattr(fastpaths.settings, "by_position_min_source", 0)  # the test's sources are short
    for seed in range(6):
        model, src = random_model(seed), random_src(seed, n=5)
        tables = []
        decode = model.decode

        def recording_decode(tokens, memory, cache=None, _decode=decode, _tables=tables):
            logits, new = _decode(tokens, memory, cache)
            _tables.append(None if cache is None else new.table is not None)  # (no cache: a search without one)
            return logits, new

        monkeypatch.setattr(model, "decode", recording_decode)
        long = seed % 2 == 1  # outputs past FIRST_CAPACITY (16) positions: the storage doubles mid-search
        lengths = dict(max_len_a=0.0, max_len_b=24, min_len=18) if long else dict(max_len_a=1.0, max_len_b=5)
        kw = dict(beam=4, nbest=4, length_penalty=0.6, **lengths)
        same(beam_search(model, src, **kw), beam_search(model, src, **kw, use_cache=False), tol=1e-5)
        greedy = greedy_search(model, src, **lengths)
        assert [h.tokens for h in greedy] == [h[0].tokens for h in beam_search(model, src, beam=1, **lengths)]
        cached = [t for t in tables if t is not None]
        assert cached and all(cached)  # every cached step went through the storage by position
        if long:
            assert max(len(h.tokens) for h in greedy) > step_module.FIRST_CAPACITY


def test_cache_equals_no_cache_pre_norm_learned_positions():
    for seed in range(4):
        model, src = random_model(seed, norm="pre", positions="learned", max_positions=8), random_src(seed)
        kw = dict(beam=3, nbest=3, max_len_b=20)  # capped at max_positions - 1 = 7 tokens
        got = beam_search(model, src, **kw)
        same(got, beam_search(model, src, **kw, use_cache=False), tol=1e-5)
        assert all(len(h.tokens) <= 7 for hyps in got for h in hyps)


def test_scores_equal_full_forward_log_probs():
    for seed in range(6):
        model, src = random_model(seed), random_src(seed)
        for alpha, norm in ((0.0, "gnmt"), (0.6, "gnmt"), (1.0, "length")):
            results = beam_search(model, src, beam=4, nbest=4, length_penalty=alpha, length_norm=norm, max_len_b=4)
            for i, hyps in enumerate(results):
                recomputed = rescore(model, src[i : i + 1].expand(len(hyps), -1), [h.tokens for h in hyps])
                for h, r in zip(hyps, recomputed):
                    assert h.log_prob == pytest.approx(r, abs=1e-4)
                    penalty = length_penalty(len(h.tokens) + 1, alpha, norm)
                    assert h.score == pytest.approx(r / penalty, abs=1e-4)
        greedy = greedy_search(model, src, max_len_b=4)
        assert [h.log_prob for h in greedy] == pytest.approx(rescore(model, src, [h.tokens for h in greedy]), abs=1e-4)


def test_beam_one_equals_greedy():
    # with alpha = 0 a beam of one is greedy; with a length penalty it may legitimately keep searching for a longer
    # hypothesis whose normalised score is better
    for seed in range(10):
        model, src = random_model(seed), random_src(seed)
        greedy = greedy_search(model, src, max_len_b=5)
        beam = beam_search(model, src, beam=1, length_penalty=0.0, max_len_b=5)
        same([[h] for h in greedy], beam)


def test_batched_equals_one_by_one():
    for seed in range(5):
        model, src = random_model(seed), random_src(seed, n=6)
        batched = beam_search(model, src, beam=4, nbest=2, max_len_b=4)
        for i in range(src.shape[0]):
            row = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]  # without padding
            same([batched[i]], beam_search(model, row, beam=4, nbest=2, max_len_b=4))


def test_min_len_and_no_repeat_ngram_are_respected():
    for seed in range(5):
        model, src = random_model(seed), random_src(seed)
        for hyps in beam_search(model, src, beam=3, nbest=3, min_len=4, no_repeat_ngram=2, max_len_b=8):
            for h in hyps:
                assert len(h.tokens) >= 4
                bigrams = list(zip(h.tokens, h.tokens[1:]))
                assert len(bigrams) == len(set(bigrams))
        for h in greedy_search(model, src, no_repeat_ngram=1, max_len_b=8):
            assert len(h.tokens) == len(set(h.tokens))


def test_special_ids_never_generated_and_lengths_bounded():
    model, src = random_model(3), random_src(3)
    limits = max_lengths(model, src, 1.0, 2)
    for hyps, limit in zip(beam_search(model, src, beam=4, nbest=4, max_len_b=2), limits.tolist()):
        for h in hyps:
            assert len(h.tokens) <= limit and not {PAD_ID, BOS_ID, EOS_ID} & set(h.tokens)


def test_generate_dispatches_on_config():
    model, src = random_model(1), random_src(1)
    cfg = DecodeConfig(beam=1, max_len_b=4)
    assert [h[0].tokens for h in generate(model, src, cfg)] == [
        h.tokens for h in greedy_search(model, src, max_len_b=4)
    ]
    cfg = DecodeConfig(beam=3, nbest=2, max_len_b=4)
    same(generate(model, src, cfg), beam_search(model, src, beam=3, nbest=2, max_len_b=4))
    cfg = DecodeConfig(beam=3, nbest=2, max_len_b=4, early_stopping=True)
    same(generate(model, src, cfg), beam_search(model, src, beam=3, nbest=2, max_len_b=4, early_stopping=True))
    cfg = DecodeConfig(beam=3, nbest=2, max_len_b=4, length_penalty=1.0, length_norm="length")
    want = beam_search(model, src, beam=3, nbest=2, max_len_b=4, length_penalty=1.0, length_norm="length")
    same(generate(model, src, cfg), want)
    assert want != beam_search(model, src, beam=3, nbest=2, max_len_b=4, length_penalty=1.0)  # the scores differ
    oracle = Oracle([TABLE_B])
    generate(oracle, src_for(0), DecodeConfig(beam=2, max_len_b=10, early_stopping=True))
    assert oracle.calls == 2
    cfg = DecodeConfig(sampling=True, nbest=3, top_k=4, max_len_b=4)
    a = generate(model, src, cfg, generator=torch.Generator().manual_seed(7))
    b = generate(model, src, cfg, generator=torch.Generator().manual_seed(7))
    assert all(len(x) == 3 for x in a)
    same(a, b)


def test_empty_batch():
    model = random_model(0)
    empty = torch.empty(0, 3, dtype=torch.long)
    assert beam_search(model, empty) == [] and greedy_search(model, empty) == []


# ----------------------------------------------------------------------------------------------------------------------
# a trained model


@pytest.mark.slow
def test_trained_reversal_model_is_exact():
    model = reversal_model()
    src, _, tgt_out = task_batch(random.Random(123), 64)
    expected = [[t for t in row.tolist() if t > 3] for row in tgt_out]
    assert [h.tokens for h in greedy_search(model, src)] == expected
    beams = beam_search(model, src, beam=4, nbest=4)
    assert [hyps[0].tokens for hyps in beams] == expected
    assert [hyps[0].tokens for hyps in beam_search(model, src, use_cache=False)] == expected


def test_searches_pause_the_garbage_collector_and_restore_it(monkeypatch):
    import gc

    model, src = random_model(0), random_src(0)
    seen = []
    decode = model.decode

    def recording_decode(*args, **kwargs):
        seen.append(gc.isenabled())
        return decode(*args, **kwargs)

    monkeypatch.setattr(model, "decode", recording_decode)
    assert gc.isenabled()
    beam_search(model, src, beam=2)
    greedy_search(model, src)
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()  # off before the search: stays off after it
    try:
        beam_search(model, src, beam=2)
        assert not gc.isenabled()
    finally:
        gc.enable()

    def failing_decode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(model, "decode", failing_decode)
    with pytest.raises(RuntimeError, match="boom"):
        beam_search(model, src, beam=2)
    assert gc.isenabled()  # back on after a failed search too


@pytest.mark.parametrize("limit", [0.0, 3600.0])
def test_searches_that_keep_overlapping_still_collect_garbage(monkeypatch, limit):
    """A search that ends inside a pause kept up by another (a busy server's threads; here one nested in the other's
    step) runs a full collection once the shared pause has lasted pause_gc_limit_s, and none before."""
    import gc

    monkeypatch.setattr(fastpaths.settings, "pause_gc_limit_s", limit)
    collected = []
    monkeypatch.setattr(gc, "collect", lambda *args: collected.append(gc.isenabled()) or 0)
    model, src = random_model(0), random_src(0)
    decode, nested = model.decode, []

    def decode_beside_another_search(*args, **kwargs):
        if not nested:
            nested.append(True)
            greedy_search(model, src)  # begins and ends while the outer search holds the pause
        return decode(*args, **kwargs)

    monkeypatch.setattr(model, "decode", decode_beside_another_search)
    assert gc.isenabled()
    beam_search(model, src, beam=2)
    assert collected == ([False] if limit == 0.0 else [])  # collected during the pause (still off), or not at all
    assert gc.isenabled()
