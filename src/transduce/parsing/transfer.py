"""A parser whose encoder starts as a pretrained model's (``train.init_from`` with ``data.task: parse``).

``init_from`` names a transduce run or checkpoint (an English->X translation run: its encoder reads English). The
parser takes from it (read as a classifier reads it, :mod:`transduce.transfer.encoder`):

- the **source vocabulary**: the words are encoded into subwords with the pretrained model's source SentencePiece
  model, and only the target vocabulary, the trees' tokens, is made from the treebank
  (:func:`transduce.parsing.prepare.train_vocabulary` with ``source``). The leaves stay words: the constrained
  search counts the sentence's words, not its subwords, so every tree it writes is still well-formed over exactly
  the input words;
- the **encoder's shape** (:func:`model_config`): d_model, heads, d_ff, the encoder's layers, norm, positions and ids;
  a model field that contradicts them is an error naming the field. The decoder is the parser's own
  (:data:`PARSER_FIELDS`: its layers, and separate, tied or untied, tree embeddings), at the pretrained width;
- the **weights** (:func:`initialise`): the source embeddings, learned positions and the encoder's layers and norm;
  the decoder, the tree embeddings and the output projection start fresh. The log says how many parameters were
  kept and dropped. ``train.pretrained_lr_scale`` sets the pretrained part's learning rate
  (:func:`transduce.transfer.encoder.lr_scales`).
"""

from __future__ import annotations

from transduce.config import Config, ModelConfig
from transduce.text.tokenizer import Vocabulary
from transduce.transfer import encoder as encoder_transfer

#: model fields that shape a parser's decoder: the config's where it sets them (besides the dropout rates)
PARSER_FIELDS = ("decoder_layers", "share_vocab", "tie_output", "output_bias")


def model_config(config: Config, vocab: Vocabulary, *, resume: bool) -> ModelConfig:
    """The parser's model section: ``init_from``'s shape and ids, its own decoder fields and dropout rates, separate
    source and target vocabularies of ``vocab``'s sizes.

    Raises:
        FinetuneError: a field of ``config.model`` (not a dropout rate, not in :data:`PARSER_FIELDS`) that is not at
            its default and differs from the pretrained model's, naming the field and both values.
    """
    if resume:
        return config.model
    fields = {"share_vocab": False, "src_vocab_size": vocab.src_vocab_size, "tgt_vocab_size": vocab.tgt_vocab_size}
    return encoder_transfer.model_config(config, PARSER_FIELDS, fields, who="parser")


initialise = encoder_transfer.initialise

__all__ = ["PARSER_FIELDS", "initialise", "model_config"]
