"""Greedy decoding and sampling: one hypothesis per row, extended one token per step over the KV cache; rows that
produce EOS are dropped from the batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from transduce.search.candidates import RowCandidates
from transduce.search.common import (
    NEG_INF,
    Hypothesis,
    SearchModel,
    check_length_penalty,
    constrain,
    final_score,
    follow_the_constraint,
    gc_paused,
    max_lengths,
    next_token_log_probs,
)
from transduce.search.constraints import SearchConstraint

# (R, V) masked log-probabilities, (R,) the rows' indices among the search's rows (sentence-major) -> (R,) chosen ids
Picker = Callable[[Tensor, Tensor], Tensor]


def _decode_rows(
    model: SearchModel,
    src: Tensor,
    pick: Picker | None,
    *,
    copies: int,
    length_penalty: float,
    length_norm: str,
    max_len_a: float,
    max_len_b: int,
    min_len: int,
    no_repeat_ngram: int,
    constraint: SearchConstraint | None = None,
) -> list[Hypothesis]:
    """Extend ``copies`` rows per sentence until each produces EOS; returns the rows' hypotheses in row order
    (sentence-major). ``pick`` None: the most likely token (greedy search). ``constraint``: over the sentences'
    rows (B), repeated here into ``copies`` rows each."""
    check_length_penalty(length_penalty, length_norm)
    cfg = model.config
    device = src.device
    rows = src.shape[0] * copies
    if rows == 0:
        return []
    memory = model.encode(src)
    expand = torch.arange(src.shape[0], device=device).repeat_interleave(copies)
    cache: Any = model.init_cache(memory).reorder(expand)
    memory = memory.index_select(expand)
    row_limit = max_lengths(model, src, max_len_a, max_len_b).index_select(0, expand)
    if constraint is not None:
        constraint = constraint.reorder(expand)
    alive = torch.arange(rows, device=device)
    history = torch.empty(rows, 0, dtype=torch.long, device=device)
    acc = torch.float32 if device.type == "mps" else torch.float64  # (mps has no float64)
    log_prob = torch.zeros(rows, dtype=acc, device=device)
    tokens_in = torch.full((rows, 1), cfg.bos_id, dtype=torch.long, device=device)
    out: list[Hypothesis | None] = [None] * rows
    one_pass = RowCandidates(cfg, min_len, device)
    step = 0
    while True:
        logits, cache = model.decode(tokens_in, memory, cache)
        last = logits[:, -1]  # (R, V)
        limits = dict(config=cfg, max_len=row_limit, min_len=min_len, history=history, no_repeat_ngram=no_repeat_ngram)
        # greedy search takes each row's best token and its log-probability from the logits through the kernels
        # (row_candidates, k = 1: the row's logsumexp and its largest allowed logit, one pass over the row) where they
        # apply and every row masks the same tokens, else from a full log-softmax
        found = one_pass(last, 1, step, limits) if pick is None and constraint is None else None
        if found is not None:
            normaliser, best, token = found
            chosen, chosen_lp = token[:, 0], best[:, 0] - normaliser  # (R,)
        else:
            raw = next_token_log_probs(logits)
            log_probs = constrain(raw.clone() if constraint is not None else raw, step, **limits)
            if constraint is not None:
                constraint.mask(log_probs, step, row_limit)
                follow_the_constraint(log_probs, raw, constraint, step, limits)
            chosen = log_probs.argmax(dim=-1) if pick is None else pick(log_probs, alive)  # (R,)
            chosen_lp = log_probs.gather(1, chosen[:, None]).squeeze(1)
        log_prob += chosen_lp.to(acc)
        ended = chosen.eq(cfg.eos_id)
        if bool(ended.any()):
            idx = ended.nonzero().squeeze(1)
            prefixes = history.index_select(0, idx).tolist()  # (one read for all: an element read per row costs)
            for prefix, row, lp in zip(prefixes, alive[idx].tolist(), log_prob[idx].tolist()):
                out[row] = Hypothesis(prefix, final_score(lp, step + 1, length_penalty, length_norm), lp)
            keep = (~ended).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            alive, history, log_prob = alive[keep], history[keep], log_prob[keep]
            chosen, row_limit = chosen[keep], row_limit[keep]
            memory, cache = memory.index_select(keep), cache.select(keep)
            if constraint is not None:
                constraint = constraint.reorder(keep)
        if constraint is not None:
            constraint = constraint.advance(chosen)
        tokens_in = chosen[:, None]
        history = torch.cat([history, tokens_in], dim=1)
        step += 1
    return out  # type: ignore[return-value]


@gc_paused
@torch.inference_mode()
def greedy_search(
    model: SearchModel,
    src: Tensor,
    *,
    length_penalty: float = 0.0,
    length_norm: str = "gnmt",
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 0,
    no_repeat_ngram: int = 0,
    constraint: SearchConstraint | None = None,
) -> list[Hypothesis]:
    """The most likely next token at every step.

    Args:
        model: a :class:`SearchModel` in eval mode.
        src: (B, S) source ids, right-padded, each row ending with EOS.
        length_penalty, length_norm: only change the reported ``score``, never the tokens.
        max_len_a, max_len_b, min_len, no_repeat_ngram, constraint: as for :func:`transduce.search.beam_search`.
    Returns:
        One hypothesis per sentence.
    """
    return _decode_rows(
        model, src, None, copies=1, length_penalty=length_penalty, length_norm=length_norm,
        max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len, no_repeat_ngram=no_repeat_ngram,
        constraint=constraint,
    )  # fmt: skip


def filter_logits(log_probs: Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Temperature, top-k and nucleus (top-p) filtering of next-token log-probabilities.

    Args:
        log_probs: (R, V).
        temperature: divides the log-probabilities (> 0).
        top_k: keep the k most likely tokens (0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p`` (1: all).
    Returns:
        (R, V) logits to sample from (-inf where filtered out); the most likely token always survives.
    """
    logits = log_probs / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p  # mass before this token already reaches top_p
        logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), NEG_INF)
    return logits


