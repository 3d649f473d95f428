"""What every search shares: the hypothesis value, the model protocol, lengths, the length penalty, the constraints
on the next token (special ids, minimum and maximum length, repeated n-grams), the full-forward rescoring and the
batching of sentences for decoding.

Conventions (for every function of :mod:`transduce.search`):

- ``src`` is a (B, S) batch of source ids, right-padded with ``config.pad_id``, each row ending with EOS.
- The decoder starts from BOS; a hypothesis's ``tokens`` exclude BOS and the final EOS. Every hypothesis ends with EOS:
  when the maximum length is reached EOS is forced, and its (possibly low) log-probability is counted.
- ``log_prob`` is the sum of the model's log-probabilities of ``tokens + [EOS]`` (the unmodified distribution:
  constraints and temperature only decide what may be chosen). ``score`` is ``log_prob / lp(|Y|)`` when alpha > 0,
  else ``log_prob``, with the GNMT penalty ``lp(|Y|) = ((5 + |Y|) / 6) ** alpha`` (``length_norm="gnmt"``, the
  paper's) or ``lp(|Y|) = |Y| ** alpha`` (``length_norm="length"``: fairseq's, Hugging Face's and CTranslate2's
  length normalisation; alpha 1 is the average log-probability per token). ``|Y|`` counts the EOS, as in
  tensor2tensor, the implementation the paper used, and in fairseq.
- The maximum output length is ``floor(max_len_a * src_len + max_len_b)`` tokens before the EOS, where ``src_len``
  counts the real source tokens (neither padding nor EOS): the paper's "input length + 50" with a = 1, b = 50.
  Models with learned positions are capped at ``max_positions - 1`` tokens.
"""

from __future__ import annotations

import functools
import gc
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from transduce import fastpaths
from transduce.config import LENGTH_NORMS

NEG_INF = float("-inf")

_paused = {"depth": 0, "was_enabled": False, "since": 0.0}
_paused_lock = threading.Lock()


def gc_paused(search: Callable) -> Callable:
    """Run ``search`` with Python's cyclic garbage collector off (and as it was afterwards).

    A search step creates a few hundred short-lived Python objects (tensors, views, tuples), none in reference
    cycles, and every 700 of them the collector runs: 2% of a beam search on the Multi30k model
    (``fastpaths.settings.pause_gc`` False: no pause). Nested and concurrent searches (the server's threads) share one
    pause: the collector goes back on when the last of them ends, if it was on when the first began. So that searches
    which keep overlapping (a busy server) do not keep it off for good, a search that ends when the shared pause has
    lasted ``fastpaths.settings.pause_gc_limit_s`` runs a full collection and starts the count again. Calls to
    ``gc.enable`` or ``gc.disable`` made during a pause are undone when it ends."""

    @functools.wraps(search)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not fastpaths.settings.pause_gc:
            return search(*args, **kwargs)
        with _paused_lock:
            if _paused["depth"] == 0:
                _paused["was_enabled"] = gc.isenabled()
                _paused["since"] = time.monotonic()
                gc.disable()
            _paused["depth"] += 1
        try:
            return search(*args, **kwargs)
        finally:
            collect, limit = False, fastpaths.settings.pause_gc_limit_s
            with _paused_lock:
                _paused["depth"] -= 1
                if _paused["depth"] == 0:
                    if _paused["was_enabled"]:
                        gc.enable()
                elif _paused["was_enabled"] and time.monotonic() - _paused["since"] >= limit:
                    _paused["since"], collect = time.monotonic(), True
            if collect:
                gc.collect()

    return wrapper


@dataclass(frozen=True)
class Hypothesis:
    """One output of a search.

    Attributes:
        tokens: generated ids, without BOS and without the final EOS.
        score: ``log_prob`` divided by the length penalty when alpha > 0, else ``log_prob``; the ranking score.
        log_prob: sum of the model's log-probabilities of ``tokens`` and the final EOS.
    """

    tokens: list[int]
    score: float
    log_prob: float


class SearchModel(Protocol):
    """What a search needs from a model: :class:`transduce.model.Transformer` implements it, and so does the test
    oracle. ``config`` has ``pad_id``, ``bos_id``, ``eos_id`` and ``tgt_vocab_size``; the cache returned by
    ``init_cache`` / ``decode`` has ``reorder(index)`` and ``select(index)`` returning new caches."""

    config: Any

    def encode(self, src: Tensor) -> Any: ...

    def init_cache(self, memory: Any) -> Any: ...

    def decode(self, tgt: Tensor, memory: Any, cache: Any = None) -> tuple[Tensor, Any]: ...


def length_penalty(length: int | float | Tensor, alpha: float, norm: str = "gnmt") -> Any:
    """The length penalty a hypothesis's log-probability is divided by (1 when alpha is 0): GNMT's
    ``((5 + length) / 6) ** alpha`` (``norm="gnmt"``) or ``length ** alpha`` (``norm="length"``)."""
    if alpha == 0:
        return 1.0 if not isinstance(length, Tensor) else torch.ones_like(length, dtype=torch.float32)
    return (((5 + length) / 6) if norm == "gnmt" else length) ** alpha


