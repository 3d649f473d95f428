"""Hugging Face Marian in and out.

``export_hf(RUN, OUT)`` writes a directory that ``transformers.MarianMTModel.from_pretrained`` (or
``PegasusForConditionalGeneration``'s, for pre-norm models) and ``MarianTokenizer.from_pretrained`` load with no code
of ours; ``load_hf(DIR)`` / ``import_hf(DIR, OUT)`` read a Marian model (the public opus-mt models included) into our
:class:`~transduce.model.Transformer`, so our beam search, server and tools work with it.

The two architectures are the same function up to one detail: Marian's sinusoidal position table puts the sines
of all frequencies first and the cosines second (``[sin | cos]``), ours interleaves them (``sin, cos, sin, ...``)
as the paper writes the formula. Nothing else in a Transformer depends on the order of the residual-stream
dimensions (LayerNorm is elementwise, every projection reads or writes whole vectors), so the conversion permutes
those dimensions: embedding columns, the input columns of every projection that reads the stream, the output rows
(and biases) of every projection that writes it, and the LayerNorm parameters. The permuted model computes exactly
the same logits with Marian's own position table, which ``from_pretrained`` always regenerates.

Pre-norm models (Marian is post-norm) are written as ``PegasusForConditionalGeneration`` instead, with the same
weight correspondence plus the final LayerNorms (:mod:`transduce.interop.pegasus` says why Pegasus and not M2M100).
What neither can express, export refuses with the reason: learned positions, a LayerNorm epsilon other than 1e-5,
and for pre-norm models separate vocabularies. Every export is checked before it is written: the saved directory
is loaded back with ``from_pretrained`` and its logits must equal ours within 1e-4.

Token ids: our vocabularies put pad, bos, eos, unk at 0-3 and the decoder starts from bos; the exported
``vocab.json`` lists our SentencePiece pieces in id order and the config names those ids. Marian's own models put
eos at 0, unk at 1, pad last and start the decoder from pad; an imported model keeps its ids (our config holds
them) and its vocabulary, read through ``transformers.MarianTokenizer`` (:class:`MarianVocab`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transduce.config import Config, DataConfig, DecodeConfig, ModelConfig
from transduce.errors import InteropError
from transduce.interop import hf_config_fields, prepare_output, require
from transduce.interop.marian_vocab import MarianVocab, write_marian_vocab
from transduce.interop.pegasus import pegasus_config, pegasus_problems
from transduce.model import Transformer

log = logging.getLogger(__name__)

MARIAN_LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which MarianMTModel uses
_MARIAN_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # Marian -> ours
PARITY_ATOL = 1e-4


# ----------------------------------------------------------------------------------------------------------------------
# the weight correspondence


def residual_permutation(d_model: int) -> Tensor:
    """``perm`` with ``marian[..., j] == ours[..., perm[j]]`` along every residual-stream axis: Marian's dimension
    ``j < d/2`` holds our ``2j`` (a sine), dimension ``d/2 + j`` our ``2j + 1`` (the cosine of the same frequency)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _weight_table(model: Transformer) -> list[tuple[str, Tensor | None, str]]:
    """Every Marian tensor (all tied aliases included) with the tensor of ``model`` that holds it (a view where we
    fuse projections; None for a bias we do not have) and where its residual-stream axis is: ``"in"`` (dim 1),
    ``"out"`` (dim 0) or ``""`` (none)."""
    c = model.config
    rows: list[tuple[str, Tensor | None, str]] = []

    def linear(name: str, weight: Tensor, bias: Tensor | None, reads_stream: bool) -> None:
        rows.append((f"{name}.weight", weight, "in" if reads_stream else "out"))
        rows.append((f"{name}.bias", bias, "" if reads_stream else "out"))

    def norm(name: str, ln: torch.nn.LayerNorm) -> None:
        rows.append((f"{name}.weight", ln.weight, "out"))
        rows.append((f"{name}.bias", ln.bias, "out"))

    def chunks(t: Tensor | None, n: int) -> Sequence[Tensor | None]:
        return t.chunk(n) if t is not None else [None] * n

    if c.share_vocab:
        names = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
        rows += [(name, model.src_embed.weight, "in") for name in names]
    else:
        rows.append(("model.encoder.embed_tokens.weight", model.src_embed.weight, "in"))
        rows.append(("model.decoder.embed_tokens.weight", model.tgt_embed.weight, "in"))
    rows.append(("lm_head.weight", model.output.weight, "in"))
    rows.append(("final_logits_bias", model.output.bias, "row"))

    def self_attention(prefix: str, attn) -> None:
        for name, w, b in zip("qkv", attn.qkv.weight.chunk(3), chunks(attn.qkv.bias, 3)):
            linear(f"{prefix}.{name}_proj", w, b, reads_stream=True)
        linear(f"{prefix}.out_proj", attn.out.weight, attn.out.bias, reads_stream=False)

    for i, layer in enumerate(model.encoder_layers):
        p = f"model.encoder.layers.{i}"
        self_attention(f"{p}.self_attn", layer.self_attn)
        norm(f"{p}.self_attn_layer_norm", layer.norm1)
        linear(f"{p}.fc1", layer.ffn.w1.weight, layer.ffn.w1.bias, reads_stream=True)
        linear(f"{p}.fc2", layer.ffn.w2.weight, layer.ffn.w2.bias, reads_stream=False)
        norm(f"{p}.final_layer_norm", layer.norm2)
    for i, layer in enumerate(model.decoder_layers):
        p = f"model.decoder.layers.{i}"
        self_attention(f"{p}.self_attn", layer.self_attn)
        norm(f"{p}.self_attn_layer_norm", layer.norm1)
        x = layer.cross_attn
        linear(f"{p}.encoder_attn.q_proj", x.q.weight, x.q.bias, reads_stream=True)
        for name, w, b in zip("kv", x.kv.weight.chunk(2), chunks(x.kv.bias, 2)):
            linear(f"{p}.encoder_attn.{name}_proj", w, b, reads_stream=True)
        linear(f"{p}.encoder_attn.out_proj", x.out.weight, x.out.bias, reads_stream=False)
        norm(f"{p}.encoder_attn_layer_norm", layer.norm2)
        linear(f"{p}.fc1", layer.ffn.w1.weight, layer.ffn.w1.bias, reads_stream=True)
        linear(f"{p}.fc2", layer.ffn.w2.weight, layer.ffn.w2.bias, reads_stream=False)
        norm(f"{p}.final_layer_norm", layer.norm3)
    if c.norm == "pre":  # the final LayerNorms of pre-norm stacks (Pegasus has them; Marian is post-norm)
        norm("model.encoder.layer_norm", model.encoder_norm)
        norm("model.decoder.layer_norm", model.decoder_norm)
    return rows


