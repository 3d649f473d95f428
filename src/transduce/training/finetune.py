"""Starting a training run from a pretrained model (``train.init_from``): fine-tuning.

``init_from`` names a transduce run directory or checkpoint, or a Hugging Face Marian directory (what ``import-hf``
reads). The run takes from it:

- the **vocabulary** (:func:`vocabulary`): the new corpus is prepared with the pretrained model's tokenizer and ids
  (Marian's ``source.spm`` for the source side and ``target.spm`` for the target side); with ``extend_vocab`` the
  pieces the new corpus needs are appended first (:func:`transduce.text.vocab.extend`);
- the **architecture** (:func:`model_config`): a model section that says otherwise is an error naming the field; the
  dropout rates are the exception (a fine-tuning choice, not a shape);
- the **weights** (:func:`initialise`): every tensor is copied; rows that extension adds to the embedding and output
  matrices start as the mean of the rows of the pieces the old vocabulary segmented them into, and are logged;
- optionally the **optimizer state** of a transduce training checkpoint (:func:`load_optimizer`).

The optimizer (unless kept), the schedule, the step and the data position start fresh. :func:`freeze` implements the
options against forgetting that keep parameters fixed (``freeze_embeddings``, ``freeze_encoder``,
``train_last_layers``); it applies to any run, resumed ones included.
"""

from __future__ import annotations

import functools
import logging
import shutil
from pathlib import Path

import torch

from transduce.config import Config, ModelConfig
from transduce.data import read_manifest
from transduce.data.corpus import resolve_corpora, split_entries
from transduce.errors import TransduceError
from transduce.model import Transformer
from transduce.text.langs import TargetLanguages, tokens_for
from transduce.text.tokenizer import Vocabulary
from transduce.text.vocab import extend, load_vocabulary
from transduce.training import checkpoint as ckpt
from transduce.transfer.mlm.model import MaskedLM

log = logging.getLogger(__name__)

VOCAB_DIR = "pretrained_vocab"  # in the run directory: the pretrained vocabulary (extended) the data is encoded with
_TUNABLE = ("dropout", "attention_dropout", "activation_dropout")  # model fields a fine-tuning run may change
_EXTENSION_SAMPLE = 200_000  # at most this many training pairs train the extension's SentencePiece model


class FinetuneError(TransduceError, ValueError):
    """The pretrained model cannot start this run (a contradicting model section, a missing file)."""


@functools.lru_cache(maxsize=1)
def _pretrained(path: str) -> tuple[Transformer | MaskedLM, Config, Vocabulary, Path | None]:
    """``(model, config, vocabulary, training checkpoint or None)`` of ``init_from`` (cached: read once per run).

    The model is a translation model (:class:`~transduce.model.Transformer`: a transduce run's or checkpoint's, or a
    Hugging Face Marian directory's) or a masked language model (:class:`~transduce.transfer.mlm.MaskedLM`, a
    ``data.task: mlm`` run's); both hold a source embedding and an encoder under the names of
    :data:`~transduce.model.encoder.ENCODER_PREFIXES`, which is what an encoder-only model takes from them.
    """
    from transduce.interop.marian import is_marian_dir, load_hf

    if is_marian_dir(path):
        model, config, vocab = load_hf(path)
        return model, config, vocab, None
    checkpoint = ckpt.resolve(path, prefer=ckpt.LAST)
    if ckpt.read_info(checkpoint).config.data.task == "mlm":
        from transduce.transfer.mlm import load_masked_lm

        pretrained, config, vocab_dir = load_masked_lm(checkpoint)
        return pretrained, config, load_vocabulary(vocab_dir), checkpoint
    model, config, vocab_dir = ckpt.load_model(checkpoint)
    return model, config, load_vocabulary(vocab_dir), checkpoint


def vocabulary(config: Config, run_dir: Path, *, resume: bool) -> Path:
    """The directory of the vocabulary the run encodes its data with: ``init_from``'s, extended with the pieces the
    training corpus needs when ``train.extend_vocab`` is set. Written once into ``RUN_DIR/pretrained_vocab``; a
    resumed run reuses it."""
    out = run_dir / VOCAB_DIR
    if resume and (out / "tokenizer.json").is_file():
        return out
    _, pre_config, vocab, _ = _pretrained(config.train.init_from)
    if pre_config.data.task == "mlm" and config.data.task != "classify":
        raise FinetuneError(f"train.init_from: {config.train.init_from} is a masked language model (data.task: mlm), "
                            f"which has no decoder: a {config.data.task} run cannot start from it (a classifier can: "
                            "data.task: classify)")  # fmt: skip
    held = vocab.lang_tokens() if hasattr(vocab, "lang_tokens") else {}
    if held and config.data.task == "translate" and not config.data.tgt_langs:
        codes = TargetLanguages(held).listed()
        raise FinetuneError(f"train.init_from: {config.train.init_from} writes {len(held)} target languages ({codes}) "
                            "and is told which by a token: set data.tgt_langs to the languages of the training data "
                            "(its pairs then get their token)")  # fmt: skip
    size = config.train.extend_vocab
    if size:
        src_text, tgt_text = _sample(config)
        extend(vocab, out, src_text, tgt_text, size=size, threads=max(1, config.data.workers))
    else:
        vocab.save(out)
    _add_language_tokens(out, config)
    return out


