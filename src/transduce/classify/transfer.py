"""A classifier started from a pretrained encoder (``train.init_from`` with ``data.task: classify``).

``init_from`` names a transduce translation run or checkpoint, a Hugging Face Marian directory, or a masked language
model's run or checkpoint (``data.task: mlm``, :mod:`transduce.mlm`), read as :func:`transduce.finetune._pretrained`
reads them. The classifier takes from it:

- the **source vocabulary**: the texts are encoded with the pretrained model's source side, and no vocabulary is
  learned (:func:`transduce.finetune.vocabulary` writes it into the run, :mod:`transduce.classify.data` encodes with
  it);
- the **shape** (:func:`model_config`): the pretrained model's dimensions and ids; a model section that contradicts
  them is an error naming the field. Dropout rates and the classifier's own fields (pooling, transfer, cove_layers)
  are the run's;
- the **weights** (:func:`initialise`): the source embeddings, the positions (learned ones) and the encoder's layers
  and final norm; a translation model's decoder, target embeddings and output projection are dropped, as are a masked
  language model's mask vector and prediction head. The log says how many parameters were kept and dropped.

What trains is :func:`freeze`'s business (fine-tuning: ``train.freeze_layers``, ``freeze_encoder``,
``freeze_embeddings``; CoVe keeps the whole pretrained part fixed by itself) and the rates are
:func:`lr_scales`' (``train.pretrained_lr_scale`` for the pretrained part).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from transduce.classify.model import ENCODER_PREFIXES, Classifier
from transduce.config import Config, ModelConfig
from transduce.finetune import _TUNABLE, FinetuneError, _pretrained
from transduce.mlm.model import MaskedLM
from transduce.tokenizer import Vocabulary

log = logging.getLogger(__name__)

#: model fields a classifier sets whatever the pretrained model (besides the dropout rates)
CLASSIFIER_FIELDS = ("pooling", "transfer", "cove_layers", "labels")


def model_config(config: Config, vocab: Vocabulary, labels: list[str], *, resume: bool) -> ModelConfig:
    """The classifier's model section: ``init_from``'s shape and ids, ``vocab``'s sizes, the run's classifier fields
    and dropout rates, and ``labels``.

    Raises:
        FinetuneError: a field of ``config.model`` (other than those the run sets) that is not at its default and
            differs from the pretrained model's, naming the field and both values.
    """
    if resume:
        return config.model
    _, pre_config, _, _ = _pretrained(config.train.init_from)
    pre, ours, default = pre_config.model.to_dict(), config.model.to_dict(), ModelConfig().to_dict()
    own = (*_TUNABLE, *CLASSIFIER_FIELDS)
    for key, value in ours.items():
        if key not in own and value != default[key] and value != pre[key]:
            raise FinetuneError(
                f"model.{key}: the config says {value!r}, the pretrained model {config.train.init_from} has "
                f"{pre[key]!r} (a classifier takes the encoder's shape from train.init_from: drop model.{key})"
            )
    mine = {k: ours[k] for k in own if ours[k] != default[k]}
    return ModelConfig.from_dict({**pre, **mine, "labels": labels, "src_vocab_size": vocab.src_vocab_size,
                                  "tgt_vocab_size": vocab.tgt_vocab_size})  # fmt: skip


def _unique_parameters(modules: list[nn.Module]) -> dict[int, nn.Parameter]:
    return {id(p): p for m in modules for p in m.parameters()}


def initialise(model: Classifier, config: Config) -> None:
    """Copy the source embeddings and the encoder of ``init_from`` into ``model``; drop the rest (logged).

    Raises:
        FinetuneError: the pretrained encoder's tensors and the classifier's differ in names or shapes (not
            expected: the shape comes from the pretrained model).
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
                raise FinetuneError(f"{name}: pretrained {tuple(src.shape)}, classifier {tuple(dst.shape)}")
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
    _pretrained.cache_clear()  # the classifier holds the weights now


def freeze(model: Classifier, config: Config) -> None:
    """Keep fixed (``requires_grad=False``) what ``train.freeze_encoder`` (the whole pretrained part),
    ``freeze_embeddings`` (the embeddings and learned positions) and ``freeze_layers: N`` (the embeddings and the
    lowest N encoder layers) say. CoVe's pretrained part is fixed by the model itself. Call before the optimizer
    is built.

    Raises:
        FinetuneError: ``freeze_layers`` is larger than the encoder's depth.
    """
    cfg = config.train
    frozen: list[nn.Module] = []
    if cfg.freeze_encoder:
        frozen += model.pretrained_modules()
    if cfg.freeze_embeddings or cfg.freeze_layers:
        frozen += [model.src_embed, model.src_positions]
    n = cfg.freeze_layers
    if n > len(model.encoder_layers):
        raise FinetuneError(f"train.freeze_layers: {n} is more than the {len(model.encoder_layers)} encoder layers")
    frozen += list(model.encoder_layers[:n])
    for module in frozen:
        for p in module.parameters():
            p.requires_grad_(False)
    fixed = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    if fixed:
        log.info("frozen: %s parameters stay fixed, %s train", f"{fixed:,}", f"{model.num_parameters():,}")


def lr_scales(model: nn.Module, config: Config) -> dict[int, float]:
    """``{id(parameter): multiplier of the learning rate}`` for the parameters that do not train at the schedule's
    rate: with ``init_from``, the pretrained part of a classifier at ``train.pretrained_lr_scale``; else none."""
    if not isinstance(model, Classifier) or not config.train.init_from:
        return {}
    scale = config.train.pretrained_lr_scale
    return {id(p): scale for p in model.pretrained_parameters() if p.requires_grad}


__all__ = ["CLASSIFIER_FIELDS", "freeze", "initialise", "lr_scales", "model_config"]