def _marian_tensors(hf) -> dict[str, Tensor]:
    """All parameters and buffers of a MarianMTModel by name, tied aliases included."""
    named = dict(hf.named_parameters(remove_duplicate=False))
    named.update(dict(hf.named_buffers(remove_duplicate=False)))
    return named


def copy_to_marian(model: Transformer, hf) -> None:
    """Write ``model``'s weights into the MarianMTModel ``hf`` (built from :func:`marian_config`), permuted."""
    perm = residual_permutation(model.config.d_model)
    theirs = _marian_tensors(hf)
    done = set()
    with torch.no_grad():
        for name, ours, axis in _weight_table(model):
            if name not in theirs:
                raise InteropError(f"MarianMTModel has no tensor {name!r} (transformers version mismatch?)")
            dst = theirs[name]
            if ours is None:  # a bias our model does not have: Marian's is zero
                dst.zero_()
            elif axis == "row":
                dst.copy_(ours.detach().reshape(dst.shape))
            else:
                dst.copy_(ours.detach()[:, perm] if axis == "in" else ours.detach()[perm] if axis == "out" else ours)
            done.add(name)
    left = {n for n in theirs if n not in done and "embed_positions" not in n}
    if left:
        raise InteropError(f"MarianMTModel tensors without a counterpart in our model: {sorted(left)[:5]}")


