"""A model whose encoder starts as a pretrained model's (``train.init_from``): what a classifier
(:mod:`transduce.transfer.classify.transfer`) and a parser (:mod:`transduce.parsing.transfer`) take from it, read one
way.

``init_from`` names a run or checkpoint, or a Hugging Face Marian directory (read by :func:`transduce.training.finetune.
_pretrained`). The new model names its source embeddings and encoder as the translation
:class:`~transduce.model.Transformer` does (:data:`~transduce.model.encoder.ENCODER_PREFIXES`), and takes:

- the **shape** (:func:`model_config`): the pretrained model's dimensions, norms, positions and ids; a field of the
  config's model section that contradicts them is an error naming the field. The dropout rates and the fields that
  are the new model's own (a classifier's pooling, a parser's decoder) are the config's;
- the **weights** (:func:`initialise`): the source embeddings, the positions (learned ones) and the encoder's layers
  and final norm; the rest of the pretrained model is dropped. The log says how many parameters were kept and
  dropped;
- a **learning rate** of its own (:func:`lr_scales`): the pretrained part at ``train.pretrained_lr_scale`` times the
  schedule's rate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from transduce.config import Config, ModelConfig
from transduce.model.encoder import ENCODER_PREFIXES
from transduce.training.finetune import _TUNABLE, FinetuneError, _pretrained
from transduce.transfer.mlm.model import MaskedLM

log = logging.getLogger(__name__)


def model_config(config: Config, own: Sequence[str], fields: dict[str, Any], *, who: str) -> ModelConfig:
    """The model section of a model that takes ``init_from``'s encoder: the pretrained model's fields, the dropout
    rates and the ``own`` fields where the config sets them, then ``fields`` (vocabulary sizes, labels).

    Args:
        config: the run's config (``train.init_from`` set).
        own: the model fields that are the new model's to choose (besides the dropout rates).
        fields: model fields set whatever the config and the pretrained model say.
        who: the kind of model, for the error (``"classifier"``, ``"parser"``).
    Raises:
        FinetuneError: a field of ``config.model`` (not a dropout rate, not in ``own``) that is not at its default and
            differs from the pretrained model's, naming the field and both values.
    """
    _, pre_config, _, _ = _pretrained(config.train.init_from)
    pre, ours, default = pre_config.model.to_dict(), config.model.to_dict(), ModelConfig().to_dict()
    own = (*_TUNABLE, *own)
    for key, value in ours.items():
        if key not in own and value != default[key] and value != pre[key]:
            raise FinetuneError(
                f"model.{key}: the config says {value!r}, the pretrained model {config.train.init_from} has "
                f"{pre[key]!r} (a {who} takes the encoder's shape from train.init_from: drop model.{key})"
            )
    mine = {k: ours[k] for k in own if ours[k] != default[k]}
    return ModelConfig.from_dict({**pre, **mine, **fields})


def _unique_parameters(modules: list[nn.Module]) -> dict[int, nn.Parameter]:
    return {id(p): p for m in modules for p in m.parameters()}


def initialise(model: nn.Module, config: Config) -> None:
    """Copy the source embeddings and the encoder of ``init_from`` into ``model`` (built from :func:`model_config`);
    drop the rest (logged). ``model``'s other tensors keep their fresh initialisation.

    Raises:
        FinetuneError: the pretrained encoder's tensors and the model's differ in names or shapes (not expected: the
            shape comes from the pretrained model).
    """
    path = config.train.init_from
    pre_model, _, _, _ = _pretrained(path)
    pre_state, state = pre_model.state_dict(), model.state_dict()
    ours = {k for k in state if k.startswith(ENCODER_PREFIXES)}
    theirs = {k for k in pre_state if k.startswith(ENCODER_PREFIXES)}
    if ours != theirs:
        raise FinetuneError(f"{path}: encoder tensors without a counterpart: {sorted(ours ^ theirs)[:5]}")
    with torch.no_grad():
        for name in sorted(ours):
            src, dst = pre_state[name], state[name]
            if src.shape != dst.shape:
                raise FinetuneError(f"{name}: pretrained {tuple(src.shape)}, model {tuple(dst.shape)}")
            dst.copy_(src.to(dst.dtype))
    encoder = [pre_model.src_embed, pre_model.src_positions, pre_model.encoder_layers, pre_model.encoder_norm]
    kept = _unique_parameters(encoder)
    dropped = {k: p for k, p in _unique_parameters([pre_model]).items() if k not in kept}
    count = lambda params: f"{sum(p.numel() for p in params.values()):,}"  # noqa: E731
    if isinstance(pre_model, MaskedLM):
        rest = "the masked language model's mask vector and prediction head"
    else:
        rest = "the decoder and the target side's embeddings and output projection"
    log.info("initialised from %s: kept the source embeddings and the encoder (%s parameters), dropped %s (%s "
             "parameters)", path, count(kept), rest, count(dropped))  # fmt: skip
    _pretrained.cache_clear()  # the model holds the weights now


def pretrained_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters :func:`initialise` fills: the source embeddings, learned positions and the encoder."""
    return [p for name, p in model.named_parameters() if name.startswith(ENCODER_PREFIXES)]


def lr_scales(model: nn.Module, config: Config) -> dict[int, float]:
    """``{id(parameter): multiplier of the learning rate}`` for the parameters that do not train at the schedule's
    rate: with ``init_from``, a classifier's or a parser's pretrained part (those that train) at
    ``train.pretrained_lr_scale``; else none (a fine-tuned translation model trains at one rate)."""
    if not config.train.init_from or config.data.task not in ("classify", "parse"):
        return {}
    scale = config.train.pretrained_lr_scale
    return {id(p): scale for p in pretrained_parameters(model) if p.requires_grad}


__all__ = ["initialise", "lr_scales", "model_config", "pretrained_parameters"]
