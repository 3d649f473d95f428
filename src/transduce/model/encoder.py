"""transduce's encoder on its own: the translation model's source side, for the models that have no decoder.

:class:`TextEncoder` holds the source embeddings, the positions and the encoder's layers and final norm of
:class:`transduce.model.Transformer` under the same names (``src_embed``, ``src_positions``, ``encoder_layers``,
``encoder_norm``: :data:`ENCODER_PREFIXES`), built and initialised as the Transformer builds them, so that the tensors
load by name from one model into another and :meth:`TextEncoder.encode` computes exactly what the translation
model's ``encode`` computes. The sentence classifier (:class:`transduce.transfer.classify.model.Classifier`) and the
masked language model (:class:`transduce.transfer.mlm.model.MaskedLM`) are built on it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transduce.config import ModelConfig
from transduce.model.cache import Memory
from transduce.model.fused import Dropout
from transduce.model.layers import EncoderLayer, LearnedPositions, SinusoidalPositions, padding_mask
from transduce.model.packed import forget_packed

#: the names of the tensors that the encoder-only models share with a translation model (its source embeddings and
#: encoder): what passes from one to another
ENCODER_PREFIXES = ("src_embed.", "src_positions.", "encoder_layers.", "encoder_norm.")


class TextEncoder(nn.Module):
    """Source embeddings, positions, encoder layers and the final norm, under the translation model's names.

    Args:
        config: the model section (the decoder's fields are unused).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=cfg.pad_id)
        if cfg.positions == "sinusoidal":
            self.src_positions: nn.Module = SinusoidalPositions(d)
        else:
            self.src_positions = LearnedPositions(d, cfg.max_positions)
        self.embed_scale = math.sqrt(d) if cfg.scale_embeddings else 1.0
        self.dropout = Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.encoder_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else nn.Identity()
        nn.init.normal_(self.src_embed.weight, std=d**-0.5)  # as the Transformer draws it
        with torch.no_grad():
            self.src_embed.weight[cfg.pad_id].zero_()

    def pretrained_modules(self) -> list[nn.Module]:
        """The modules a translation model provides: source embeddings, positions, the encoder's layers and norm."""
        return [self.src_embed, self.src_positions, self.dropout, self.encoder_layers, self.encoder_norm]

    def pretrained_parameters(self) -> list[nn.Parameter]:
        """The parameters of :meth:`pretrained_modules`."""
        return [p for m in self.pretrained_modules() for p in m.parameters()]

    def _embed(self, src: Tensor) -> Tensor:
        """(B, S) ids -> (B, S, d_model): scaled embeddings plus positions, as the translation model's encoder."""
        positions = self.src_positions(0, src.shape[1]).to(self.src_embed.weight.dtype)  # (S, d)
        return self.src_embed(src) * self.embed_scale + positions

    def _layers(self, x: Tensor, mask: Tensor | None, layers: nn.ModuleList, norm: nn.Module) -> Tensor:
        for layer in layers:
            x, _ = layer(x, mask)
        return norm(x)

    def encode(self, src: Tensor, *, src_padded: bool | None = None) -> Memory:
        """The encoder, as :meth:`transduce.model.Transformer.encode` computes it.

        Args:
            src: (B, S) text ids + eos, right-padded.
            src_padded: whether ``src`` has padding, when known (see :func:`~transduce.model.padding_mask`).
        Returns:
            :class:`~transduce.model.Memory`: states (B, S, d_model) and the mask.
        """
        mask = padding_mask(src, self.config.pad_id, src_padded)
        x = self._layers(self.dropout(self._embed(src)), mask, self.encoder_layers, self.encoder_norm)
        return Memory(x, mask)

    def train(self, mode: bool = True) -> TextEncoder:
        """Training or evaluation mode; the packed inference weights (:func:`~transduce.model.packed.project`) are
        dropped as the Transformer's are."""
        forget_packed(self)
        return super().train(mode)

    def num_parameters(self) -> int:
        """Trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


__all__ = ["ENCODER_PREFIXES", "TextEncoder"]