@gc_paused
@torch.inference_mode()
def sample(
    model: SearchModel,
    src: Tensor,
    *,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    length_penalty: float = 0.0,
    length_norm: str = "gnmt",
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_len: int = 0,
    no_repeat_ngram: int = 0,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    constraint: SearchConstraint | None = None,
) -> list[list[Hypothesis]]:
    """Ancestral sampling with temperature, top-k and top-p. Scores are the model's own log-probabilities of the
    sampled tokens (temperature and filtering only decide what is drawn).

    Args:
        num_samples: samples per sentence.
        generator: a seeded ``torch.Generator`` for reproducible samples of this batch; or one CPU generator per
            sentence, from which that sentence's rows draw one uniform number each per step (inverse-CDF sampling),
            so that a sentence's samples depend on its generator alone, not on the other sentences of the batch.
        constraint: as for :func:`transduce.search.beam_search`.
    Returns:
        For each sentence, its samples sorted by score, best first.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    per_sentence = generator is not None and not isinstance(generator, torch.Generator)
    if per_sentence and len(generator) != src.shape[0]:  # type: ignore[arg-type]
        raise ValueError(f"generator: {len(generator)} generators for {src.shape[0]} sentences")  # type: ignore[arg-type]

    def pick(log_probs: Tensor, rows: Tensor) -> Tensor:
        probs = filter_logits(log_probs, temperature=temperature, top_k=top_k, top_p=top_p).softmax(dim=-1)
        if not per_sentence:
            return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # type: ignore[arg-type]
        # each row draws from its sentence's generator, in row order: the same draws in any batch
        u = [torch.rand((), generator=generator[r // num_samples]) for r in rows.tolist()]  # type: ignore[index]
        cum = probs.double().cumsum(dim=-1)  # (R, V)
        target = torch.stack(u).to(cum) * cum[:, -1:].squeeze(1)  # (R,) in [0, total)
        # the first token whose cumulative mass exceeds the target: never one of probability 0
        return torch.searchsorted(cum, target[:, None], right=True).squeeze(1).clamp(max=cum.shape[1] - 1)

    rows = _decode_rows(
        model, src, pick, copies=num_samples, length_penalty=length_penalty, length_norm=length_norm,
        max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len, no_repeat_ngram=no_repeat_ngram,
        constraint=constraint,
    )  # fmt: skip
    groups = [rows[i : i + num_samples] for i in range(0, len(rows), num_samples)]
    return [sorted(g, key=lambda h: -h.score) for g in groups]