def final_score(log_prob: float, length: int, alpha: float, norm: str = "gnmt") -> float:
    """Score of a finished hypothesis of ``length`` tokens, EOS included."""
    return log_prob / length_penalty(length, alpha, norm) if alpha > 0 else log_prob


def source_lengths(src: Tensor, config: Any) -> Tensor:
    """Real source tokens per sentence (neither padding nor EOS).

    Shape: src (B, S) -> (B,) long.
    """
    return (src.ne(config.pad_id) & src.ne(config.eos_id)).sum(dim=1)


def max_lengths(model: SearchModel, src: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """The largest number of tokens (EOS excluded) each sentence may get: ``floor(a * src_len + b)``.

    Shape: src (B, S) -> (B,) long.
    """
    # float64 on the CPU (exact for any length; Apple's mps has no float64), then back to src's device
    real = source_lengths(src, model.config).cpu()
    lengths = torch.floor(real.double() * max_len_a + max_len_b).long().to(src.device)
    if getattr(model.config, "positions", None) == "learned":  # decoder inputs BOS + tokens use positions 0..len
        lengths = lengths.clamp(max=model.config.max_positions - 1)
    return lengths.clamp(min=0)


def constrain(
    log_probs: Tensor,
    step: int,
    *,
    config: Any,
    max_len: Tensor,
    min_len: int,
    history: Tensor,
    no_repeat_ngram: int,
) -> Tensor:
    """Mask (to -inf, in place) the tokens that may not come next; the others keep their log-probability (or logit:
    beam search masks the logits when it takes its candidates from them).

    Rules: PAD, BOS and ``config.suppress_ids`` are never generated; EOS not before ``min_len`` tokens; only EOS
    once ``max_len`` tokens are generated (this wins over ``min_len``); no n-gram of size ``no_repeat_ngram`` twice
    in a hypothesis.

    Args:
        log_probs: (R, V) log-probabilities of the next token for R rows.
        step: tokens generated so far (the same for every row).
        max_len: (R,) long, the maximum length of each row's sentence.
        history: (R, step) the tokens generated so far.
    Returns:
        ``log_probs``, modified.
    """
    eos = config.eos_id
    eos_lp = log_probs[:, eos].clone()
    log_probs[:, always_masked(config, step, min_len)] = NEG_INF
    if no_repeat_ngram > 0 and step >= no_repeat_ngram:
        block_repeated_ngrams(log_probs, history, no_repeat_ngram, fill_id=config.pad_id)
    force = max_len <= step  # (R,)
    if bool(force.any()):
        log_probs.masked_fill_(force[:, None], NEG_INF)
        log_probs[:, eos] = torch.where(force, eos_lp, log_probs[:, eos])
    return log_probs


def follow_the_constraint(
    scores: Tensor,
    raw: Tensor,
    constraint: Any,
    step: int,
    limits: dict[str, Any],
    group: int = 1,
    live: Tensor | None = None,
) -> None:
    """Where :func:`constrain`'s rules and a search constraint together leave a sentence no token at all (a
    complete tree whose EOS ``min_len`` masks, a leaf ``no_repeat_ngram`` blocks), give its rows the constraint's
    choices without ``min_len`` and ``no_repeat_ngram`` (PAD, BOS and the maximum length still hold): the
    constraint is the rule the output must keep, those two are preferences. Without this, greedy search would take
    PAD (the argmax of a row of -inf), sampling would draw from no distribution and beam search would end the
    sentence with no hypothesis. A row still left with nothing gets EOS.

    Args:
        scores: (R, V) logits or log-probabilities masked by :func:`constrain` and the constraint; modified in place.
        raw: (R, V) the same before any masking.
        constraint: the :class:`transduce.search.constraints.SearchConstraint` of the R rows.
        limits: :func:`constrain`'s keyword arguments.
        group: consecutive rows per sentence (a beam's rows); a sentence is relaxed only when none of its live rows
            has a token left.
        live: (R,) bool, the rows whose hypothesis is still in the running (a beam's rows of finite score); None:
            all.
    """
    empty = scores.isneginf().all(dim=-1)  # (R,)
    if live is not None:
        empty &= live
    if not bool(empty.any()):
        return
    blocked = empty if live is None else empty | ~live  # (R,): nothing to extend the row with
    dead = blocked.view(-1, group).all(dim=1).repeat_interleave(group) & empty  # (R,): the stuck sentences' rows
    if not bool(dead.any()):
        return
    relaxed = constrain(raw.clone(), step, **{**limits, "min_len": 0, "no_repeat_ngram": 0})
    constraint.mask(relaxed, step, limits["max_len"])
    scores[dead] = relaxed[dead]
    eos = limits["config"].eos_id
    empty = dead & scores.isneginf().all(dim=-1)
    scores[:, eos] = torch.where(empty, raw[:, eos], scores[:, eos])


def always_masked(config: Any, step: int, min_len: int) -> list[int]:
    """The tokens :func:`constrain` masks in every row at ``step``: PAD, BOS, the model's ``suppress_ids`` (a
    multilingual model's target-language tokens), and EOS before ``min_len``."""
    suppressed = getattr(config, "suppress_ids", ())
    return [config.pad_id, config.bos_id, *suppressed, *([config.eos_id] if step < min_len else [])]


def masks_rows_alike(step: int, *, max_len: Tensor, no_repeat_ngram: int, **_: Any) -> bool:
    """Whether :func:`constrain` masks only :func:`always_masked` at ``step`` (the same tokens in every row): no row
    at its length limit and no n-gram blocking yet. Takes :func:`constrain`'s keyword arguments."""
    return not (no_repeat_ngram > 0 and step >= no_repeat_ngram) and not bool(max_len.le(step).any())


def block_repeated_ngrams(log_probs: Tensor, history: Tensor, n: int, *, fill_id: int) -> None:
    """Set to -inf every token that would complete an n-gram already present in its row's history.

    Args:
        log_probs: (R, V), modified in place.
        history: (R, T) generated tokens, T >= n.
        n: n-gram size.
        fill_id: an id already masked (e.g. PAD) used as a harmless scatter target where nothing is banned.
    """
    if n == 1:
        log_probs.scatter_(1, history, NEG_INF)
        return
    windows = history.unfold(1, n, 1)  # (R, T - n + 1, n): every n-gram so far
    suffix = history[:, history.shape[1] - (n - 1) :]  # (R, n - 1): the prefix the next token would complete
    match = (windows[:, :, :-1] == suffix[:, None, :]).all(dim=-1)  # (R, T - n + 1)
    banned = torch.where(match, windows[:, :, -1], torch.full_like(windows[:, :, -1], fill_id))
    log_probs.scatter_(1, banned, NEG_INF)


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu") -> Tensor:
    """Right-pad lists of ids into a (B, max_len) long tensor."""
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out.to(device)


def length_batches(lengths: Sequence[int], max_tokens: int, width: int = 1) -> Iterator[list[int]]:
    """Group sentences for decoding: indices sorted by length (longest first), cut so that
    ``sentences x width x longest <= max_tokens``, the budget the search's (B * width, S) tensors use.

    Args:
        lengths: each sentence's padded-row length, EOS included.
        max_tokens: the budget (``DecodeConfig.max_tokens``).
        width: hypotheses per sentence in the search (the beam, or the samples).
    Returns:
        Lists of indices into ``lengths``; a sentence alone over the budget gets a batch of its own.
    """
    batch: list[int] = []
    longest = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: equal lengths keep input order
        longest_if = max(longest, lengths[i])
        if batch and (len(batch) + 1) * width * longest_if > max_tokens:
            yield batch
            batch, longest_if = [], lengths[i]
        batch.append(i)
        longest = longest_if
    if batch:
        yield batch


@torch.inference_mode()
def rescore(model: SearchModel, src: Tensor, hypotheses: Sequence[Sequence[int]]) -> list[float]:
    """Sum of the log-probabilities of ``tokens + [EOS]`` for one hypothesis per source row, by one full
    (teacher-forced, uncached) decoder pass: the reference the searches' incremental scores are tested against.

    Args:
        src: (B, S) source ids.
        hypotheses: B token lists (without BOS/EOS).
    Returns:
        B log-probabilities.
    """
    cfg = model.config
    tgt_in = pad_sequences([[cfg.bos_id, *h] for h in hypotheses], cfg.pad_id, src.device)
    target = pad_sequences([[*h, cfg.eos_id] for h in hypotheses], cfg.pad_id, src.device)
    memory = model.encode(src)
    logits, _ = model.decode(tgt_in, memory, None)
    lp = torch.log_softmax(logits.float(), dim=-1).gather(2, target[:, :, None]).squeeze(2)  # (B, T)
    lp = lp.masked_fill(target.eq(cfg.pad_id), 0.0)
    return lp.sum(dim=1).tolist()


def next_token_log_probs(logits: Tensor) -> Tensor:
    """Log-probabilities of the next token from decoder logits (R, T, V): the last position's, in float32, (R, V).

    Computed in place in the logits' memory when they are float32 already: every search step would otherwise
    allocate another (R, V) tensor, and with glibc's malloc each such multi-megabyte allocation comes back from the
    kernel as fresh zeroed pages (it cost as much as the output projection itself in the beam search profile).
    """
    last = logits[:, -1]
    if last.dtype != torch.float32 or not last.is_contiguous():
        return torch.log_softmax(last.float(), dim=-1)
    return torch.log_softmax(last, dim=-1, out=last)  # row-wise: each row is read whole before it is written


def check_length_penalty(alpha: float, norm: str = "gnmt") -> None:
    if not (alpha >= 0 and math.isfinite(alpha)):
        raise ValueError(f"length_penalty must be a finite number >= 0, got {alpha!r}")
    if norm not in LENGTH_NORMS:
        raise ValueError(f"length_norm must be one of {', '.join(LENGTH_NORMS)}, got {norm!r}")
