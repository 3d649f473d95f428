"""Pre-norm models to Hugging Face: ``transformers.PegasusForConditionalGeneration``.

MarianMTModel is post-norm. Of the pre-norm encoder-decoders in transformers with sinusoidal positions, Pegasus
computes our pre-norm Transformer's function exactly: ``x + Sublayer(LayerNorm(x))`` in every layer, a final
LayerNorm on both stacks, embeddings scaled by sqrt(d_model) (``scale_embedding``), and Marian's position table
(the paper's frequencies, ``[sin | cos]``, positions from 0), so the same residual-stream permutation as the Marian
export (:func:`transduce.interop.marian.residual_permutation`) maps our weights onto it. M2M100 (NLLB's
architecture) does not: its sinusoids are fairseq's, with frequencies ``10000^(-i / (d/2 - 1))`` instead of the
paper's ``10000^(-i / (d/2))``, rows offset by ``pad_id + 1``, and a table that ``from_pretrained`` always
regenerates, so no weight permutation reproduces our positions there.

Pegasus has one embedding matrix for the encoder and the decoder: a pre-norm model with separate vocabularies
cannot be written as one. The tokenizer files are Marian's (``source.spm``, ``target.spm``, ``vocab.json``), which
``MarianTokenizer`` (and ``AutoTokenizer``, through ``tokenizer_config.json``) reads.
"""

from __future__ import annotations

from transduce.config import ModelConfig
from transduce.interop import hf_config_fields, require

PEGASUS_LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which Pegasus uses


def pegasus_problems(c: ModelConfig) -> list[str]:
    """Why a pre-norm model with config ``c`` cannot be written as a Pegasus model (empty when it can)."""
    problems = []
    if not c.share_vocab:
        problems.append(
            "model.share_vocab is false, and Pegasus (the pre-norm architecture of Hugging Face) has one embedding "
            "for encoder and decoder: train with data.joint_vocab true (export --format ctranslate2 takes it)"
        )
    if c.positions != "sinusoidal":
        problems.append(f"model.positions is {c.positions!r}, and Pegasus has sinusoidal positions only")
    if c.layer_norm_eps != PEGASUS_LAYER_NORM_EPS:
        problems.append(f"model.layer_norm_eps is {c.layer_norm_eps}, and Pegasus's LayerNorm uses 1e-5")
    return problems


def pegasus_config(c: ModelConfig):
    """The ``transformers.PegasusConfig`` of our (pre-norm, shared-vocabulary) model config."""
    transformers = require("transformers")
    return transformers.PegasusConfig(vocab_size=c.src_vocab_size, **hf_config_fields(c))