def copy_from_marian(hf, model: Transformer) -> None:
    """Write the MarianMTModel ``hf``'s weights into ``model`` (built from :func:`model_config_from_marian`)."""
    inverse = torch.argsort(residual_permutation(model.config.d_model))
    theirs = _marian_tensors(hf)
    used = set()
    with torch.no_grad():
        for name, ours, axis in _weight_table(model):
            src = theirs[name].detach().float()
            used.add(name)
            if ours is None:
                if src.abs().max() > 0:
                    raise InteropError(f"{name}: non-zero, but the model config has no such bias")
                continue
            if axis == "row":
                ours.copy_(src.reshape(ours.shape))
            else:
                ours.copy_(src[:, inverse] if axis == "in" else src[inverse] if axis == "out" else src)
    left = {n for n in theirs if n not in used and "embed_positions" not in n}
    if left:
        raise InteropError(f"Marian tensors this version cannot map: {sorted(left)[:5]}")


# ----------------------------------------------------------------------------------------------------------------------
# configurations


def export_problems(c: ModelConfig) -> list[str]:
    """Why a model with config ``c`` cannot be written as a MarianMTModel, or as a Pegasus model when it is pre-norm
    (empty when it can)."""
    if c.norm == "pre":
        return pegasus_problems(c)
    problems = []
    if c.positions != "sinusoidal":
        problems.append(f"model.positions is {c.positions!r}, and Marian has sinusoidal positions only")
    if c.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        problems.append(f"model.layer_norm_eps is {c.layer_norm_eps}, and Marian's LayerNorm uses 1e-5")
    if c.share_vocab and not c.tie_output:
        problems.append(
            "model.share_vocab is true with tie_output false, and Marian ties the output projection to "
            "embeddings it shares between encoder and decoder"
        )
    return problems


def marian_config(c: ModelConfig):
    """The ``transformers.MarianConfig`` of our model config (check :func:`export_problems` first)."""
    transformers = require("transformers")
    return transformers.MarianConfig(
        vocab_size=c.src_vocab_size,
        decoder_vocab_size=c.tgt_vocab_size,
        share_encoder_decoder_embeddings=c.share_vocab,
        **hf_config_fields(c),
    )


def model_config_from_marian(hf_config, *, unk_id: int, output_bias: bool) -> ModelConfig:
    """Our model config for a ``MarianConfig``; raises :class:`InteropError` for what our model cannot express."""
    h = hf_config
    problems = []
    if getattr(h, "normalize_before", False):
        problems.append("normalize_before is true (pre-norm Marian variants are not supported)")
    if getattr(h, "normalize_embedding", False):
        problems.append("normalize_embedding is true (a LayerNorm on the embeddings is not supported)")
    if h.encoder_attention_heads != h.decoder_attention_heads:
        problems.append(f"encoder and decoder heads differ ({h.encoder_attention_heads}, {h.decoder_attention_heads})")
    if h.encoder_ffn_dim != h.decoder_ffn_dim:
        problems.append(f"encoder and decoder ffn sizes differ ({h.encoder_ffn_dim}, {h.decoder_ffn_dim})")
    if h.activation_function not in _MARIAN_ACTIVATIONS:
        problems.append(f"activation_function {h.activation_function!r} is not one of {sorted(_MARIAN_ACTIVATIONS)}")
    if problems:
        raise InteropError("cannot import this Marian model: " + "; ".join(problems))
    share = bool(getattr(h, "share_encoder_decoder_embeddings", True))
    tgt_vocab = h.vocab_size if share else (h.decoder_vocab_size or h.vocab_size)
    return ModelConfig(
        src_vocab_size=h.vocab_size,
        tgt_vocab_size=tgt_vocab,
        share_vocab=share,
        tie_output=bool(getattr(h, "tie_word_embeddings", True)),
        encoder_layers=h.encoder_layers,
        decoder_layers=h.decoder_layers,
        d_model=h.d_model,
        d_ff=h.encoder_ffn_dim,
        heads=h.encoder_attention_heads,
        dropout=float(h.dropout),
        attention_dropout=float(h.attention_dropout),
        activation_dropout=float(h.activation_dropout),
        activation=_MARIAN_ACTIVATIONS[h.activation_function],
        norm="post",
        layer_norm_eps=MARIAN_LAYER_NORM_EPS,
        positions="sinusoidal",
        max_positions=max(h.max_position_embeddings, 2),
        scale_embeddings=bool(h.scale_embedding),
        bias=True,
        output_bias=output_bias,
        pad_id=h.pad_token_id,
        bos_id=h.decoder_start_token_id if h.decoder_start_token_id is not None else h.pad_token_id,
        eos_id=h.eos_token_id,
        unk_id=unk_id,
    )


