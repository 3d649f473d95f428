"""Beam search as the paper decodes (§6.1), batched over sentences x beams.

Each step extends every live hypothesis of every sentence by one token with one decoder call over the KV cache.
The step policy :func:`beam_step` takes the top ``2 * beam`` candidates of each sentence, so that even when up to
``beam`` of them end with EOS there are still ``beam`` live continuations (fairseq's rule: EOS never starves the
beam). EOS candidates ranked within the top ``beam`` become finished hypotheses; the best ``beam`` non-EOS candidates
stay live. After every selection the cache is re-indexed with the beam each survivor came from; a sentence is done,
and dropped from the batch (cache and memory rows included), when no live hypothesis can beat its finished ones.

A step's candidates are ``beam_step`` over the next token's log-probabilities with the rules on the next token
applied: through transduce's kernels where they apply, each row's best logits
(:func:`transduce.search.candidates.beam_row_tops`), from which :func:`advance` takes the candidates and the
survivors in one more kernel call (``beam_advance``); elsewhere PyTorch's operations
(:func:`transduce.search.candidates.candidates_from_log_probs`), the same selection.

Two things keep the work per step down. The first step decodes one row per sentence (all beams would start from
the same BOS), then each row becomes ``beam`` rows. And the beams of a sentence share one row of cross-attention
keys/values (:class:`transduce.model.DecoderCache` groups): they are neither copied per beam nor re-indexed, and the
decoder attends with a sentence's beam queries together.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from transduce.model import kernels
from transduce.search.candidates import (
    RowCandidates,
    beam_row_tops,
    candidates_from_log_probs,
    candidates_from_row_tops,
    top_candidates,
)
from transduce.search.common import (
    NEG_INF,
    Hypothesis,
    SearchModel,
    check_length_penalty,
    final_score,
    gc_paused,
    max_lengths,
)
from transduce.search.common import length_penalty as penalty
from transduce.search.constraints import SearchConstraint


def beam_step(log_probs: Tensor, scores: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor]:
    """The beam search step policy: the best ``size`` one-token extensions of each sentence's beams.

    Args:
        log_probs: (N, beam, V) log-probabilities of the next token (-inf where not allowed).
        scores: (N, beam) cumulative log-probabilities of the live hypotheses (-inf for empty beam slots).
        size: how many candidates to return per sentence (2 * beam in beam search).
    Returns:
        ``(scores, tokens, beams)``, each (N, size), sorted by score (descending): the cumulative log-probability of
        each candidate, its last token and the beam it extends. Candidates with score -inf are not valid (when
        ``size`` exceeds beam * V, the last ones are such padding, with token 0 and beam 0).
    """
    return top_candidates(scores[:, :, None] + log_probs, size)


def advance(
    candidates: tuple[Tensor, Tensor, Tensor] | None,
    tops: tuple[Tensor, Tensor, Tensor] | None,
    scores: Tensor,
    history: Tensor,
    beam: int,
    eos: int,
) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor, Tensor, Tensor, Tensor, bool, bool | None]:
    """A beam step's selection: from each sentence's ``2 * beam`` candidates (``candidates``, as :func:`beam_step`
    returns them), or from each row's best logits (``tops``: ``(values, tokens, normalisers)``, see
    :func:`transduce.search.candidates.beam_row_tops`), the ``beam`` survivors: the best candidates that do not end
    with EOS, in score order (EOS ones only where fewer are left).

    Returns ``(candidates, scores, source_rows, tokens_in, history, finish, dead)``: the candidates, the survivors'
    scores (N, beam), the rows they extend (N * beam,), their tokens (N * beam, 1) and the history with them
    appended; ``finish``: whether some sentence has an EOS candidate with a finite score within its first ``beam``
    (hypotheses to finish); ``dead``: whether some sentence's best survivor has a score of -inf, or None where not
    worked out. From ``tops`` through the kernels' ``beam_advance`` (the same operations in one call) where they
    apply, else PyTorch's operations."""
    size = 2 * beam
    if tops is not None and kernels.applies(tops[0]) and history.device.type == "cpu":
        kernel = kernels.compiled()
        if kernel is not None:
            values, tokens, normalisers = tops
            tensors, finish, dead = kernel.beam_advance(
                values.contiguous(), tokens.contiguous(), normalisers.contiguous(), scores.contiguous(),
                history.contiguous(), size, beam, eos,
            )  # fmt: skip
            cand_scores, cand_tokens, cand_beams, scores, source_rows, tokens_in, history = tensors
            return (cand_scores, cand_tokens, cand_beams), scores, source_rows, tokens_in, history, finish, dead
    if candidates is None:
        assert tops is not None
        candidates = candidates_from_row_tops(*tops, scores, size)
    cand_scores, cand_tokens, cand_beams = candidates
    cand_eos = cand_tokens.eq(eos)
    finish = bool(to_finish(candidates, beam, eos).any())
    m, width = scores.shape
    offsets = torch.arange(size, device=scores.device)
    rank = torch.where(cand_eos, offsets + size, offsets)  # EOS candidates pushed behind every other one
    pick = rank.topk(beam, dim=1, largest=False).indices  # (m, beam), in score order
    scores = cand_scores.gather(1, pick)
    source_rows = (torch.arange(m, device=scores.device)[:, None] * width + cand_beams.gather(1, pick)).view(-1)
    tokens_in = cand_tokens.gather(1, pick).view(-1, 1)
    history = torch.cat([history.index_select(0, source_rows), tokens_in], dim=1)
    return candidates, scores, source_rows, tokens_in, history, finish, None


