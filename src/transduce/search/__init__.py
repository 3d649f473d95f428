"""Searching for translations: pure functions over a model and an encoded batch of source sentences.

- :func:`beam_search`: the paper's decoding (beam 4, GNMT length penalty 0.6, input length + 50), batched over
  sentences x beams with the KV cache; n-best lists.
- :func:`greedy_search`, :func:`sample` (temperature, top-k, top-p).
- :func:`generate`: one entry point driven by a :class:`transduce.config.DecodeConfig`.
- :func:`rescore`: the log-probability of given hypotheses by one full forward pass.

Lengths, scores and the ids conventions are described in :mod:`transduce.search.common`. The model must be in eval
mode (searches never change it); every search runs under ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from transduce.config import DecodeConfig
from transduce.search.beam import beam_search, beam_step
from transduce.search.common import Hypothesis, SearchModel, length_batches, length_penalty, max_lengths, rescore
from transduce.search.constraints import SearchConstraint
from transduce.search.greedy import filter_logits, greedy_search, sample

__all__ = [
    "Hypothesis",
    "SearchConstraint",
    "SearchModel",
    "beam_search",
    "beam_step",
    "filter_logits",
    "generate",
    "greedy_search",
    "length_batches",
    "length_penalty",
    "max_lengths",
    "rescore",
    "sample",
]


def generate(
    model: SearchModel,
    src: Tensor,
    cfg: DecodeConfig,
    *,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    constraint: SearchConstraint | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch as ``cfg`` says: sampling when ``cfg.sampling``, greedy when ``cfg.beam == 1``, else beam search.

    Args:
        model: a :class:`SearchModel` in eval mode.
        src: (B, S) source ids, right-padded, each row ending with EOS.
        cfg: the decoding configuration.
        generator: random generator for sampling, or one per sentence (see :func:`sample`); default with
            ``cfg.seed``: one per sentence seeded with it, so that a sentence's samples do not depend on its batch.
        constraint: a further rule on the next token, one row per sentence of ``src`` (None: none, as for
            translation); see :mod:`transduce.search.constraints`.
    Returns:
        For each sentence, a list of hypotheses, best first (``cfg.nbest`` of them; one for greedy).
    """
    lengths = dict(max_len_a=cfg.max_len_a, max_len_b=cfg.max_len_b, min_len=cfg.min_len)
    common = dict(
        length_penalty=cfg.length_penalty, length_norm=cfg.length_norm, no_repeat_ngram=cfg.no_repeat_ngram,
        constraint=constraint, **lengths,
    )  # fmt: skip
    if cfg.sampling:
        if generator is None and cfg.seed is not None:
            generator = [torch.Generator().manual_seed(cfg.seed) for _ in range(src.shape[0])]
        return sample(
            model, src, num_samples=cfg.nbest, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
            generator=generator, **common,
        )  # fmt: skip
    if cfg.beam == 1:
        return [[h] for h in greedy_search(model, src, **common)]
    return beam_search(model, src, beam=cfg.beam, nbest=cfg.nbest, early_stopping=cfg.early_stopping, **common)
