"""A search step's candidates from the decoder's logits: the next token's log-probabilities with the rules on the
next token applied, and the best extensions of each sentence's hypotheses, through transduce's kernels
(:mod:`transduce.model.kernels`) where they apply and PyTorch's operations elsewhere, the same candidates either way.

- :func:`beam_row_tops`: beam search's candidates from the kernels, each row's best masked logits and its
  normaliser (:func:`candidates_from_row_tops` or the ``beam_advance`` kernel take the candidates from them);
  :func:`candidates_from_log_probs` the same candidates with PyTorch's operations.
- :class:`RowCandidates`: each row's normaliser and best logits in one kernel pass, for beam search and greedy
  search at the steps where every row masks the same tokens.
- :func:`top_candidates`: the top-k over beam x V that the PyTorch path ends with (and ``beam_step``).

The kernels' paths read the logits twice (each row's normaliser, then its best logits) or once (both a row at a
time), where a log-softmax written out, the scores added and a top-k over beam x V took five passes
(docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from transduce import fastpaths
from transduce.model import bf16, kernels, quantize
from transduce.model.step import decode_step
from transduce.search.common import (
    NEG_INF,
    always_masked,
    constrain,
    follow_the_constraint,
    masks_rows_alike,
    next_token_log_probs,
)
from transduce.search.constraints import SearchConstraint


def beam_row_tops(
    logits: Tensor,
    scores: Tensor,
    size: int,
    step: int,
    limits: dict[str, Any],
    one_pass: RowCandidates,
    constraint: SearchConstraint | None = None,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """What a beam step takes its candidates from where the kernels apply (float32 CPU logits with dense rows): the
    ``min(size, V)`` largest logits of each row of the last position of ``logits`` (rows, T, V), masked by
    :func:`constrain` (``limits``: its keywords) and by ``constraint``, and their tokens, largest first, and each
    row's normaliser (the logsumexp of the model's logits, before the masks), as ``(values, tokens, normalisers)``;
    ``scores`` (N, width) are the live hypotheses' cumulative log-probabilities (-inf for empty beam slots), ``width``
    rows per sentence. Within a row the log-probability is ``logit - normaliser``, a shift that keeps the row's
    order, so a sentence's best candidates are among its rows' best logits (:func:`candidates_from_row_tops`,
    ``beam_advance``). ``one_pass`` (:class:`RowCandidates`, made once per search) where every row masks the same
    tokens and there is no constraint (the usual step); else each row's normaliser (:func:`transduce.model.kernels.
    logsumexp`), the masks on the logits and :func:`transduce.model.kernels.row_topk`. The logits are overwritten.
    None where the kernels do not apply: then :func:`candidates_from_log_probs`."""
    last = logits[:, -1]  # (rows, V)
    found = one_pass(last, size, step, limits) if constraint is None else None
    if found is not None:
        normaliser, values, tokens = found
        return values, tokens, normaliser
    if kernels.applies(last) and last.is_contiguous():
        normaliser = kernels.logsumexp(last)  # of the model's distribution, before the rules mask tokens
        _mask_next_tokens(last, scores, step, limits, constraint)
        values, tokens = kernels.row_topk(last, min(size, last.shape[1]))  # (N * beam, k), largest first
        return values, tokens, normaliser
    return None


def candidates_from_log_probs(
    logits: Tensor, scores: Tensor, size: int, step: int, limits: dict[str, Any], constraint: SearchConstraint | None
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`~transduce.search.beam.beam_step` over the masked log-softmax of the last position of ``logits`` with
    PyTorch's operations (where :func:`beam_row_tops` does not apply): the log-softmax written in place, the masks,
    the scores added in place (beam_step's sum, without another (N, width, V) tensor) and :func:`top_candidates`.
    The same candidates as the kernels' paths up to float rounding and the order of equal scores."""
    log_probs = next_token_log_probs(logits)
    _mask_next_tokens(log_probs, scores, step, limits, constraint)
    total = log_probs.view(*scores.shape, -1).add_(scores[:, :, None])  # beam_step's sum, in place
    return top_candidates(total, size)


def _mask_next_tokens(
    next_scores: Tensor, scores: Tensor, step: int, limits: dict[str, Any], constraint: SearchConstraint | None
) -> None:
    """Mask ``next_scores`` (rows, V; logits or log-probabilities) in place: :func:`constrain`'s rules, then the
    constraint's, relaxed by :func:`follow_the_constraint` for sentences left with no token (the live rows: those of
    finite ``scores``)."""
    raw = next_scores.clone() if constraint is not None else next_scores
    constrain(next_scores, step, **limits)
    if constraint is not None:
        constraint.mask(next_scores, step, limits["max_len"])
        live = scores.isfinite().view(-1)
        follow_the_constraint(next_scores, raw, constraint, step, limits, scores.shape[1], live)


class RowCandidates:
    """A search's next-token candidates in one kernel pass over the logits (:func:`transduce.model.kernels.
    row_candidates`: each row's logsumexp, then :func:`always_masked` set to -inf, then its ``k`` largest logits),
    for the steps where that applies: float32 CPU logits with dense rows, the kernels built, and every row masked
    alike (:func:`masks_rows_alike`). The masked ids are made once per search.

    With ``model`` (a beam search's, when nothing else masks its tokens): where the model's pre-softmax projection
    has bf16 or int8 products in the AMX tiles, :meth:`step` makes the decoding step's logits and reduces them in one
    kernel (:func:`_fused_output`) without writing them."""

    def __init__(self, config: Any, min_len: int, device: torch.device, model: Any = None):
        self.min_len = min_len
        # [from min_len on, before it]
        self.masked = [torch.tensor(always_masked(config, m, min_len), device=device) for m in (min_len, 0)]
        self.fused = _fused_output(model) if model is not None else None

    def step(
        self, model: Any, tokens: Tensor, cache: Any, k: int, step: int, limits: dict[str, Any]
    ) -> tuple[tuple[Tensor, Tensor, Tensor], Any] | None:
        """The decoding step for ``tokens`` (rows, 1) with ``cache`` and this call's result for its logits, as
        ``((normalisers, values, tokens), new cache)``, through the fused projection; None where it does not apply
        (no fused projection, or rows masked differently at this step): then the caller decodes as usual."""
        if self.fused is None or not masks_rows_alike(step, **limits):
            return None
        states, cache = decode_step(model, tokens, cache, logits=False)  # (rows, d_model)
        vocab = model.config.tgt_vocab_size
        return self.fused(states, min(k, vocab), self.masked[step < self.min_len]), cache

    def __call__(self, last: Tensor, k: int, step: int, limits: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor] | None:
        """``(normalisers (R,), values (R, k'), tokens (R, k'))`` with ``k' = min(k, V)`` for the logits ``last``
        (R, V), masked in place; None where the kernel does not apply (``limits``: :func:`constrain`'s keywords)."""
        if not (kernels.applies(last) and last.is_contiguous() and masks_rows_alike(step, **limits)):
            return None
        return kernels.row_candidates(last, min(k, last.shape[1]), self.masked[step < self.min_len])


def _fused_output(model: Any) -> Any:
    """The pre-softmax projection of ``model`` with the reduction of its logits to a step's candidates in the AMX
    tiles, the logits never written, where a search's steps can use it (``fastpaths.settings.fused_candidates``): a
    :class:`~transduce.model.Transformer` in inference (not an ensemble) decoding through the step function and the
    kernels (float32 on the CPU, no autocast) whose projection has bf16 products
    (:func:`transduce.model.bf16.candidates_function`) or int8 ones (:func:`transduce.model.quantize.
    candidates_function`) in the AMX kernels; else None."""
    output = getattr(model, "output", None)
    paths = fastpaths.settings
    if not (paths.fused_candidates and paths.step_function and hasattr(model, "decoder_layers")) or model.training:
        return None
    if not kernels.applies(model.tgt_embed.weight) or model.tgt_embed.weight.dtype != torch.float32:
        return None
    if torch.is_autocast_enabled("cpu") or torch.is_grad_enabled():
        return None
    if type(output) is bf16.BF16Linear:
        return bf16.candidates_function(output)
    return quantize.candidates_function(output)


_CHUNKS = (64, 32, 16)  # chunk sizes tried by _chunked_topk, largest first


def _chunked_topk(flat: Tensor, size: int) -> tuple[Tensor, Tensor] | None:
    """``flat.topk(size, dim=1)`` for (N, M) rows with M much larger than ``size``, or None where it does not
    apply (M not a multiple of a chunk size, or too few chunks).

    Each row is cut into chunks of c consecutive values; the ``size`` best values of a row lie in the ``size``
    chunks with the largest maxima (a value outside them is beaten by at least ``size`` chunk maxima, each a
    different value), so one vectorised max per chunk and a top-k over ``size * c`` values replace the top-k over
    the whole row. On this project's machine (one thread, 32 x 4 x 8,000 scores, the beam-4 search of a batch of
    32) that took 0.37 ms against 1.67 ms for ``torch.topk``. The values are the same; among equal values the
    indices may differ.
    """
    n, m = flat.shape
    c = next((c for c in _CHUNKS if m % c == 0 and m // c >= size), 0)
    if not c or flat.dtype != torch.float32:
        return None
    chunks = flat.view(n, m // c, c)
    best = chunks.amax(dim=2).topk(size, dim=1).indices  # (N, size): the chunks that hold the best values
    values = chunks.gather(1, best[:, :, None].expand(-1, -1, c)).view(n, size * c)
    top, pos = values.topk(size, dim=1)
    return top, best.gather(1, pos.div(c, rounding_mode="floor")) * c + pos.remainder(c)


def top_candidates(total: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`~transduce.search.beam.beam_step` on ``total`` (N, beam, V), the cumulative scores
    ``scores[:, :, None] + log_probs`` already summed (beam search sums them in place, sparing an (N, beam, V)
    allocation per step)."""
    n, beam, vocab = total.shape
    flat_total = total.view(n, beam * vocab)
    k = min(size, beam * vocab)
    found = _chunked_topk(flat_total, k) if flat_total.is_contiguous() else None
    top_scores, flat = found if found is not None else flat_total.topk(k, dim=1)
    tokens, beams = flat.remainder(vocab), flat.div(vocab, rounding_mode="floor")
    if size > beam * vocab:  # fewer candidates than asked for: pad with invalid ones
        pad = size - beam * vocab
        top_scores = torch.cat([top_scores, top_scores.new_full((n, pad), NEG_INF)], dim=1)
        tokens, beams = (torch.cat([t, t.new_zeros(n, pad)], dim=1) for t in (tokens, beams))
    return top_scores, tokens, beams


def candidates_from_row_tops(
    values: Tensor, tokens: Tensor, normaliser: Tensor, scores: Tensor, size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The rest of :func:`top_candidates_from_logits` once the ``k = min(size, V)`` largest logits of each row
    (``values``, ``tokens``: (N * beam, k), largest first) are known: the best ``size`` of each sentence's beam x k."""
    n, beam = scores.shape
    k = values.shape[1]
    total = values.sub_(normaliser[:, None]).view(n, beam, k).add_(scores[:, :, None]).view(n, beam * k)
    top_scores, flat = total.topk(min(size, beam * k), dim=1)
    cand_tokens, beams = tokens.view(n, beam * k).gather(1, flat), flat.div(k, rounding_mode="floor")
    if size > beam * k:  # fewer candidates than asked for: pad with invalid ones
        pad = size - beam * k
        top_scores = torch.cat([top_scores, top_scores.new_full((n, pad), NEG_INF)], dim=1)
        cand_tokens, beams = (torch.cat([t, t.new_zeros(n, pad)], dim=1) for t in (cand_tokens, beams))
    return top_scores, cand_tokens, beams
