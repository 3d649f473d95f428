"""The masked language model: transduce's encoder, a learned mask vector and BERT's prediction head.

The encoder is the translation model's (:class:`transduce.model.encoder.TextEncoder`): the same modules under the
same names, so that what it learns (``src_embed``, ``src_positions``, ``encoder_layers``, ``encoder_norm``) loads by
name into a classifier (``train.init_from``, :mod:`transduce.transfer.classify.transfer`), as a translation model's
encoder does. What masked-LM pretraining adds, and a classifier drops:

- ``mask_embed``: the mask, a learned vector that replaces the embedding of every masked position (drawn and scaled
  like an embedding row, as the classifier's ``<cls>`` vector is; a vector rather than a vocabulary id, so that an
  existing SentencePiece vocabulary needs no new entry). Unlike ``<cls>`` it takes the position of the piece it
  hides, as BERT's ``[MASK]`` token does;
- ``head`` (:class:`MaskedLMHead`), BERT's: a dense layer, the model's activation and a LayerNorm, then the output
  projection, which is the source embedding matrix itself (tied) plus a bias per piece.

    model = MaskedLM(ModelConfig.preset("test", src_vocab_size=8000, tgt_vocab_size=8000))
    logits = model(src, masked, positions)  # (N, V): src (B, S) ids + eos; masked (B, S) bool; positions (N,)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce.config import ModelConfig
from transduce.model.cache import Memory
from transduce.model.encoder import TextEncoder
from transduce.model.layers import ACTIVATIONS, padding_mask


class MaskedLMHead(nn.Module):
    """BERT's prediction head: ``LayerNorm(act(x W + b)) E^T + bias``, ``E`` the (tied) embedding matrix.

    The dense layer's weights are drawn with standard deviation 0.02 and its bias is zero, as BERT initialises them;
    the output bias starts at zero.
    """

    def __init__(self, d_model: int, vocab_size: int, *, activation: str, eps: float):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = ACTIVATIONS[activation]
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)

    def forward(self, states: Tensor, embedding: Tensor) -> Tensor:
        """(..., d_model) states and the (V, d_model) embedding matrix -> (..., V) logits."""
        return F.linear(self.norm(self.act(self.dense(states))), embedding, self.bias)


class MaskedLM(TextEncoder):
    """Encoder + mask vector + prediction head (see the module docstring).

    Args:
        config: the model section (the decoder's fields are unused; the output has ``src_vocab_size`` pieces).
    """

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        d = config.d_model
        self.mask_embed = nn.Parameter(torch.randn(d) * d**-0.5)  # drawn like an embedding row
        self.head = MaskedLMHead(d, config.src_vocab_size, activation=config.activation, eps=config.layer_norm_eps)

    def encode(self, src: Tensor, masked: Tensor | None = None, *, src_padded: bool | None = None) -> Memory:
        """The encoder's states, the mask vector in place of the embedding at the ``masked`` positions.

        Args:
            src: (B, S) ids + eos, right-padded.
            masked: (B, S) bool, True where the input is the mask vector; None: no position (the plain encoder, as
                :meth:`transduce.model.Transformer.encode` computes it).
            src_padded: whether ``src`` has padding, when known (see :func:`~transduce.model.padding_mask`).
        Returns:
            :class:`~transduce.model.Memory`: states (B, S, d_model) and the mask.
        """
        if masked is None:
            return super().encode(src, src_padded=src_padded)
        mask = padding_mask(src, self.config.pad_id, src_padded)
        words = self.src_embed(src) * self.embed_scale  # (B, S, d)
        hidden = (self.mask_embed * self.embed_scale).to(words.dtype)  # (d,)
        words = torch.where(masked[..., None], hidden, words)
        positions = self.src_positions(0, src.shape[1]).to(words.dtype)  # (S, d)
        x = self._layers(self.dropout(words + positions), mask, self.encoder_layers, self.encoder_norm)
        return Memory(x, mask)

    def forward(self, src: Tensor, masked: Tensor, positions: Tensor | None = None, *,
                src_padded: bool | None = None) -> Tensor:  # fmt: skip
        """Scores of every piece of the vocabulary at the ``positions`` to predict.

        Args:
            src: (B, S) input ids + eos, right-padded with ``pad_id``.
            masked: (B, S) bool, True where the input is the mask vector.
            positions: (N,) flat indices into the (B * S) positions (``row * S + column``): the chosen ones, whose
                scores alone are computed; None: every position.
            src_padded: whether ``src`` has padding, when known.
        Returns:
            logits (N, src_vocab), or (B, S, src_vocab) without ``positions``.
        """
        states = self.encode(src, masked, src_padded=src_padded).states  # (B, S, d)
        if positions is not None:
            states = states.reshape(-1, states.shape[-1]).index_select(0, positions)  # (N, d)
        return self.head(states, self.src_embed.weight)


__all__ = ["MaskedLM", "MaskedLMHead"]