# ----------------------------------------------------------------------------------------------------------------------
# export


def _probe_batch(c: ModelConfig, seed: int = 0) -> tuple[Tensor, Tensor]:
    """A small batch of random, right-padded source ids and decoder inputs (no special ids inside)."""
    g = torch.Generator().manual_seed(seed)
    specials = {c.pad_id, c.bos_id, c.eos_id}

    def ids(n: int, vocab: int) -> list[int]:
        out = torch.randint(0, vocab, (n,), generator=g).tolist()
        return [c.unk_id if i in specials else i for i in out]

    lengths = [7, 4, 1]
    src = torch.full((len(lengths), max(lengths) + 1), c.pad_id)
    tgt = torch.full((len(lengths), max(lengths) + 2), c.pad_id)
    for row, n in enumerate(lengths):
        src[row, : n + 1] = torch.tensor([*ids(n, c.src_vocab_size), c.eos_id])
        tgt[row, : n + 2] = torch.tensor([c.bos_id, *ids(n + 1, c.tgt_vocab_size)])
    return src, tgt


def marian_logits(hf, src: Tensor, tgt_in: Tensor, pad_id: int) -> Tensor:
    """Logits of a MarianMTModel under teacher forcing (decoder inputs start with the decoder start token)."""
    with torch.no_grad():
        return hf(input_ids=src, attention_mask=src.ne(pad_id).long(), decoder_input_ids=tgt_in).logits


def marian_model(model: Transformer):
    """A ``transformers.MarianMTModel`` (in eval mode) that computes ``model``'s function: built from
    :func:`marian_config`, weights copied by :func:`copy_to_marian`; for a pre-norm model a
    ``PegasusForConditionalGeneration`` (:mod:`transduce.interop.pegasus`) instead."""
    hf = hf_class(model.config)(hf_config(model.config)).eval()
    copy_to_marian(model, hf)
    return hf


def hf_class(c: ModelConfig):
    """The transformers class a model exports as: MarianMTModel (post-norm) or PegasusForConditionalGeneration."""
    transformers = require("transformers")
    return transformers.PegasusForConditionalGeneration if c.norm == "pre" else transformers.MarianMTModel


def hf_config(c: ModelConfig):
    """The transformers config of :func:`hf_class`."""
    return pegasus_config(c) if c.norm == "pre" else marian_config(c)


def parity_error(model: Transformer, hf) -> float:
    """Largest |our logit - Marian's logit| over a probe batch, at the decoder positions of real tokens."""
    c = model.config
    src, tgt = _probe_batch(c)
    with torch.no_grad():
        ours = model.eval()(src, tgt)
    theirs = marian_logits(hf.eval(), src, tgt, c.pad_id)
    real = tgt.ne(c.pad_id)
    real[:, 0] = True  # the start token may equal pad (Marian's convention)
    return float((ours - theirs).abs()[real].max())