def to_finish(candidates: tuple[Tensor, Tensor, Tensor], beam: int, eos: int) -> Tensor:
    """(N, beam) bool: the EOS candidates with a finite score among each sentence's first ``beam``, the hypotheses a
    step finishes."""
    cand_scores, cand_tokens, _ = candidates
    return cand_tokens[:, :beam].eq(eos) & torch.isfinite(cand_scores[:, :beam])


def reorder_beams(cache: Any, index: Tensor) -> Any:
    """``cache.reorder(index)`` for an ``index`` that only moves rows between beams of the same sentence; a cache
    that knows a cheaper way to do that (:meth:`DecoderCache.reorder_beams`) uses it."""
    reorder = getattr(cache, "reorder_beams", None)
    return reorder(index) if reorder is not None else cache.reorder(index)


def repeat_rows(cache: Any, index: Tensor, copies: int) -> Any:
    """``cache.reorder(index)`` for ``index = arange(rows).repeat_interleave(copies)``, each row ``copies`` times in a
    row (the beams after the first step); a cache with ``repeat`` (:meth:`DecoderCache.repeat`, which keeps one
    cross-attention row per sentence) uses it."""
    repeat = getattr(cache, "repeat", None)
    return repeat(copies) if repeat is not None else cache.reorder(index)


class _Finished:
    """The best ``capacity`` finished hypotheses of each sentence, kept sorted by score (best first)."""

    def __init__(self, n: int, capacity: int, device: torch.device):
        self.capacity = capacity
        self.hyps: list[list[Hypothesis]] = [[] for _ in range(n)]
        self.count = torch.zeros(n, dtype=torch.long, device=device)  # by original sentence index
        self.worst = torch.full((n,), NEG_INF, device=device)  # score of the capacity-th best, -inf until full

    def add(self, hyps: list[tuple[int, Hypothesis]]) -> None:
        """Add ``(sentence, hypothesis)`` pairs; ``count`` and ``worst`` are updated once for all of them (a
        tensor write per hypothesis would cost a few operations each, several times per step)."""
        touched = sorted({sentence for sentence, _ in hyps})
        for sentence, hyp in hyps:
            self.hyps[sentence].append(hyp)
        for sentence in touched:
            kept = self.hyps[sentence]
            kept.sort(key=lambda h: -h.score)
            del kept[self.capacity :]
        index = torch.tensor(touched, device=self.count.device)
        counts = [len(self.hyps[sentence]) for sentence in touched]
        self.count[index] = torch.tensor(counts, device=self.count.device)
        worst = [self.hyps[s][-1].score if c == self.capacity else NEG_INF for s, c in zip(touched, counts)]
        self.worst[index] = torch.tensor(worst, device=self.worst.device)


