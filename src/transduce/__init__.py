"""transduce: the Transformer of "Attention Is All You Need" for sequence transduction.

The main names are here, imported on first use (``import transduce`` alone does not import torch)::

    from transduce import Translator
    translator = Translator.load("runs/multi30k")
    translator.translate(["A man rides a bike."])           # ['Ein Mann fährt Fahrrad.']
    translator.translate_file("test.en", "test.hyp.de")

    from transduce import Classifier
    classifier = Classifier.load("runs/movie_reviews_finetune")   # a sentence classifier (data.task: classify)
    classifier.predict(["A gripping, funny film."])                # ['positive']

    from transduce import Config, prepare, score
    manifest = prepare(Config.load("configs/toy.yaml").data, "prepared/toy")
    score(hypotheses, references).bleu

    from transduce import Config, train
    train(Config.load("configs/toy.yaml")).run_dir          # checkpoints, logs and the report are there

The package's plan (what each folder holds, how ``train`` and ``translate`` flow through them): ``docs/design.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # configuration
    "Config": "transduce.config",
    "ConfigError": "transduce.config",
    "DataConfig": "transduce.config",
    "DecodeConfig": "transduce.config",
    "ModelConfig": "transduce.config",
    "TrainConfig": "transduce.config",
    # errors
    "TransduceError": "transduce.errors",
    "DataError": "transduce.errors",
    "CheckpointError": "transduce.errors",
    # the model
    "AttentionWeights": "transduce.model",
    "DecoderCache": "transduce.model",
    "Memory": "transduce.model",
    "Transformer": "transduce.model",
    "Ensemble": "transduce.search.ensemble",
    "load_model": "transduce.training.checkpoint",
    "MaskedLM": "transduce.transfer.mlm",
    "load_masked_lm": "transduce.transfer.mlm",
    "save_model": "transduce.training.checkpoint",
    # the steps of the pipeline (training: transduce.training.train.train, as the name is the submodule's)
    "prepare": "transduce.data",
    "train": "transduce.training.train",
    "Tokenizer": "transduce.text.tokenizer",
    "Translator": "transduce.search.translator",
    "Translation": "transduce.search.translator",
    "Classifier": "transduce.transfer.classify",
    "Classification": "transduce.transfer.classify",
    "load_classifier": "transduce.transfer.classify",
    "score": "transduce.search.evaluate",
    "Scores": "transduce.search.evaluate",
}

__all__ = [  # the names of _EXPORTS (a test checks)
    "AttentionWeights",
    "CheckpointError",
    "Classification",
    "Classifier",
    "Config",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DecodeConfig",
    "DecoderCache",
    "Ensemble",
    "MaskedLM",
    "Memory",
    "ModelConfig",
    "Scores",
    "Tokenizer",
    "TrainConfig",
    "TransduceError",
    "Transformer",
    "Translation",
    "Translator",
    "__version__",
    "load_classifier",
    "load_masked_lm",
    "load_model",
    "prepare",
    "save_model",
    "score",
    "train",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'transduce' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on demand
    from transduce.config import Config, ConfigError, DataConfig, DecodeConfig, ModelConfig, TrainConfig
    from transduce.data import prepare
    from transduce.errors import CheckpointError, DataError, TransduceError
    from transduce.model import AttentionWeights, DecoderCache, Memory, Transformer
    from transduce.search.evaluate import Scores, score
    from transduce.search.translator import Translation, Translator
    from transduce.text.tokenizer import Tokenizer
    from transduce.training.checkpoint import load_model, save_model
    from transduce.training.train import train
    from transduce.transfer.classify import Classification, Classifier, load_classifier
    from transduce.transfer.mlm import MaskedLM, load_masked_lm