def export_hf(source: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Write the model at ``source`` (a run directory, checkpoint, or Marian directory) as a Hugging Face Marian
    model directory: config.json, generation_config.json, model.safetensors, source.spm, target.spm, vocab.json
    (+ target_vocab.json for separate vocabularies), tokenizer_config.json and a README.md.

    Raises:
        InteropError: the model uses something Marian cannot express (the message lists it), the output directory
            is not empty, or the saved model does not reproduce our logits.
    """
    transformers = require("transformers")
    model, config, tokenizer = load_any(source)
    problems = export_problems(model.config)
    arch = "Pegasus" if model.config.norm == "pre" else "Marian"
    if problems:
        raise InteropError(f"{source}: cannot export to Hugging Face {arch}: {'; '.join(problems)}")
    out = prepare_output(out_dir, overwrite=overwrite)
    hf = marian_model(model)
    c, d = model.config, config.decode
    # our search never emits pad, bos or a multilingual model's target-language tokens (model.suppress_ids)
    bad = [[c.pad_id]] + ([[c.bos_id]] if c.bos_id != c.pad_id else []) + [[i] for i in c.suppress_ids]
    hf.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=c.bos_id,
        bos_token_id=c.bos_id,
        eos_token_id=c.eos_id,
        pad_token_id=c.pad_id,
        forced_eos_token_id=c.eos_id,
        num_beams=d.beam,
        max_length=min(512, c.max_positions),  # as opus-mt; Hugging Face's default of 20 cuts translations short
        bad_words_ids=bad,
        # beam settings only with a beam: transformers refuses to save them beside num_beams 1 (greedy decoding)
        **(dict(length_penalty=d.length_penalty, early_stopping=d.early_stopping) if d.beam > 1 else {}),
    )  # early_stopping True: stop at num_beams finished hypotheses, as our early_stopping
    staging = out.parent / f".{out.name}.export-tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with quiet_progress(transformers):
            hf.save_pretrained(str(staging))
        tokens = list(tokenizer.lang_tokens())
        # a multilingual model writes the language its source's token names: no one target_lang (null, not
        # data.tgt_lang, which it does not read); MarianTokenizer reads neither for anything but Moses's normaliser
        tgt_lang = None if tokens else config.data.tgt_lang
        write_marian_vocab(tokenizer, staging, src_lang=config.data.src_lang, tgt_lang=tgt_lang)
        (staging / "README.md").write_text(_model_card(config, source, tokens), encoding="utf-8")
        with quiet_progress(transformers):
            reloaded = hf_class(model.config).from_pretrained(str(staging)).eval()
        err = parity_error(model, reloaded)
        if err > PARITY_ATOL:
            raise InteropError(f"{source}: the exported {arch} model's logits differ from ours by {err:.2e}")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("exported %s to %s (Hugging Face %s; logits within %.1e of ours)", source, out, arch, err)
    return out


def _model_card(config: Config, source: str | Path, tokens: list[str]) -> str:
    c, d = config.model, config.decode
    cls = hf_class(c).__name__
    case = (
        "\nThe model was trained on **lowercased** text and MarianTokenizer does not lowercase: lowercase the "
        "input yourself.\n"
        if config.data.lowercase
        else ""
    )
    if d.length_norm == "length":
        penalty = "Both transduce and Hugging Face divide a hypothesis's log-probability by |Y| ** length_penalty."
    else:
        penalty = (
            f"transduce's length penalty is GNMT's ((5 + |Y|) / 6) ** {d.length_penalty}; Hugging Face divides by\n"
            "|Y| ** length_penalty instead, so n-best orders can differ where the penalty decides."
        )
    langs = ""
    if tokens:
        listed = ", ".join(f"`{t}`" for t in tokens)
        langs = (f"\nA multilingual model: put the target language's token before each source sentence ({listed}), "
                 f"as OPUS-MT's multilingual models take it:\n`tok([\"{tokens[0]} A sentence.\"])`.\n")  # fmt: skip
    return f"""---
library_name: transformers
pipeline_tag: translation
tags: [translation, {"pegasus" if c.norm == "pre" else "marian"}, transduce]
---
# {config.data.src_lang}-{"+".join(config.data.tgt_langs) or config.data.tgt_lang} Transformer exported by transduce

Exported from `{source}`: {c.encoder_layers}+{c.decoder_layers} layers, d_model {c.d_model}, d_ff {c.d_ff},
{c.heads} heads, vocabulary {c.src_vocab_size}{"" if c.share_vocab else f"/{c.tgt_vocab_size}"}.
{case}{langs}
```python
from transformers import {cls}, MarianTokenizer

tok = MarianTokenizer.from_pretrained("THIS_DIRECTORY")
model = {cls}.from_pretrained("THIS_DIRECTORY")
batch = tok(["A sentence to translate."], return_tensors="pt", padding=True)
print(tok.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

Decoding defaults (generation_config.json): beam {d.beam}, length_penalty {d.length_penalty}. {penalty}
"""


# ----------------------------------------------------------------------------------------------------------------------
# import


@contextlib.contextmanager
def quiet_progress(transformers: Any) -> Iterator[None]:
    """Hugging Face's progress bars ("Loading weights", "Writing model shards") off inside the block and as they
    were after it: loading or writing one small local model is not a long task, and the bars drown the log."""
    hf_logging = transformers.utils.logging
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def is_marian_dir(path: str | Path) -> bool:
    """Whether ``path`` is a Hugging Face model directory whose config says ``model_type: marian``."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type") == "marian"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def load_hf(directory: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Config, MarianVocab]:
    """A Hugging Face Marian model directory as ``(model, config, vocabulary)``: our Transformer with its weights,
    a config (model shape, the model's special ids, decoding defaults from generation_config.json) and
    :class:`MarianVocab`."""
    transformers = require("transformers")
    directory = Path(directory)
    if not is_marian_dir(directory):
        raise InteropError(f"{directory}: not a Hugging Face Marian model (no config.json with model_type 'marian')")
    try:
        with quiet_progress(transformers):
            hf = transformers.MarianMTModel.from_pretrained(str(directory)).eval()
    except (OSError, ValueError) as e:
        raise InteropError(f"{directory}: cannot load the Marian model ({str(e).splitlines()[0]})") from None
    vocab = MarianVocab.from_pretrained(directory)
    bias = hf.final_logits_bias.detach()
    mc = model_config_from_marian(hf.config, unk_id=vocab.unk_id, output_bias=bool(bias.abs().max() > 0))
    if (vocab.src_vocab_size, vocab.tgt_vocab_size) != (mc.src_vocab_size, mc.tgt_vocab_size):
        raise InteropError(
            f"{directory}: the vocabulary has {vocab.src_vocab_size}/{vocab.tgt_vocab_size} entries, the model "
            f"{mc.src_vocab_size}/{mc.tgt_vocab_size}"
        )
    # a multilingual model's >>xxx<< tokens: never generated (transduce.text.langs)
    suppress = vocab.lang_token_tgt_ids()
    if suppress:
        mc = mc.replace(suppress_ids=suppress)
        log.info("%s: %d target-language tokens (%s, ...)", directory, len(suppress), vocab.tgt_pieces(suppress[:3]))
    model = Transformer(mc)
    copy_from_marian(hf, model)
    gen = getattr(hf, "generation_config", None)
    beam = int(getattr(gen, "num_beams", 0) or 0) or DecodeConfig().beam
    langs = {k: v for k, v in (("src_lang", vocab.meta["source_lang"]), ("tgt_lang", vocab.meta["target_lang"])) if v}
    data = DataConfig(**langs) if len(set(langs.values())) == len(langs) else DataConfig()
    config = Config(model=mc, data=data, decode=DecodeConfig(beam=beam))
    return model.to(device).eval(), config, vocab


def load_any(path: str | Path, device: str | torch.device = "cpu"):
    """``(model, config, tokenizer)`` from a run directory, a checkpoint or a Hugging Face Marian directory."""
    if is_marian_dir(path):
        return load_hf(path, device)
    from transduce.text.vocab import load_vocabulary
    from transduce.training.checkpoint import load_model

    model, config, vocab_dir = load_model(path, device)
    return model, config, load_vocabulary(vocab_dir)


def import_hf(directory: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Convert a Hugging Face Marian directory into a standalone transduce checkpoint at ``out_dir`` (weights,
    config and the Marian vocabulary); ``transduce translate --model OUT_DIR`` and the server read it."""
    from transduce.training.checkpoint import save_model

    model, config, vocab = load_hf(directory)
    out = prepare_output(out_dir, overwrite=overwrite)
    staging = Path(tempfile.mkdtemp(prefix="marian-import-"))
    try:
        vocab_dir = vocab.save(staging / "vocab")
        if out.exists():
            shutil.rmtree(out)
        save_model(out, model, config, vocab_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("imported %s into %s (%s parameters)", directory, out, f"{model.num_parameters():,}")
    return out
