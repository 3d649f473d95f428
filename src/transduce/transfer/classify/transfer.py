"""A classifier started from a pretrained encoder (``train.init_from`` with ``data.task: classify``).

``init_from`` names a transduce translation run or checkpoint, a Hugging Face Marian directory, or a masked language
model's run or checkpoint (``data.task: mlm``, :mod:`transduce.transfer.mlm`), read as
:func:`transduce.training.finetune._pretrained` reads them. The classifier takes from it:

- the **source vocabulary**: the texts are encoded with the pretrained model's source side, and no vocabulary is
  learned (:func:`transduce.training.finetune.vocabulary` writes it into the run,
  :mod:`transduce.transfer.classify.data` encodes with it);
- the **shape** (:func:`model_config`): the pretrained model's dimensions and ids; a model section that contradicts
  them is an error naming the field. Dropout rates and the classifier's own fields (pooling, transfer, cove_task,
  cove_layers) are the run's;
- the **weights** (:func:`initialise`): the source embeddings, the positions (learned ones) and the encoder's layers
  and final norm; a translation model's decoder, target embeddings and output projection are dropped, as are a masked
  language model's mask vector and prediction head. The log says how many parameters were kept and dropped.

What trains is :func:`freeze`'s business (fine-tuning: ``train.freeze_layers``, ``freeze_encoder``,
``freeze_embeddings``; CoVe keeps the whole pretrained part fixed by itself) and the rates are
:func:`~transduce.transfer.encoder.lr_scales`' (``train.pretrained_lr_scale`` for the pretrained part). The shape
and the weights are read as a parser reads them (:mod:`transduce.transfer.encoder`).
"""

from __future__ import annotations

import logging

from torch import nn

from transduce.config import Config, ModelConfig
from transduce.text.tokenizer import Vocabulary
from transduce.training.finetune import FinetuneError
from transduce.transfer import encoder as encoder_transfer
from transduce.transfer.classify.model import ClassifierModel
from transduce.transfer.encoder import lr_scales

log = logging.getLogger(__name__)

#: model fields a classifier sets whatever the pretrained model (besides the dropout rates)
CLASSIFIER_FIELDS = ("pooling", "transfer", "cove_task", "cove_layers", "labels")


def model_config(config: Config, vocab: Vocabulary, labels: list[str], *, resume: bool) -> ModelConfig:
    """The classifier's model section: ``init_from``'s shape and ids, ``vocab``'s sizes, the run's classifier fields
    and dropout rates, and ``labels``.

    Raises:
        FinetuneError: a field of ``config.model`` (other than those the run sets) that is not at its default and
            differs from the pretrained model's, naming the field and both values.
    """
    if resume:
        return config.model
    fields = {"labels": labels, "src_vocab_size": vocab.src_vocab_size, "tgt_vocab_size": vocab.tgt_vocab_size}
    return encoder_transfer.model_config(config, CLASSIFIER_FIELDS, fields, who="classifier")


def initialise(model: ClassifierModel, config: Config) -> None:
    """Copy the source embeddings and the encoder of ``init_from`` into ``model``; drop the rest (logged; see
    :func:`transduce.transfer.encoder.initialise`)."""
    encoder_transfer.initialise(model, config)


def freeze(model: ClassifierModel, config: Config) -> None:
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


__all__ = ["CLASSIFIER_FIELDS", "freeze", "initialise", "lr_scales", "model_config"]
