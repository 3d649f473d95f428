"""CTranslate2 out: our Transformer as a ``ctranslate2.specs.TransformerSpec``, converted and quantised by
CTranslate2's own converter machinery, for fast CPU/GPU deployment.

CTranslate2's ready-made Marian converter cannot be used on an exported Marian directory: it assumes Marian's
conventions (the decoder starts from a zero embedding, the last vocabulary entry is a pad token to drop), which
are not ours. The spec API describes our model directly instead, pre-norm models included, and the
:class:`ctranslate2.converters.Converter` base class does validation, quantisation (``int8``, ``int8_float32``,
``float16``, ``bfloat16``, ...) and saving. The source end-of-sentence token is added by CTranslate2
(``add_source_eos``), the decoder starts from our bos token, and the SentencePiece model(s) are copied beside the
converted model, so::

    import ctranslate2, sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file="OUT/spm.model")
    translator = ctranslate2.Translator("OUT")
    pieces = sp.encode("A man rides a bike.", out_type=str)      # lowercase first if the model was trained so
    result = translator.translate_batch([pieces], beam_size=4)
    print(sp.decode(result[0].hypotheses[0]))

A multilingual model (``data.tgt_langs``) reads its target-language token as the first source piece, as Marian's
multilingual models do: CTranslate2 needs nothing else (no ``target_prefix``). ``transduce.json`` lists the tokens;
pass them as ``suppress_sequences`` so that the search never writes one, as transduce's never does::

    tokens = json.load(open("OUT/transduce.json"))["lang_tokens"]            # [">>deu<<", ">>fra<<", ...]
    result = translator.translate_batch([[">>fra<<", *pieces]], beam_size=4,
                                        suppress_sequences=[[t] for t in tokens])
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import torch

from transduce.errors import InteropError
from transduce.files import replaced_on_success
from transduce.interop import prepare_output, require
from transduce.interop.marian import load_any
from transduce.interop.marian_vocab import MarianVocab
from transduce.model import Transformer, sinusoid

log = logging.getLogger(__name__)

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
POSITION_ROWS = 2048  # rows of the sinusoidal table written into the model: the longest source or output it takes


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _vocabulary(tokenizer, side: str) -> list[str]:
    if isinstance(tokenizer, MarianVocab):
        return tokenizer.pieces_in_id_order(side)
    size = tokenizer.src_vocab_size if side == "src" else tokenizer.tgt_vocab_size
    pieces = (tokenizer.src_pieces if side == "src" else tokenizer.tgt_pieces)(range(size))
    if len(set(pieces)) != len(pieces):
        raise InteropError(f"the {side} vocabulary has duplicate pieces; CTranslate2 needs unique tokens")
    return pieces


def transformer_spec(model: Transformer, tokenizer):
    """The ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights and vocabularies."""
    require("ctranslate2")
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.config
    activation = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "swish": common_spec.Activation.SWISH,
    }[c.activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (c.encoder_layers, c.decoder_layers), c.heads, pre_norm=c.norm == "pre", activation=activation
    )

    def linear(dst, layer: torch.nn.Linear) -> None:
        dst.weight = _array(layer.weight)
        bias = layer.bias if layer.bias is not None else torch.zeros(layer.out_features)
        dst.bias = _array(bias)

    def norm(dst, ln: torch.nn.LayerNorm) -> None:
        dst.gamma, dst.beta = _array(ln.weight), _array(ln.bias)

    def inputs(dst, embedding: torch.nn.Embedding, positions: torch.nn.Module) -> None:
        emb = dst.embeddings[0] if isinstance(dst.embeddings, list) else dst.embeddings
        emb.weight = _array(embedding.weight)
        dst.scale_embeddings = bool(c.scale_embeddings)
        if c.positions == "sinusoidal":
            dst.position_encodings.encodings = _array(sinusoid(torch.arange(POSITION_ROWS), c.d_model))
        else:
            dst.position_encodings.encodings = _array(positions.weight)

    inputs(spec.encoder, model.src_embed, model.src_positions)
    inputs(spec.decoder, model.tgt_embed, model.tgt_positions)

    def self_attention(dst, ours) -> None:
        linear(dst.self_attention.linear[0], ours.self_attn.qkv)
        linear(dst.self_attention.linear[1], ours.self_attn.out)
        norm(dst.self_attention.layer_norm, ours.norm1)

    def feed_forward(dst, ours, ln: torch.nn.LayerNorm) -> None:
        linear(dst.ffn.linear_0, ours.ffn.w1)
        linear(dst.ffn.linear_1, ours.ffn.w2)
        norm(dst.ffn.layer_norm, ln)

    for layer, ours in zip(spec.encoder.layer, model.encoder_layers):
        self_attention(layer, ours)
        feed_forward(layer, ours, ours.norm2)
    for layer, ours in zip(spec.decoder.layer, model.decoder_layers):
        self_attention(layer, ours)
        linear(layer.attention.linear[0], ours.cross_attn.q)
        linear(layer.attention.linear[1], ours.cross_attn.kv)
        linear(layer.attention.linear[2], ours.cross_attn.out)
        norm(layer.attention.layer_norm, ours.norm2)
        feed_forward(layer, ours, ours.norm3)
    if c.norm == "pre":
        norm(spec.encoder.layer_norm, model.encoder_norm)
        norm(spec.decoder.layer_norm, model.decoder_norm)
    spec.decoder.projection.weight = _array(model.output.weight)
    if model.output.bias is not None:
        spec.decoder.projection.bias = _array(model.output.bias)

    src_vocab, tgt_vocab = _vocabulary(tokenizer, "src"), _vocabulary(tokenizer, "tgt")
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    spec.config.bos_token = tgt_vocab[c.bos_id]
    spec.config.eos_token = tgt_vocab[c.eos_id]
    spec.config.unk_token = tgt_vocab[c.unk_id]
    spec.config.decoder_start_token = tgt_vocab[c.bos_id]
    spec.config.add_source_eos = True  # our encoder always saw sources ending with eos
    spec.config.layer_norm_epsilon = c.layer_norm_eps
    return spec


def export_ctranslate2(
    source: str | Path, out_dir: str | Path, *, quantization: str | None = None, overwrite: bool = False
) -> Path:
    """Convert the model at ``source`` (a run directory, a checkpoint or a Hugging Face Marian directory) into a
    CTranslate2 model directory, with its SentencePiece model(s) copied beside it.

    Args:
        quantization: CTranslate2 weight type (one of :data:`QUANTIZATIONS`); None keeps float32.
        overwrite: replace a non-empty ``out_dir``.
    """
    ctranslate2 = require("ctranslate2")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InteropError(f"quantization: {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    model, config, tokenizer = load_any(source)
    out = prepare_output(out_dir, overwrite=overwrite)
    spec = transformer_spec(model, tokenizer)

    class _SpecConverter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    info = {
        "source": str(source),
        "lowercase": bool(getattr(tokenizer, "lowercase", False)),
        "quantization": quantization or "float32",
        "decode": config.decode.to_dict(),
        "note": "sources are SentencePiece pieces without </s> (CTranslate2 adds it); lowercase first if "
        "lowercase is true",
    }
    tokens = list(tokenizer.lang_tokens())
    if tokens:
        info["lang_tokens"] = tokens
        info["lang_note"] = ("a multilingual model: its target language's token is the first source piece "
                             "(>>fra<<, then the pieces); suppress_sequences=[[t] for t in lang_tokens]")  # fmt: skip
    with replaced_on_success(out) as staging:  # built beside it: a failure half-way leaves the old directory
        _SpecConverter().convert(str(staging), quantization=quantization, force=True)
        _copy_tokenizer_files(tokenizer, staging)
        (staging / "transduce.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    log.info("exported %s to %s (CTranslate2, %s)", source, out, info["quantization"])
    return out


def _copy_tokenizer_files(tokenizer, out: Path) -> None:
    if isinstance(tokenizer, MarianVocab):
        for name in ("source.spm", "target.spm"):
            shutil.copyfile(tokenizer.directory / name, out / name)
        return
    src_proto, tgt_proto = tokenizer.model_protos()
    if tokenizer.joint:
        (out / "spm.model").write_bytes(src_proto)
    else:
        (out / "spm.src.model").write_bytes(src_proto)
        (out / "spm.tgt.model").write_bytes(tgt_proto)
