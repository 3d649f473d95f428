"""transduce: the Transformer of "Attention Is All You Need" for sequence transduction."""

from transduce.config import Config, ConfigError, DataConfig, DecodeConfig, ModelConfig, TrainConfig
from transduce.model import AttentionWeights, DecoderCache, Memory, Transformer

__all__ = [
    "AttentionWeights",
    "Config",
    "ConfigError",
    "DataConfig",
    "DecodeConfig",
    "DecoderCache",
    "Memory",
    "ModelConfig",
    "TrainConfig",
    "Transformer",
]
__version__ = "0.1.0"
