"""transduce: the Transformer of "Attention Is All You Need" for sequence transduction."""

from transduce.config import Config, ConfigError, DataConfig, DecodeConfig, ModelConfig, TrainConfig
# model exports are added below once transduce.model exists

__all__ = [
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