def _add_language_tokens(out: Path, config: Config) -> None:
    """With ``data.tgt_langs``: append to the vocabulary in ``out`` a token for each language it has none for
    (:func:`transduce.text.langs.tokens_for`); :func:`initialise` gives their rows the mean of their segmentation's
    rows, as for any added piece."""
    if not config.data.tgt_langs:
        return
    vocab = load_vocabulary(out)
    tokens = tokens_for(config.data.tgt_langs, vocab.lang_tokens())
    missing = [t for t in tokens if t not in vocab.lang_tokens()]
    if not missing:
        return
    staging = out.with_name(f".{out.name}.tokens-tmp")
    shutil.rmtree(staging, ignore_errors=True)
    vocab.with_lang_tokens(staging, tokens)
    shutil.rmtree(out)
    staging.rename(out)
    log.info("target-language tokens added to the pretrained vocabulary: %s", ", ".join(missing))


def _sample(config: Config) -> tuple[list[str], list[str]]:
    """The first training pairs (at most ``_EXTENSION_SAMPLE``), raw, for the extension's SentencePiece model."""
    d = config.data
    parts = resolve_corpora(d.train, d.src_lang, d.tgt_lang, (d.src_field, d.tgt_field), tgt_langs=d.tgt_langs,
                            lang_field=d.lang_field)  # fmt: skip
    src, tgt = [], []
    for _, s_raw, t_raw, _ in split_entries(parts):
        try:
            s, t = s_raw.decode("utf-8"), t_raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if s.strip() and t.strip():
            src.append(s)
            tgt.append(t)
            if len(src) >= _EXTENSION_SAMPLE:
                break
    return src, tgt


def model_config(config: Config, vocab: Vocabulary, *, resume: bool) -> ModelConfig:
    """The model of the run: ``init_from``'s shape and ids, the vocabulary sizes of ``vocab`` (larger after
    extension) and the dropout rates of ``config`` where it sets them.

    A field of ``config.model`` other than a dropout rate that is not at its default and differs from the pretrained
    model is an error (a resumed run's config already holds the resolved model and is taken as it is).

    Raises:
        FinetuneError: naming the field, the config's value and the pretrained model's.
    """
    if resume:
        return config.model
    _, pre_config, _, _ = _pretrained(config.train.init_from)
    pre, ours, default = pre_config.model.to_dict(), config.model.to_dict(), ModelConfig().to_dict()
    for key, value in ours.items():
        if key not in _TUNABLE and value != default[key] and value != pre[key]:
            raise FinetuneError(
                f"model.{key}: the config says {value!r}, the pretrained model {config.train.init_from} has "
                f"{pre[key]!r} (the architecture comes from train.init_from: drop model.{key} from the config)"
            )
    tuned = {k: ours[k] for k in _TUNABLE if ours[k] != default[k]}
    return ModelConfig.from_dict(
        {**pre, **tuned, "src_vocab_size": vocab.src_vocab_size, "tgt_vocab_size": vocab.tgt_vocab_size}
    )


def initialise(model: Transformer, config: Config, vocab: Vocabulary) -> None:
    """Copy ``init_from``'s weights into ``model`` (built from :func:`model_config`); rows that vocabulary extension
    added are the mean of the rows of their old segmentation.

    Raises:
        FinetuneError: a tensor of the pretrained model has no place in ``model`` or the reverse (not expected:
            the shapes come from the pretrained model).
    """
    pre_model, _, pre_vocab, _ = _pretrained(config.train.init_from)
    c = model.config
    sides = {"src": _row_sources(pre_vocab, vocab, "src"), "tgt": _row_sources(pre_vocab, vocab, "tgt")}
    pre_state, state = pre_model.state_dict(), model.state_dict()
    if pre_state.keys() != state.keys():
        odd = sorted(set(pre_state) ^ set(state))[:5]
        raise FinetuneError(f"{config.train.init_from}: tensors without a counterpart: {odd}")
    side_of = {"src_embed.weight": "src", "tgt_embed.weight": "tgt", "output.weight": "tgt", "output.bias": "tgt"}
    with torch.no_grad():
        for name, dst in state.items():
            src = pre_state[name].to(dst.dtype)
            if src.shape == dst.shape:
                dst.copy_(src)
                continue
            side = side_of.get(name)
            if side is None or src.shape[1:] != dst.shape[1:]:
                raise FinetuneError(f"{name}: pretrained {tuple(src.shape)}, model {tuple(dst.shape)}")
            old = src.shape[0]
            dst[:old].copy_(src)
            for row, ids in enumerate(sides[side], start=old):
                dst[row].copy_(src[ids].mean(dim=0))
    added = {side: len(rows) for side, rows in sides.items()}
    if any(added.values()):
        what = f"{added['src']} source" if c.share_vocab else f"{added['src']} source and {added['tgt']} target"
        log.info("vocabulary extension: %s embedding rows added, each the mean of the rows of its old segmentation "
                 "(the output projection's rows and biases too); every old id keeps its row", what)  # fmt: skip
    log.info("initialised every weight from %s", config.train.init_from)
    _pretrained.cache_clear()  # the run's model holds the weights now


