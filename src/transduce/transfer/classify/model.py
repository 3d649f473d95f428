"""The sentence classifier: transduce's encoder, a pooled sentence vector, and a classification head.

The encoder is the translation model's (:class:`transduce.model.encoder.TextEncoder`): the same modules under the
same names (``src_embed``, ``src_positions``, ``encoder_layers``, ``encoder_norm``), so a translation model's source
embeddings and encoder load into it by name and :meth:`ClassifierModel.encode` computes exactly what the translation
model's ``encode`` does. On top of it (``model.transfer``):

- ``finetune``: the encoder's states are pooled and classified; everything trains (the pretrained part at
  ``train.pretrained_lr_scale`` of the rate, :mod:`transduce.transfer.classify.transfer`).
- ``cove`` (McCann et al., 2017, "Learned in Translation: Contextualized Word Vectors"): the pretrained embeddings
  and encoder are fixed (no gradients, always in eval mode); each position's ``[E(w); Enc(w)]``, its word embedding
  (scaled as the encoder receives it) and the encoder's state concatenated, is projected to ``d_model`` and read by a
  small task model, which is pooled and classified. The task model (``model.cove_task``) is ``model.cove_layers``
  transformer encoder layers of the pretrained model's shape (no positions of their own: the encoder's states carry
  the order), or, as McCann et al. have it, a bidirectional LSTM of ``model.cove_layers`` layers with
  ``d_model / 2`` units per direction (its output is ``d_model`` wide), run over packed sequences so that padding
  changes nothing.

Pooling (``model.pooling``): ``cls`` prepends a learned ``<cls>`` vector to the sequence (to the encoder's input when
fine-tuning, to the task model's under CoVe) and takes its final state, as BERT does (a vector rather than a
vocabulary id, so that a pretrained vocabulary needs no new entry; it has no position of its own, so the words keep
the positions the encoder was trained with); ``mean`` averages the states of the real (non-padding) positions and
``max`` takes their element-wise maximum (two of the poolings of McCann et al.'s classifier). A BiLSTM task model
pools with ``mean`` or ``max``.
The head (:class:`transduce.model.layers.ClassificationHead`) is dropout and one linear layer.

    model = ClassifierModel(ModelConfig.preset("test", src_vocab_size=8000, tgt_vocab_size=8000, labels=["neg", "pos"]))
    logits = model(src)  # (B, 2); src: (B, S) text ids + eos, right-padded
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from transduce.config import ModelConfig
from transduce.model.encoder import ENCODER_PREFIXES, TextEncoder
from transduce.model.fused import Dropout
from transduce.model.layers import ClassificationHead, EncoderLayer, padding_mask


class ClassifierModel(TextEncoder):
    """Encoder + pooling + head (see the module docstring).

    Args:
        config: the model section; ``labels`` names the classes (at least two). The decoder's fields are unused.
    """

    def __init__(self, config: ModelConfig):
        if len(config.labels) < 2:
            raise ValueError(f"a classifier needs model.labels (two at least), got {config.labels!r}")
        super().__init__(config)  # the pretrained part: a translation model's source side, under its names
        cfg, d = config, config.d_model
        # what classification adds
        self.cove = cfg.transfer == "cove"
        self.cove_lstm: nn.LSTM | None = None
        if self.cove:
            self.cove_project = nn.Linear(2 * d, d)  # [E(w); Enc(w)] -> the task model's width
            self.cove_dropout = Dropout(cfg.dropout)
            if cfg.cove_task == "bilstm":  # d/2 units each way: the output is d wide; dropout between the layers
                self.cove_lstm = nn.LSTM(d, d // 2, num_layers=cfg.cove_layers, bidirectional=True, batch_first=True,
                                         dropout=cfg.dropout if cfg.cove_layers > 1 else 0.0)  # fmt: skip
            else:
                self.cove_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.cove_layers))
                self.cove_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else nn.Identity()
            nn.init.xavier_uniform_(self.cove_project.weight)
            nn.init.zeros_(self.cove_project.bias)
        # the <cls> vector, drawn like an embedding row (and scaled like one)
        self.cls_embed = nn.Parameter(torch.randn(d) * d**-0.5) if cfg.pooling == "cls" else None
        self.head = ClassificationHead(d, len(cfg.labels), dropout=cfg.dropout)
        if self.cove:
            for p in self.pretrained_parameters():
                p.requires_grad_(False)

    # ------------------------------------------------------------------------------------------------------------------

    def _with_cls(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Prepend the ``<cls>`` vector: (B, S, d) -> (B, 1 + S, d), the mask (B, 1, 1, S) -> (B, 1, 1, 1 + S)."""
        assert self.cls_embed is not None
        cls = (self.cls_embed * self.embed_scale).to(x.dtype).expand(x.shape[0], 1, -1)  # (B, 1, d)
        if mask is not None:
            mask = torch.cat([mask.new_ones(mask.shape[0], 1, 1, 1), mask], dim=-1)
        return torch.cat([cls, x], dim=1), mask

    def forward(self, src: Tensor, *, src_padded: bool | None = None) -> Tensor:
        """Class scores.

        Args:
            src: (B, S) text ids + eos, right-padded with ``pad_id``.
            src_padded: whether ``src`` has padding, when known.
        Returns:
            logits (B, classes).
        """
        cls = self.cls_embed is not None
        mask = padding_mask(src, self.config.pad_id, src_padded)
        if self.cove:
            with torch.no_grad():  # fixed: no graph through the pretrained part
                words = self.src_embed(src) * self.embed_scale  # (B, S, d) E(w)
                states = self.encode(src, src_padded=src_padded).states  # (B, S, d) Enc(w)
            x = self.cove_project(torch.cat([words, states], dim=-1))  # (B, S, d)
            if self.cove_lstm is not None:
                x = self._bilstm(self.cove_dropout(x), src)
            else:
                if cls:
                    x, mask = self._with_cls(x, mask)
                x = self._layers(self.cove_dropout(x), mask, self.cove_layers, self.cove_norm)
        else:
            x = self._embed(src)
            if cls:
                x, mask = self._with_cls(x, mask)
            x = self._layers(self.dropout(x), mask, self.encoder_layers, self.encoder_norm)
        return self.head(x[:, 0] if cls else self._pool(x, src))

    def _bilstm(self, x: Tensor, src: Tensor) -> Tensor:
        """CoVe's BiLSTM task model over the real positions of each row: (B, S, d) -> (B, S, d), zeros at padding.

        The rows are packed to their lengths, so each direction starts and ends at the row's own ends.
        """
        assert self.cove_lstm is not None
        lengths = src.ne(self.config.pad_id).sum(dim=1).cpu()  # (B,) >= 1: every row ends with eos
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.cove_lstm(packed)
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]  # (B, S, d)

    def _pool(self, states: Tensor, src: Tensor) -> Tensor:
        """The mean or the element-wise maximum (``model.pooling``) of each row's states over its real positions:
        (B, S, d) -> (B, d)."""
        real = src.ne(self.config.pad_id).unsqueeze(-1)  # (B, S, 1)
        if self.config.pooling == "max":
            return states.masked_fill(~real, torch.finfo(states.dtype).min).amax(dim=1)
        real = real.to(states.dtype)
        return (states * real).sum(dim=1) / real.sum(dim=1).clamp(min=1.0)

    def train(self, mode: bool = True) -> ClassifierModel:
        """Training or evaluation mode; under CoVe the pretrained part stays in evaluation mode (no dropout), and the
        packed inference weights (:func:`~transduce.model.packed.project`) are dropped as the Transformer's are."""
        super().train(mode)
        if self.cove:
            for module in self.pretrained_modules():
                module.train(False)
        return self


__all__ = ["ENCODER_PREFIXES", "ClassifierModel"]
