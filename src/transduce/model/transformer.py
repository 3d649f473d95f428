"""The encoder-decoder Transformer (paper §3, Figure 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transduce import fastpaths
from transduce.config import ModelConfig
from transduce.model import step
from transduce.model.cache import DecoderCache, Memory
from transduce.model.fused import Dropout
from transduce.model.layers import (
    KV,
    DecoderLayer,
    EncoderLayer,
    LearnedPositions,
    SinusoidalPositions,
    padding_mask,
)
from transduce.model.packed import forget_packed, project


@dataclass(frozen=True)
class AttentionWeights:
    """Attention weights of one teacher-forced pass, for pictures. Each list has one (B, h, Tq, Tk) tensor per layer.

    Attributes:
        encoder: encoder self-attention, (B, h, S, S) per layer.
        decoder: decoder (masked) self-attention, (B, h, T, T) per layer.
        cross: encoder-decoder attention, (B, h, T, S) per layer: row t says where target position t looked.
    """

    encoder: list[Tensor]
    decoder: list[Tensor]
    cross: list[Tensor]


class Transformer(nn.Module):
    """Encoder-decoder Transformer.

    ``forward(src, tgt_in)`` runs teacher forcing; ``encode`` and ``decode`` are the pieces a search uses.
    Token tensors are batch-first and right-padded with ``config.pad_id``.

    Example::

        model = Transformer(ModelConfig.preset("small", src_vocab_size=8000, tgt_vocab_size=8000))
        logits = model(src, tgt_in)                                   # (B, T, V)
        memory = model.encode(src)
        logits, cache = model.decode(bos_column, memory)              # first step: builds the cache
        logits, cache = model.decode(next_tokens, memory, cache)      # later steps: one token each
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        self.tgt_embed = (
            self.src_embed if cfg.share_vocab else nn.Embedding(cfg.tgt_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        )
        if cfg.positions == "sinusoidal":
            self.src_positions = self.tgt_positions = SinusoidalPositions(cfg.d_model)
        else:
            self.src_positions = LearnedPositions(cfg.d_model, cfg.max_positions)
            self.tgt_positions = LearnedPositions(cfg.d_model, cfg.max_positions)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.dropout = Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"  # pre-norm stacks end with a LayerNorm; post-norm layers already end normalised
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.output_bias)  # pre-softmax projection
        for emb in dict.fromkeys((self.src_embed, self.tgt_embed)):  # each once, in a fixed order (not a set)
            nn.init.normal_(emb.weight, std=cfg.d_model**-0.5)  # so that scaled embeddings have unit variance
            with torch.no_grad():
                emb.weight[cfg.pad_id].zero_()
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.weight  # §3.4: one matrix for embedding and pre-softmax
        else:
            nn.init.normal_(self.output.weight, std=cfg.d_model**-0.5)
        if self.output.bias is not None:
            nn.init.zeros_(self.output.bias)

    # ------------------------------------------------------------------------------------------------------------------

    def _embed(self, tokens: Tensor, embedding: nn.Embedding, positions: nn.Module, offset: int) -> Tensor:
        x = embedding(tokens) * self.embed_scale + positions(offset, tokens.shape[1]).to(embedding.weight.dtype)
        return self.dropout(x)

    def encode(self, src: Tensor, *, src_padded: bool | None = None) -> Memory:
        """Run the encoder.

        Args:
            src: (B, S) source ids, right-padded.
            src_padded: whether ``src`` has padding, when known (see :func:`~transduce.model.padding_mask`).
        Returns:
            :class:`Memory` with states (B, S, d_model) and the source mask.
        """
        memory, _ = self._encode(src, need_weights=False, src_padded=src_padded)
        return memory

    def source_embeddings(self, src: Tensor) -> Tensor:
        """The source tokens' context-free vectors as the encoder sees them before positions are added: the
        embedding rows times the embedding scale (sqrt(d_model) when ``scale_embeddings``), no dropout.

        Args:
            src: (B, S) source ids.
        Returns:
            (B, S, d_model).
        """
        return self.src_embed(src) * self.embed_scale

    def _encode(self, src: Tensor, need_weights: bool, src_padded: bool | None = None) -> tuple[Memory, list[Tensor]]:
        mask = padding_mask(src, self.config.pad_id, src_padded)
        x = self._embed(src, self.src_embed, self.src_positions, 0)
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, mask, need_weights)
            weights.append(w)
        return Memory(self.encoder_norm(x), mask), weights

    def init_cache(self, memory: Memory) -> DecoderCache:
        """An empty decoder cache holding the cross-attention keys/values of ``memory`` (computed once here)."""
        b = memory.states.shape[0]
        cfg = self.config
        return DecoderCache(
            self_kv=memory.states.new_zeros(len(self.decoder_layers), 2, b, cfg.heads, 0, cfg.d_k),
            cross_kv=tuple(layer.cross_attn.memory_kv(memory.states) for layer in self.decoder_layers),
            memory_mask=memory.mask,
        )

    def decode(self, tgt: Tensor, memory: Memory, cache: DecoderCache | None = None) -> tuple[Tensor, DecoderCache]:
        """Run the decoder over new target tokens, incrementally.

        Args:
            tgt: (B, T) the next T target ids (the whole prefix, starting with BOS, when ``cache`` is None).
            memory: the encoder output; only used to build the cache when ``cache`` is None.
            cache: the cache returned by the previous call, or None to start.
        Returns:
            logits (B, T, tgt_vocab) for the positions of ``tgt``, and a new cache that also holds them
            (the cache passed in is not modified).
        """
        if cache is None:
            cache = self.init_cache(memory)
        if fastpaths.settings.step_function and tgt.shape[1] == 1 and not self.training and not torch.is_grad_enabled():
            return step.decode_step(self, tgt, cache)  # a search's step: the same numbers, fewer operations
        self_kv = self._extended_self_kv(cache, tgt.shape[1])
        x, _ = self._decode_layers(
            tgt, cache.cross_kv, cache.memory_mask, self_kv, need_weights=False, group=cache.group,
            offset=cache.length,
        )  # fmt: skip
        if isinstance(self_kv, list):
            self_kv = torch.stack(self_kv)
        return project(self.output, x, output=True), DecoderCache(
            self_kv, cache.cross_kv, cache.memory_mask, cache.group
        )

    def _extended_self_kv(self, cache: DecoderCache, new: int) -> Tensor | list[Tensor]:
        """The cache's self-attention keys/values gathered in the batch's row order (``cache.order``) into a new
        tensor with ``new`` more positions, which the decoder layers fill: one copy of the cache, in one operation
        (a cache stored by position, from the step function, is gathered through its table first).

        Under autograd, one tensor per layer instead (a layer's writes must not touch what another layer's
        attention saved for its backward pass, and ``out=`` records no gradient); :meth:`decode` stacks them."""
        t, rows, by_table = cache.length, cache.batch_size, cache.table is not None
        past = cache.rows() if by_table or torch.is_grad_enabled() else cache.self_kv  # (layers, 2, B or B', h, t, d_k)
        layers, _, _, h, _, d_k = past.shape
        if torch.is_grad_enabled():
            return [torch.cat([past[i], past.new_zeros(2, rows, h, new, d_k)], dim=3) for i in range(layers)]
        out = past.new_empty(layers, 2, rows, h, t + new, d_k)
        if t > 0:
            if cache.order is None or by_table:
                out.narrow(4, 0, t).copy_(past)
            else:
                torch.index_select(past, 2, cache.order, out=out.narrow(4, 0, t))
        return out

    def _decode_layers(
        self,
        tgt: Tensor,
        cross_kv: tuple[KV, ...] | None,
        memory_mask: Tensor | None,
        self_kv: Tensor | list[Tensor] | None,
        need_weights: bool,
        memory: Memory | None = None,
        group: int = 1,
        offset: int = 0,
    ) -> tuple[Tensor, tuple[list, list]]:
        """The decoder layers over ``tgt`` (B, T) at positions ``offset ..``; ``self_kv`` (None without a cache):
        per layer, the keys/values of the earlier positions with room for the new ones (see :meth:`decode`)."""
        x = self._embed(tgt, self.tgt_embed, self.tgt_positions, offset)
        self_ws, cross_ws = [], []
        for i, layer in enumerate(self.decoder_layers):
            kv = cross_kv[i] if cross_kv is not None else layer.cross_attn.memory_kv(memory.states)
            x, (self_w, cross_w) = layer(
                x, kv, memory_mask, cache=None if self_kv is None else self_kv[i], need_weights=need_weights,
                group=group,
            )  # fmt: skip
            self_ws.append(self_w)
            cross_ws.append(cross_w)
        return self.decoder_norm(x), (self_ws, cross_ws)

    def forward(self, src: Tensor, tgt_in: Tensor, *, src_padded: bool | None = None) -> Tensor:
        """Teacher forcing.

        Args:
            src: (B, S) source ids.
            tgt_in: (B, T) decoder inputs: BOS followed by the target ids, right-padded.
            src_padded: whether ``src`` has padding, when known (see :func:`~transduce.model.padding_mask`).
        Returns:
            logits (B, T, tgt_vocab): position t predicts target token t + 1 of ``tgt_in``.
        """
        memory = self.encode(src, src_padded=src_padded)
        x, _ = self._decode_layers(tgt_in, None, memory.mask, None, need_weights=False, memory=memory)
        return project(self.output, x, output=True)

    @torch.no_grad()
    def attention(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, AttentionWeights]:
        """Teacher-forced pass that also returns every attention weight (per layer and head), for visualisation.

        Returns:
            logits (B, T, tgt_vocab) and :class:`AttentionWeights`.
        """
        memory, enc_w = self._encode(src, need_weights=True)
        x, (self_w, cross_w) = self._decode_layers(tgt_in, None, memory.mask, None, need_weights=True, memory=memory)
        return project(self.output, x, output=True), AttentionWeights(enc_w, self_w, cross_w)

    def train(self, mode: bool = True) -> Transformer:
        """Switch training/evaluation mode (``eval()`` calls this too) and drop the packed weights of
        :func:`~transduce.model.packed.project`, which an optimizer may have changed without a trace (see there)."""
        forget_packed(self)
        return super().train(mode)

    def num_parameters(self) -> int:
        """Trainable parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