def _row_sources(old: Vocabulary, new: Vocabulary, side: str) -> list[list[int]]:
    """For every id that ``new`` has beyond ``old`` on ``side``: the old ids its piece's text encodes into."""
    old_size = old.src_vocab_size if side == "src" else old.tgt_vocab_size
    new_size = new.src_vocab_size if side == "src" else new.tgt_vocab_size
    if new_size <= old_size:
        return []
    pieces = (new.src_pieces if side == "src" else new.tgt_pieces)(range(old_size, new_size))
    encode = old.encode_src_batch if side == "src" else old.encode_tgt_batch
    to_pieces = old.src_pieces if side == "src" else old.tgt_pieces
    unk = getattr(old, "unk_id", 3)
    out = []
    for piece, ids in zip(pieces, encode([p.replace("▁", " ") for p in pieces])):
        if not piece.startswith("▁") and ids and to_pieces(ids[:1]) == ["▁"]:
            ids = ids[1:]  # SentencePiece's own word-start marker: not part of a word-internal piece
        out.append(ids or [unk])
    return out


def freeze(model: Transformer, config: Config) -> None:
    """Keep fixed (``requires_grad=False``, so the optimizer never sees them) what ``freeze_embeddings``,
    ``freeze_encoder`` and ``train_last_layers`` say. Call before the optimizer is built.

    Raises:
        FinetuneError: ``train_last_layers`` is not smaller than a stack's depth.
    """
    cfg, c = config.train, model.config
    frozen: list[torch.nn.Module] = []
    if cfg.freeze_embeddings or cfg.train_last_layers:
        frozen += [model.src_embed, model.tgt_embed]
        if c.positions == "learned":
            frozen += [model.src_positions, model.tgt_positions]
    if cfg.freeze_encoder:
        frozen += [model.src_embed, model.encoder_layers, model.encoder_norm]
        if c.positions == "learned":
            frozen.append(model.src_positions)
        if c.share_vocab:
            log.warning("train.freeze_encoder: the vocabulary is shared, so the decoder's embeddings (and a tied "
                        "output projection) stay fixed too")  # fmt: skip
    k = cfg.train_last_layers
    if k:
        for name, layers in (("encoder", model.encoder_layers), ("decoder", model.decoder_layers)):
            if k >= len(layers):
                raise FinetuneError(f"train.train_last_layers: {k} is not fewer than the {len(layers)} {name} layers")
            frozen += list(layers[: len(layers) - k])
    if not frozen:
        return
    for module in frozen:
        for p in module.parameters():
            p.requires_grad_(False)
    fixed = sum(p.numel() for p in {id(p): p for p in model.parameters() if not p.requires_grad}.values())
    log.info("frozen: %s parameters stay fixed, %s train", f"{fixed:,}", f"{model.num_parameters():,}")


def load_optimizer(trainer, config: Config) -> None:
    """Give ``trainer`` the optimizer state (Adam's moments) of ``init_from``'s training checkpoint; the step, the
    schedule and the skip counters start from zero, and the betas, eps and weight decay are this run's
    (:meth:`transduce.training.trainer.Trainer.load_state_dict` logs both)."""
    path = config.train.init_from
    _, _, _, checkpoint = _pretrained(path)
    if checkpoint is None:
        raise FinetuneError(f"train.init_optimizer: {path} is a Hugging Face model, which has no optimizer state")
    saved = ckpt.load_trainer_state(checkpoint)["trainer"]
    try:
        fresh = {"step": 0, "nonfinite_in_row": 0, "nonfinite_total": 0}
        trainer.load_state_dict({**saved, **fresh}, source=str(checkpoint))
    except (ValueError, KeyError, RuntimeError) as e:
        raise FinetuneError(
            f"train.init_optimizer: the optimizer state of {checkpoint} does not fit this run's parameters ({e}); "
            "freezing changes the parameters the optimizer holds"
        ) from None


def check_prepared(prepared: Path, vocab_dir: Path) -> None:
    """A given prepared directory (``data.prepared`` without raw data) must hold the pretrained vocabulary, or (a
    parser's, whose tree tokens are its own) have been prepared with it, as its manifest records."""
    wanted = ckpt.vocab_sha256(vocab_dir)
    if wanted not in (ckpt.vocab_sha256(prepared), read_manifest(prepared)["options"].get("vocabulary")):
        raise FinetuneError(
            f"{prepared}: prepared with another vocabulary than the pretrained model's; set data.train to prepare "
            "the corpus with it"
        )
