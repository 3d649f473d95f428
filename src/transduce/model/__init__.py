"""The Transformer model: layers, the encoder-decoder, and the values passed to a search."""

from transduce.model.cache import DecoderCache, Memory
from transduce.model.layers import causal_mask, padding_mask, sinusoid
from transduce.model.transformer import AttentionWeights, Transformer

__all__ = ["AttentionWeights", "DecoderCache", "Memory", "Transformer", "causal_mask", "padding_mask", "sinusoid"]