@gc_paused
@torch.inference_mode()
def beam_search(
    model: SearchModel,
    src: Tensor,
    *,
    beam: int = 4,
    length_penalty: float = 0.6,
    length_norm: str = "gnmt",
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 0,
    no_repeat_ngram: int = 0,
    nbest: int = 1,
    early_stopping: bool = False,
    use_cache: bool = True,
    constraint: SearchConstraint | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of source sentences. See :mod:`transduce.search.common` for lengths and scores.

    Args:
        model: a :class:`SearchModel` in eval mode.
        src: (B, S) source ids, right-padded, each row ending with EOS.
        beam: beam size (the paper: 4).
        length_penalty: alpha of the length penalty (the paper: GNMT's, 0.6); 0 ranks by raw log-probability.
        length_norm: the penalty's form: ``"gnmt"`` ``((5 + |Y|) / 6) ** alpha`` (the paper's) or ``"length"``
            ``|Y| ** alpha`` (fairseq's, Hugging Face's, CTranslate2's).
        max_len_a, max_len_b: the maximum output length is ``floor(a * src_len + b)`` tokens before EOS.
        min_len: no EOS before this many tokens.
        no_repeat_ngram: block repeated n-grams of this size (0: off).
        nbest: hypotheses returned per sentence (at most ``beam``).
        early_stopping: stop a sentence as soon as it has ``beam`` finished hypotheses, the rule of fairseq,
            OpenNMT, CTranslate2 (patience 1) and Hugging Face's ``early_stopping=True``; fewer decoder steps, but
            a longer hypothesis that the length penalty would have ranked first can be missed. False (the
            default): stop only when no live hypothesis can beat the finished ones.
        constraint: a further rule on the next token (:class:`transduce.search.constraints.SearchConstraint`), one
            row per sentence of ``src``; e.g. :class:`transduce.parsing.constrained.TreeConstraint` for parsing.
        use_cache: False re-runs the decoder over the whole prefix every step (for the cache equivalence test).
    Returns:
        For each sentence, its ``nbest`` best hypotheses, best first.
    """
    if beam < 1 or not 1 <= nbest <= beam:
        raise ValueError(f"need beam >= 1 and 1 <= nbest <= beam, got beam={beam}, nbest={nbest}")
    check_length_penalty(length_penalty, length_norm)
    cfg = model.config
    device = src.device
    n = src.shape[0]
    if n == 0:
        return []
    alpha = length_penalty
    limit = max_lengths(model, src, max_len_a, max_len_b)  # (n,) by original sentence
    finished = _Finished(n, beam, device)

    # The first step extends only one hypothesis per sentence (the beams would all be the same BOS): `width` rows per
    # sentence, 1 at the first step, then `beam`.
    memory = model.encode(src)
    cache: Any = model.init_cache(memory) if use_cache else None  # cross K/V computed once per sentence
    width = 1
    alive = torch.arange(n, device=device)  # original index of each sentence still in the batch
    scores = torch.zeros(n, 1, device=device)
    history = torch.empty(n, 0, dtype=torch.long, device=device)  # (rows, step) generated tokens
    bos = torch.full((n * beam, 1), cfg.bos_id, dtype=torch.long, device=device)
    tokens_in = bos[:n]
    row_limit = limit
    # (with a bf16 or int8 pre-softmax projection in the AMX tiles, the logits are reduced to the candidates as they
    # are made)
    one_pass = RowCandidates(cfg, min_len, device, model if use_cache and constraint is None else None)

    step = 0
    while True:
        # the next token's logits for every live hypothesis (`width` rows per sentence), and the candidates:
        # beam_step over the next token's log-probabilities, with the rules on the next token applied (through the
        # kernels where they apply: search/candidates.py)
        limits = dict(config=cfg, max_len=row_limit, min_len=min_len, history=history, no_repeat_ngram=no_repeat_ngram)
        fused = one_pass.step(model, tokens_in, cache, 2 * beam, step, limits) if use_cache else None
        candidates = tops = None
        if fused is not None:
            (normaliser, values, row_tokens), cache = fused
            tops = values, row_tokens, normaliser
        else:
            if use_cache:
                logits, cache = model.decode(tokens_in, memory, cache)
            else:
                logits, _ = model.decode(torch.cat([bos[: history.shape[0]], history], dim=1), memory, None)
            tops = beam_row_tops(logits, scores, 2 * beam, step, limits, one_pass, constraint)
            if tops is None:
                candidates = candidates_from_log_probs(logits, scores, 2 * beam, step, limits, constraint)
        # the best `beam` non-EOS candidates stay live (EOS candidates are pushed behind every other one)
        last_history = history
        candidates, scores, source_rows, tokens_in, history, finish, dead = advance(
            candidates, tops, scores, history, beam, cfg.eos_id
        )  # fmt: skip
        cand_scores, _, cand_beams = candidates

        # EOS candidates within the top `beam` (and valid) become finished hypotheses
        if finish:  # (read into Python lists at once: an element read per hypothesis costs)
            idx = to_finish(candidates, beam, cfg.eos_id).nonzero().tolist()
            sents, beams, lps = alive.tolist(), cand_beams.tolist(), cand_scores.tolist()
            rows = torch.tensor([i * width + beams[i][r] for i, r in idx], device=device)
            prefixes = last_history.index_select(0, rows).tolist()
            finished.add([
                (sents[i], Hypothesis(prefix, final_score(lps[i][r], step + 1, alpha, length_norm), lps[i][r]))
                for (i, r), prefix in zip(idx, prefixes)
            ])  # fmt: skip

        # the cache (and the constraint) follow each survivor to the row of the hypothesis it extends
        if constraint is not None:
            constraint = constraint.reorder(source_rows).advance(tokens_in[:, 0])
        if width < beam:  # after the first step: every sentence's row becomes `beam` rows
            row_limit = row_limit.repeat_interleave(beam)
            if use_cache:
                cache = repeat_rows(cache, source_rows, beam)
            else:
                memory = memory.index_select(source_rows)
            width = beam
        elif use_cache:
            cache = reorder_beams(cache, source_rows)
        step += 1

        # done: no live hypothesis left, or `beam` finished ones (that no live one can beat, unless early_stopping).
        # The best a live hypothesis can do is keep its log-probability and reach the longest length (the penalty
        # divides it).
        # (with early stopping, a sentence that finished nothing at this step can only be done for having no live
        # hypothesis left: without either, as the kernel's flags say, there is nothing to check)
        if early_stopping and not finish and dead is False:
            continue
        best_live = scores[:, 0]
        done = finished.count.index_select(0, alive).ge(beam)
        if not early_stopping:
            sent_limit = limit.index_select(0, alive)
            bound = best_live / penalty(sent_limit.float() + 1, alpha, length_norm) if alpha > 0 else best_live
            done &= bound <= finished.worst.index_select(0, alive)
        done |= torch.isinf(best_live)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            rows = (keep[:, None] * beam + torch.arange(beam, device=device)).view(-1)
            alive, scores = alive.index_select(0, keep), scores.index_select(0, keep)
            history, tokens_in = history.index_select(0, rows), tokens_in.index_select(0, rows)
            row_limit = row_limit.index_select(0, rows)
            if constraint is not None:
                constraint = constraint.reorder(rows)
            if use_cache:
                cache = cache.select(rows)
            else:
                memory = memory.index_select(rows)

    return [hyps[:nbest] for hyps in finished.hyps]
