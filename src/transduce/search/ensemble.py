"""Several models decoding as one: an ensemble of models that share a vocabulary.

At every step each member computes its next-token distribution and the ensemble's is their mean (the mean of the
members' probabilities, as fairseq's and CTranslate2's ensembles do), so an ensemble of one model is that model and
every search (greedy, beam, sampling, constraints) works unchanged. Members are typically the same recipe trained
with different seeds; they may differ in shape, but must have the same source and target vocabularies.

    translator = Translator.load(["runs/en_de_seed1", "runs/en_de_seed2"])
    # the same on the command line: transduce translate --model runs/en_de_seed1 --model runs/en_de_seed2
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce.config import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnsembleMemory:
    """The members' encoder outputs for one batch, in member order."""

    members: tuple[Any, ...]

    def index_select(self, index: Tensor) -> EnsembleMemory:
        return EnsembleMemory(tuple(m.index_select(index) for m in self.members))

    def __len__(self) -> int:
        return len(self.members[0])


@dataclass(frozen=True)
class EnsembleCache:
    """The members' decoder caches; every re-indexing applies to each of them."""

    members: tuple[Any, ...]

    def _map(self, method: str, *args: Any) -> EnsembleCache:
        return EnsembleCache(tuple(getattr(c, method)(*args) for c in self.members))

    def reorder(self, index: Tensor) -> EnsembleCache:
        return self._map("reorder", index)

    def reorder_beams(self, index: Tensor) -> EnsembleCache:
        return self._map("reorder_beams", index)

    def repeat(self, copies: int) -> EnsembleCache:
        return self._map("repeat", copies)

    def select(self, index: Tensor) -> EnsembleCache:
        return self._map("select", index)


class Ensemble(nn.Module):
    """Models with one vocabulary as one :class:`transduce.search.SearchModel`.

    Args:
        models: the members (at least one), :class:`transduce.model.Transformer` or anything with its ``encode``,
            ``init_cache``, ``decode`` and ``config``; their source and target vocabulary sizes and special ids
            must agree (the tokenizers themselves are compared by :func:`check_same_vocabulary`).

    ``decode`` returns the log of the members' mean next-token probabilities, a normalised distribution, where a
    model returns logits: a search normalises either the same way.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        super().__init__()
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        first = models[0].config
        for i, model in enumerate(models[1:], start=2):
            for name in ("src_vocab_size", "tgt_vocab_size", "pad_id", "bos_id", "eos_id"):
                a, b = getattr(first, name), getattr(model.config, name)
                if a != b:
                    raise ConfigError(f"ensemble: model 1 has {name} {a}, model {i} has {b}: the members of an "
                                      "ensemble must share one vocabulary")  # fmt: skip
        self.members = nn.ModuleList(models)
        self.config = _smallest_position_limit([m.config for m in models])

    def __len__(self) -> int:
        return len(self.members)

    def encode(self, src: Tensor) -> EnsembleMemory:
        return EnsembleMemory(tuple(m.encode(src) for m in self.members))

    def init_cache(self, memory: EnsembleMemory) -> EnsembleCache:
        return EnsembleCache(tuple(m.init_cache(mem) for m, mem in zip(self.members, memory.members)))

    def decode(
        self, tgt: Tensor, memory: EnsembleMemory, cache: EnsembleCache | None = None
    ) -> tuple[Tensor, EnsembleCache | None]:
        """(log mean probability over the members, the members' caches); shapes as ``Transformer.decode``."""
        caches = cache.members if cache is not None else (None,) * len(self.members)
        log_probs, new = [], []
        for model, mem, member_cache in zip(self.members, memory.members, caches):
            logits, c = model.decode(tgt, mem, member_cache)
            log_probs.append(F.log_softmax(logits.float(), dim=-1))
            new.append(c)
        if len(log_probs) == 1:
            out = log_probs[0]
        else:
            out = torch.stack(log_probs).logsumexp(dim=0) - math.log(len(log_probs))
        return out, (EnsembleCache(tuple(new)) if cache is not None else None)

    def attention(self, src: Tensor, tgt_in: Tensor) -> Any:
        """The one member's attention weights; an ensemble of several has no one model's weights to show."""
        if len(self.members) == 1:
            return self.members[0].attention(src, tgt_in)
        raise ConfigError(f"attention shows one model's weights; this is an ensemble of {len(self.members)} models")


def _smallest_position_limit(configs: Sequence[Any]) -> Any:
    """The first member's config, as learned positions up to the smallest ``max_positions`` of the members that
    have learned ones: the searches and the translator bound input and output lengths by the ensemble's config, and
    a member's position table cannot be read past its end."""
    learned = [
        (c.max_positions, i) for i, c in enumerate(configs, start=1) if getattr(c, "positions", None) == "learned"
    ]
    if not learned:
        return configs[0]
    limit, i = min(learned)
    if all(getattr(c, "positions", None) == "learned" and c.max_positions == limit for c in configs):
        return configs[0]
    log.info("ensemble: model %d's learned positions stop at %d: inputs and outputs limited to %d tokens",
             i, limit, limit - 1)  # fmt: skip
    return dataclasses.replace(configs[0], positions="learned", max_positions=limit)


def check_same_task(tasks: Sequence[str], names: Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming the first member trained for another ``data.task`` than the first."""
    for task, name in zip(tasks[1:], names[1:]):
        if task != tasks[0]:
            raise ConfigError(f"ensemble: {name} was trained with data.task: {task}, {names[0]} with data.task: "
                              f"{tasks[0]}: the members of an ensemble must share one task")  # fmt: skip


def check_same_vocabulary(tokenizers: Sequence[Any], names: Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming the first member whose source or target pieces differ from the first's:
    the same sizes are not enough, every id must mean the same piece."""

    def pieces(tok: Any, side: str, size: int) -> list[str]:
        return list(getattr(tok, f"{side}_pieces")(range(size)))

    first = tokenizers[0]
    for tok, name in zip(tokenizers[1:], names[1:]):
        order, first_order = getattr(tok, "tree_order", "top-down"), getattr(first, "tree_order", "top-down")
        if order != first_order:  # parsing models: the same tokens in another order mean another tree
            raise ConfigError(
                f"ensemble: {name} writes its trees {order}, {names[0]} {first_order}: the members of an ensemble "
                "must share one linearisation (data.tree_order)"
            )
        for side in ("src", "tgt"):
            size = getattr(first, f"{side}_vocab_size")
            if getattr(tok, f"{side}_vocab_size") != size or pieces(tok, side, size) != pieces(first, side, size):
                raise ConfigError(
                    f"ensemble: {name} has another {'source' if side == 'src' else 'target'} vocabulary than "
                    f"{names[0]}: the members of an ensemble must share one vocabulary (train them on the same "
                    "prepared data, e.g. data.prepared=RUN/data)"
                )
