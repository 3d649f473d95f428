"""Configuration: one dataclass per concern, validated in one place, YAML/JSON in and out.

A run is described by :class:`Config`, which holds a :class:`ModelConfig`, a :class:`DataConfig`, a
:class:`TrainConfig` and a :class:`DecodeConfig`. Every default lives here and nowhere else. Unknown keys are
rejected with the closest valid key suggested; values are type-checked; choices list the valid options.

    cfg = Config.load("configs/multi30k_en_de.yaml", overrides=["train.max_steps=2000", "model.dropout=0.2"])
    cfg.save("run/config.yaml")
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from transduce.device import PRECISIONS, check_device_name
from transduce.errors import TransduceError
from transduce.text.casing import INPUT_CASES
from transduce.text.langs import LanguageError, canonical, check_code
from transduce.text.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class ConfigError(TransduceError, ValueError):
    """A configuration value or key is invalid. The message names the dotted key."""


# ----------------------------------------------------------------------------------------------------------------------
# generic machinery


def _closest(value: Any, choices: Any, prefix: str = "") -> str:
    """``"; did you mean 'PREFIXchoice'?"`` for the closest of ``choices`` to ``value`` (difflib), else ``""``."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def _check_choice(where: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(
            f"{where}: {value!r} is not one of {', '.join(repr(c) for c in choices)}{_closest(value, choices)}"
        )


def _check_positive(where: str, value: float, allow_zero: bool = False) -> None:
    """``value`` must be a finite number > 0 (>= 0 with ``allow_zero``): NaN and infinity are refused too, since no
    option means "no limit" by infinity (0 does, where documented)."""
    if (isinstance(value, float) and not math.isfinite(value)) or not (value > 0 or (value == 0 and allow_zero)):
        raise ConfigError(f"{where}: must be a finite number {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def _check_sections(data: Any, kind: str = "mapping") -> None:
    """A whole config must be a mapping of its sections (a list, a string or a number is not one)."""
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a {kind} of sections (model, data, train, decode), got {type(data).__name__}")


def _unknown_key(where: str, key: str, valid: list[str]) -> ConfigError:
    close = [k for k in valid if k.startswith(key + "_")]  # "warmup": warmup_steps and warmup_by, in field order
    close = close or difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = "; did you mean " + " or ".join(f"'{where}{k}'" for k in close) + "?" if close else ""
    return ConfigError(f"unknown key '{where}{key}'{hint} (valid keys: {', '.join(valid)})")


def _coerce(where: str, value: Any, tp: Any) -> Any:
    """Check (and gently coerce: int -> float, list -> tuple) ``value`` against the annotation ``tp``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(where, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_coerce(f"{where}[{i}]", v, inner) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string: accept any float literal
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, where + ".")
    raise TypeError(f"unsupported annotation {tp!r} at {where}")


def _from_dict(cls: type, data: Any, where: str = "") -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where.rstrip('.') or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key(where, str(key), names)
        kwargs[key] = _coerce(where + key, value, hints[key])
    try:
        return cls(**kwargs)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(where) or not where else where + msg) from None


class _Section:
    """Mixin for the config dataclasses: dict / YAML / JSON round-trips."""

    @classmethod
    def from_dict(cls, data: dict, where: str = "") -> Any:
        """Build from a plain mapping; unknown keys and wrong types raise :class:`ConfigError`, whose message
        names the key after ``where`` (the section, ``"data."``)."""
        return _from_dict(cls, data, where)

    def to_dict(self) -> dict:
        """A plain, JSON/YAML-serialisable mapping (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))  # type: ignore[arg-type]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> Any:
        return cls.from_dict(json.loads(text))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> Any:
        return cls.from_dict(yaml.safe_load(text) or {})

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` applied and validated."""
        return self.from_dict({**self.to_dict(), **changes})


# ----------------------------------------------------------------------------------------------------------------------
# the model


@dataclass
class ModelConfig(_Section):
    """The Transformer's shape (paper §3). Defaults are the paper's base model with a 37k shared vocabulary."""

    src_vocab_size: int = 37000  # source vocabulary size, special ids included
    tgt_vocab_size: int = 37000  # target vocabulary size; equal to src_vocab_size when share_vocab
    share_vocab: bool = True  # one vocabulary for both sides: encoder, decoder and output share one matrix (§3.4)
    tie_output: bool = True  # decoder input embedding and pre-softmax projection share one matrix
    encoder_layers: int = 6  # N for the encoder
    decoder_layers: int = 6  # N for the decoder
    d_model: int = 512  # width of the residual stream and the embeddings
    d_ff: int = 2048  # inner size of the position-wise feed-forward network
    heads: int = 8  # h; d_k = d_v = d_model / h
    dropout: float = 0.1  # residual dropout and dropout on embeddings + positions (P_drop)
    attention_dropout: float = 0.0  # dropout on the attention weights (not in the paper; tensor2tensor uses 0.1)
    activation_dropout: float = 0.0  # dropout after the ReLU inside the feed-forward network (not in the paper)
    activation: str = "relu"  # feed-forward non-linearity: relu (paper), gelu or swish (Marian's opus-mt models)
    norm: str = "post"  # post: LayerNorm(x + Sublayer(x)) as the paper; pre: x + Sublayer(LayerNorm(x)) + final norms
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon
    positions: str = "sinusoidal"  # sinusoidal (paper, any length) or learned (Table 3 row E; up to max_positions)
    max_positions: int = 1024  # longest sequence for learned positions (sinusoidal ones have no limit)
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model) (§3.4)
    bias: bool = True  # biases in the attention projections (the feed-forward biases of the paper are always on)
    output_bias: bool = False  # a bias on the pre-softmax projection (not in the paper; Marian's final_logits_bias)
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID
    # target ids the search never generates: a multilingual model's target-language tokens (transduce.text.langs), set
    # from the vocabulary by train and import-hf
    suppress_ids: list[int] = field(default_factory=list)
    # the fields below shape a classifier (data.task: classify; transduce.transfer.classify); a translation model has
    # none classify: the sentence vector is a prepended <cls> position's state (cls), or the mean (mean) or the
    # element-wise maximum (max) of the states of the real positions
    pooling: str = "cls"
    # classify with train.init_from: finetune trains the pretrained encoder with the head; cove keeps it fixed and
    # trains a small task model over [word embedding; encoder state] (McCann et al., 2017)
    transfer: str = "finetune"
    # classify, transfer cove: the task model is transformer encoder layers (transformer) or a bidirectional LSTM of
    # d_model / 2 units per direction (bilstm, McCann et al.'s; pooled by mean or max)
    cove_task: str = "transformer"
    cove_layers: int = 1  # classify, transfer cove: the task model's layers (transformer: 0 is the projection only)
    labels: list[str] = field(default_factory=list)  # classify: the class names, set from the training data

    def __post_init__(self) -> None:
        _check_choice("pooling", self.pooling, ("cls", "mean", "max"))
        _check_choice("transfer", self.transfer, ("finetune", "cove"))
        _check_choice("cove_task", self.cove_task, ("transformer", "bilstm"))
        _check_positive("cove_layers", self.cove_layers, allow_zero=True)
        if self.transfer == "cove" and self.cove_task == "bilstm":
            if self.pooling == "cls":
                raise ConfigError("pooling: a bilstm task model pools with mean or max, not cls (at a prepended "
                                  "<cls> position its forward direction has read nothing but <cls>)")  # fmt: skip
            if self.cove_layers < 1:
                raise ConfigError("cove_layers: a bilstm task model needs at least one layer")
            if self.d_model % 2:
                raise ConfigError(f"d_model: a bilstm task model has d_model / 2 units per direction, so d_model "
                                  f"must be even, got {self.d_model}")  # fmt: skip
        if self.transfer == "cove" and self.cove_layers == 0 and self.pooling == "cls":  # (bilstm: refused above)
            raise ConfigError("pooling: cls pooling needs at least one task layer (with cove_layers: 0 nothing reads "
                              "the text into the <cls> position: every text gets the same scores); set pooling: mean "
                              "or max, or cove_layers: 1 or more")  # fmt: skip
        if len(set(self.labels)) != len(self.labels) or "" in self.labels:
            raise ConfigError(f"labels: must be distinct, non-empty names, got {self.labels!r}")
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "d_ff", "heads", "max_positions"):
            _check_positive(name, getattr(self, name))
        for name in ("encoder_layers", "decoder_layers"):
            _check_positive(name, getattr(self, name))
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name}: must be in [0, 1), got {getattr(self, name)!r}")
        _check_choice("activation", self.activation, ("relu", "gelu", "swish"))
        _check_choice("norm", self.norm, ("post", "pre"))
        _check_choice("positions", self.positions, ("sinusoidal", "learned"))
        if self.d_model % self.heads:
            raise ConfigError(f"heads: d_model {self.d_model} is not divisible by heads {self.heads}")
        if self.positions == "sinusoidal" and self.d_model % 2:
            raise ConfigError(f"d_model: sinusoidal positions need an even d_model, got {self.d_model}")
        if self.share_vocab and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError(
                f"share_vocab: true needs src_vocab_size == tgt_vocab_size, got {self.src_vocab_size} "
                f"and {self.tgt_vocab_size}"
            )
        for name in ("pad_id", "bos_id", "eos_id", "unk_id"):
            value = getattr(self, name)
            if not 0 <= value < min(self.src_vocab_size, self.tgt_vocab_size):
                raise ConfigError(f"{name}: {value} is outside the vocabulary")
        for i, value in enumerate(self.suppress_ids):
            if not 0 <= value < self.tgt_vocab_size or value == self.eos_id:
                raise ConfigError(f"suppress_ids[{i}]: {value} is not a target id other than eos")

    @property
    def d_k(self) -> int:
        """Per-head key/value width, d_model / h."""
        return self.d_model // self.heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """One of :data:`MODEL_PRESETS` with ``overrides`` applied."""
        if name not in MODEL_PRESETS:
            raise ConfigError(_preset_error(name))
        return cls.from_dict({**MODEL_PRESETS[name], **overrides})


def _preset_error(name: Any) -> str:
    """The message for a model preset name that is not one."""
    return f"unknown model preset {name!r}{_closest(name, MODEL_PRESETS)} (valid presets: {', '.join(MODEL_PRESETS)})"


#: Named model shapes. ``base`` and ``big`` are Table 3 of the paper; ``small`` and ``tiny`` fit a 2-core CPU
#: (``tiny`` is the configuration of the best published text-only Multi30k result); ``test`` is for unit tests.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(encoder_layers=6, decoder_layers=6, d_model=512, d_ff=2048, heads=8, dropout=0.1),
    "big": dict(encoder_layers=6, decoder_layers=6, d_model=1024, d_ff=4096, heads=16, dropout=0.3),
    "small": dict(encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, heads=4, dropout=0.1),
    "tiny": dict(encoder_layers=4, decoder_layers=4, d_model=128, d_ff=256, heads=4, dropout=0.3),
    "test": dict(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.1),
}


# ----------------------------------------------------------------------------------------------------------------------
# data, training, decoding


@dataclass
class DataConfig(_Section):
    """Raw parallel text and how ``transduce prepare`` turns it into a vocabulary and a binarised corpus.

    A corpus (``train``, ``valid``, each ``test`` entry) is one of (see :mod:`transduce.data.corpus`):

    - a path prefix: ``train: data/multi30k/train`` with ``src_lang: en`` reads ``data/multi30k/train.en`` or
      ``train.en.gz`` beside the target file ``train.de[.gz]``;
    - two files: ``train: [corpus/source.txt, corpus/target.txt]``;
    - a TSV file (``source<TAB>target`` per line): ``train: corpus/train.tsv`` (or ``.tsv.gz``);
    - a JSON Lines file: ``train: corpus/train.jsonl`` (or ``.jsonl.gz``), the sides in ``src_field``/``tgt_field``.
    """

    src_lang: str = "en"  # source language suffix of a prefix's files (and the language of a run's outputs)
    tgt_lang: str = "de"  # target language suffix of a prefix's files
    train: str | list[str] = ""  # the training corpus: a path prefix, [source file, target file], a .tsv or .jsonl
    valid: str | list[str] = ""  # the validation corpus, in the same forms (optional)
    test: list[str | list[str]] = field(default_factory=list)  # test corpora, in the same forms; never filtered
    src_field: str = "src"  # JSON Lines: the field of the source sentence (a.b reaches into nested objects)
    tgt_field: str = "tgt"  # JSON Lines: the field of the target sentence
    # several target languages (one model, a target-language token such as >>fra<< before every source; ISO 639-1 or
    # 639-3 codes, transduce.text.langs): a prefix reads PREFIX.{src_lang} against PREFIX.{each}; two files take the
    # language of the target file's suffix (train.fr); a TSV line names it in a third column
    # (source<TAB>target<TAB>fr) and a JSON Lines line in lang_field. []: one target language, tgt_lang, no token
    tgt_langs: list[str] = field(default_factory=list)
    lang_field: str = "tgt_lang"  # with tgt_langs, JSON Lines: the field of each line's target language
    prepared: str = ""  # directory of the prepared corpus; empty: <run_dir>/data
    vocab_type: str = "bpe"  # SentencePiece model type: bpe (paper) or unigram
    vocab_size: int = 8000  # subword vocabulary size (the paper: ~37k for WMT En-De; Multi30k wants 8-10k)
    joint_vocab: bool = True  # one vocabulary for source and target (needed for three-way weight tying)
    character_coverage: float = 1.0  # SentencePiece character_coverage; rare characters fall back to bytes
    input_sentence_size: int = 2_000_000  # at most this many sentences (a shuffled sample) train the vocabulary
    lowercase: bool = False  # lowercase both sides before everything else (the Multi30k literature's convention)
    # add this share of the training pairs again with the source lowercased (the target as it is), so that a cased
    # model translates input without case information; with decode.input_case=normalize it handles ALL-CAPS and
    # Title-Case input (transduce.text.casing)
    case_augment: float = 0.0
    # BPE-dropout (Provilkov et al., 2020): every epoch the training pairs are segmented anew, each BPE merge skipped
    # at every merge step with this probability (the paper's algorithm, reproducible from train.seed); 0: the
    # prepared segmentation throughout. Translation always segments deterministically (transduce.data.bpe_dropout)
    bpe_dropout: float = 0.0
    max_len: int = 250  # drop training pairs with a side longer than this many subword tokens
    max_len_ratio: float = 9.0  # drop training pairs whose token-length ratio exceeds this (Moses clean-corpus-n)
    dedup: bool = False  # drop exact duplicate training pairs
    skip_invalid_utf8: bool = False  # skip (and count) pairs with bytes that are not UTF-8 instead of failing
    workers: int = 0  # encoding processes; 0: all cores
    # translate: the corpora are parallel text; parse: they are treebanks (.mrg file, directory or archive, with an
    # optional :FIRST-LAST range of file names) turned into (words, linearised tree) pairs (transduce.parsing);
    # classify: labelled texts (transduce.transfer.classify); mlm: raw text for masked-language-model pretraining of the
    # encoder, a NAME.txt[.gz] file or a prefix's src_lang side (transduce.transfer.mlm)
    task: str = "translate"
    tree_leaves: str = "xx"  # parse: each word is XX in the linearised tree (xx) or itself (word)
    tree_closing: str = "labelled"  # parse: closing brackets carry their label, )NP (labelled), or not, ) (bare)
    tree_order: str = "top-down"  # parse: a bracket opens before its first child (top-down) or after it (in-order)
    tree_min_count: int = 1  # parse, word leaves: a word seen fewer times in the training trees is the leaf XX
    # parse: add this many copies of every training tree in which each open-class word (noun, verb, adjective,
    # adverb, number) is, with probability tree_swap, another training word of the same part-of-speech tag, drawn
    # by frequency: the same structures over other words (transduce.parsing.prepare.swap_words)
    tree_swap_copies: int = 0
    tree_swap: float = 0.5
    mix: str = ""  # path prefix of a second (general-domain) raw pair mixed into every training batch
    mix_share: float = 0.0  # share of every training batch's sentences drawn from data.mix (e.g. 0.2)
    # classify: the corpora are .tsv files (label<TAB>text, or label<TAB>text<TAB>text2 with text2_field) or .jsonl
    # files with these fields (transduce.transfer.classify)
    text_field: str = "text"  # classify, JSON Lines: the field of the text (a.b reaches into nested objects)
    text2_field: str = ""  # classify: the field of a second text (sentence pairs: text <sep> text2); "": none
    label_field: str = "label"  # classify, JSON Lines: the field of the label
    # mlm: encode the texts with this vocabulary instead of learning one (vocab_size): a run directory, a checkpoint, a
    # prepared or vocabulary directory (tokenizer.json), or a SentencePiece .model file; a run's is copied file for file
    vocabulary: str = ""

    def __post_init__(self) -> None:
        for where, corpus in [("train", self.train), ("valid", self.valid)] + [
            (f"test[{i}]", t) for i, t in enumerate(self.test)
        ]:
            if not isinstance(corpus, str) and len(corpus) != 2:
                raise ConfigError(f"{where}: two files are [source, target], got {len(corpus)} paths")
        for name in ("src_field", "tgt_field"):
            value = getattr(self, name)
            if "" in value.split("."):
                raise ConfigError(f"{name}: must name a field (a, or a.b for a nested one), got {value!r}")
        _check_choice("task", self.task, ("translate", "parse", "classify", "mlm"))
        for name in ("text_field", "label_field", *(("text2_field",) if self.text2_field else ())):
            if "" in getattr(self, name).split("."):
                raise ConfigError(
                    f"{name}: must name a field (a, or a.b for a nested one), got {getattr(self, name)!r}"
                )
        if self.task in ("classify", "mlm"):
            refused = (
                ("mix", ""),
                ("bpe_dropout", 0.0),
                ("case_augment", 0.0),
                ("dedup", False),
                ("skip_invalid_utf8", False),
            )
            for name, off in refused:
                if getattr(self, name) != off:
                    raise ConfigError(f"{name}: not available for data.task: {self.task}; leave it out")
        if self.vocabulary and self.task != "mlm":
            raise ConfigError(f"vocabulary: for data.task: mlm (a {self.task} run learns its vocabulary, or takes "
                              "train.init_from's); leave it out")  # fmt: skip
        _check_choice("tree_leaves", self.tree_leaves, ("xx", "word"))
        _check_choice("tree_closing", self.tree_closing, ("labelled", "bare"))
        _check_choice("tree_order", self.tree_order, ("top-down", "in-order"))
        _check_positive("tree_min_count", self.tree_min_count)
        _check_positive("tree_swap_copies", self.tree_swap_copies, allow_zero=True)
        if not 0.0 <= self.tree_swap <= 1.0:
            raise ConfigError(f"tree_swap: must be in [0, 1], got {self.tree_swap!r}")
        if self.task == "parse" and self.joint_vocab:
            raise ConfigError("joint_vocab: parsing has a subword source and a closed target vocabulary; set "
                              "joint_vocab: false")  # fmt: skip
        _check_choice("vocab_type", self.vocab_type, ("bpe", "unigram"))
        if not 0.0 <= self.mix_share < 1.0:
            raise ConfigError(f"mix_share: must be in [0, 1), got {self.mix_share!r}")
        if bool(self.mix) != (self.mix_share > 0):
            raise ConfigError("mix_share: data.mix and data.mix_share > 0 go together (got mix "
                              f"{self.mix!r}, mix_share {self.mix_share})")  # fmt: skip
        _check_positive("vocab_size", self.vocab_size)
        _check_positive("max_len", self.max_len)
        _check_positive("max_len_ratio", self.max_len_ratio)
        _check_positive("input_sentence_size", self.input_sentence_size)
        _check_positive("workers", self.workers, allow_zero=True)
        if not 0.0 <= self.case_augment <= 1.0:
            raise ConfigError(f"case_augment: must be in [0, 1], got {self.case_augment!r}")
        if not 0.0 <= self.bpe_dropout < 1.0:
            raise ConfigError(f"bpe_dropout: must be in [0, 1), got {self.bpe_dropout!r}")
        if self.bpe_dropout > 0 and self.vocab_type != "bpe":
            raise ConfigError(f"bpe_dropout: needs vocab_type bpe, got {self.vocab_type!r}")
        if self.bpe_dropout > 0 and self.task == "parse":
            raise ConfigError("bpe_dropout: parsing targets are trees, not subwords; set bpe_dropout: 0")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ConfigError(f"character_coverage: must be in (0, 1], got {self.character_coverage!r}")
        if self.src_lang == self.tgt_lang:
            raise ConfigError(f"tgt_lang: source and target language are both {self.src_lang!r}")
        self._check_tgt_langs()

    def _check_tgt_langs(self) -> None:
        if "" in self.lang_field.split("."):
            raise ConfigError(f"lang_field: must name a field (a, or a.b for a nested one), got {self.lang_field!r}")
        seen: dict[str, str] = {}
        bare_codes = []
        for i, given in enumerate(self.tgt_langs):
            try:
                code = check_code(given, f"tgt_langs[{i}]")  # a token (>>fra<<) names its bare code
            except LanguageError as e:
                raise ConfigError(str(e)) from None
            bare_codes.append(code)
            if canonical(code) in seen:
                raise ConfigError(f"tgt_langs[{i}]: {code!r} names the same language as {seen[canonical(code)]!r}")
            seen[canonical(code)] = code
        self.tgt_langs = bare_codes
        if self.tgt_langs and self.task != "translate":
            raise ConfigError(f"tgt_langs: for data.task: translate, not {self.task}; leave it out")


@dataclass
class TrainConfig(_Section):
    """The training recipe (paper §5). Steps count optimizer updates, not batches."""

    run_dir: str = "runs/default"  # where config, vocabulary, checkpoints and logs go
    seed: int = 1  # seeds model initialisation, dropout and batch order
    max_tokens: int = 4096  # token budget of one batch per side, padding included (the paper: ~25,000)
    accumulate: int = 1  # batches per optimizer update (gradient accumulation)
    max_steps: int = 100_000  # stop after this many updates (the paper's base: 100k)
    max_epochs: int = 0  # stop after this many epochs; 0: no limit
    max_minutes: float = 0.0  # stop (with a checkpoint) after this much wall time; 0: no limit
    # noam: the paper's formula; inverse_sqrt: linear warmup to peak_lr then ~1/sqrt(step); cosine: linear warmup to
    # peak_lr then half a cosine down to min_lr at max_steps (for a fixed budget of updates); constant: peak_lr;
    # auto: noam, or inverse_sqrt when fine-tuning (init_from), whose peak is peak_lr (the resolved name is kept)
    schedule: str = "auto"
    lr_scale: float = 1.0  # multiplier on the noam learning rate
    peak_lr: float = 5e-4  # peak learning rate of the inverse_sqrt, cosine and constant schedules
    min_lr: float = 0.0  # the cosine schedule's learning rate at max_steps
    # cosine: what the decay runs over. steps: from warmup_steps to max_steps. time: the same, but a run that will
    # not reach max_steps inside max_minutes decays over the updates its pace so far fits into max_minutes, so that
    # the rate reaches min_lr when the first of the two limits ends (a wall-time budget on a slower or shared machine)
    decay_by: str = "steps"
    warmup_steps: int = 4000  # warmup_steps (paper: 4000)
    # with decay_by time: what the warmup is counted in. steps: warmup_steps updates wherever the run goes. time:
    # it also ends at the share warmup_steps / max_steps of max_minutes (the first of the two), so that a slower
    # machine keeps the schedule's shape instead of spending its budget warming up
    warmup_by: str = "steps"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    weight_decay: float = 0.0  # decoupled (AdamW) weight decay; 0 is the paper's Adam
    clip_norm: float = 0.0  # clip the gradient norm to this; 0: off
    label_smoothing: float = 0.1  # epsilon_ls (paper: 0.1)
    # auto: bf16 where the device multiplies bf16 in hardware (a CUDA GPU with bf16, a CPU with AVX512-BF16 or AMX),
    # else fp32 (the log says which and why); fp32; or bf16 / fp16 autocast with fp32 master weights (fp16: with
    # loss scaling)
    precision: str = "auto"
    compile: bool = False  # torch.compile the model (dynamic shapes)
    device: str = "auto"  # auto (cuda, else mps, else cpu), cpu, cuda (the local rank's GPU), cuda:N or mps
    dist_timeout_minutes: float = 60.0  # how long ranks wait for each other (rank 0 preparing the data, a collective)
    threads: int = 0  # torch intra-op threads; 0: torch's default
    log_every: int = 100  # updates between log lines
    valid_every: int = 1000  # updates between validations; 0: only at the end
    valid_bleu: bool = True  # decode the validation set and compute sacreBLEU at each validation
    valid_beam: int = 1  # beam size for validation BLEU (1: greedy)
    valid_max_sentences: int = 0  # decode at most this many validation sentences; 0: all
    # bleu (higher is better) or loss (lower is better) picks the best checkpoint; accuracy for a classifier (data.task:
    # classify, where bleu means accuracy) or a masked language model (data.task: mlm, where bleu means loss)
    best_metric: str = "bleu"
    keep_last: int = 5  # keep this many most recent checkpoints (the paper averaged the last 5)
    save_every_minutes: float = 0.0  # also write a checkpoint every M minutes (the paper: 10); 0: off
    patience: int = 0  # stop after this many validations without improvement; 0: off
    max_nonfinite: int = 10  # stop after this many updates in a row with a non-finite loss or gradient
    init_from: str = ""  # pretrained model to start from: run directory, checkpoint or Hugging Face Marian directory
    init_optimizer: bool = False  # keep the Adam moments of init_from's training checkpoint (the step restarts)
    extend_vocab: int = 0  # with init_from: add the pieces a SentencePiece model of this size finds in the data; 0: off
    freeze_embeddings: bool = False  # keep the embeddings (and a tied output projection) fixed
    freeze_encoder: bool = False  # keep the encoder (its embeddings and layers) fixed
    train_last_layers: int = 0  # > 0: train only the last k layers of each stack (+ final norms, untied output)
    # classify or parse with init_from: the pretrained embeddings and encoder learn at this multiple of the schedule's
    # rate (a classifier's head and CoVe task model, a parser's decoder at the rate itself)
    pretrained_lr_scale: float = 0.1
    freeze_layers: int = 0  # classify: keep the embeddings and the lowest N encoder layers fixed

    def __post_init__(self) -> None:
        for name in ("max_tokens", "accumulate", "warmup_steps", "adam_eps", "peak_lr", "lr_scale"):
            _check_positive(name, getattr(self, name))
        for name in (
            "max_steps",
            "max_epochs",
            "max_minutes",
            "min_lr",
            "weight_decay",
            "clip_norm",
            "threads",
            "log_every",
            "valid_every",
            "valid_max_sentences",
            "keep_last",
            "save_every_minutes",
            "patience",
            "extend_vocab",
            "train_last_layers",
            "freeze_layers",
        ):
            _check_positive(name, getattr(self, name), allow_zero=True)
        _check_positive("max_nonfinite", self.max_nonfinite)
        _check_positive("valid_beam", self.valid_beam)
        _check_choice("schedule", self.schedule, ("auto", "noam", "inverse_sqrt", "cosine", "constant"))
        if self.schedule == "auto":  # a fine-tuning config names a peak (peak_lr), as HF and fairseq users write it
            self.schedule = "inverse_sqrt" if self.init_from else "noam"
        if self.schedule == "cosine":
            if self.max_steps <= self.warmup_steps:
                raise ConfigError(f"max_steps: the cosine schedule decays from warmup_steps to max_steps, so max_steps "
                                  f"must exceed warmup_steps ({self.warmup_steps}), got {self.max_steps}")  # fmt: skip
            if self.min_lr > self.peak_lr:
                raise ConfigError(f"min_lr: must not exceed peak_lr ({self.peak_lr}), got {self.min_lr}")
        _check_choice("decay_by", self.decay_by, ("steps", "time"))
        if self.decay_by == "time" and (self.schedule != "cosine" or self.max_minutes <= 0):
            raise ConfigError(f"decay_by: time decays the cosine schedule within train.max_minutes, so it needs "
                              f"schedule: cosine and max_minutes > 0 (got schedule {self.schedule!r}, "
                              f"max_minutes {self.max_minutes:g})")  # fmt: skip
        _check_choice("warmup_by", self.warmup_by, ("steps", "time"))
        if self.warmup_by == "time" and self.decay_by != "time":
            raise ConfigError(f"warmup_by: time scales the warmup with the updates that fit into max_minutes, so it "
                              f"needs decay_by: time (got decay_by {self.decay_by!r})")  # fmt: skip
        if not self.init_from:
            for name in ("init_optimizer", "extend_vocab"):
                if getattr(self, name):
                    raise ConfigError(f"{name}: needs train.init_from (a pretrained model to start from)")
        if self.init_optimizer and self.extend_vocab:
            raise ConfigError("init_optimizer: the optimizer state has no moments for the rows extend_vocab adds")
        _check_choice("precision", self.precision, ("auto", *PRECISIONS))
        try:
            check_device_name(self.device)
        except TransduceError as e:
            raise ConfigError(str(e)) from None
        _check_positive("dist_timeout_minutes", self.dist_timeout_minutes)
        _check_choice("best_metric", self.best_metric, ("bleu", "loss", "accuracy"))
        _check_positive("pretrained_lr_scale", self.pretrained_lr_scale)
        for name in ("adam_beta1", "adam_beta2", "label_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name}: must be in [0, 1), got {getattr(self, name)!r}")


LengthNorm = Literal["gnmt", "length"]  # the forms of the length penalty (transduce.search.common.length_penalty)
LENGTH_NORMS: tuple[str, ...] = get_args(LengthNorm)


@dataclass
class DecodeConfig(_Section):
    """How translations are searched (paper §6.1)."""

    beam: int = 4  # beam size (paper: 4); 1 is greedy
    length_penalty: float = 0.6  # alpha of the length penalty; 0: rank by raw log-probability
    length_norm: str = "gnmt"  # the penalty: "gnmt" ((5 + |Y|) / 6) ** alpha (the paper's) or "length" |Y| ** alpha
    max_len_a: float = 1.0  # maximum output length = max_len_a * source length + max_len_b (paper: + 50)
    max_len_b: int = 50
    min_len: int = 0  # no EOS before this many tokens
    no_repeat_ngram: int = 0  # block repeated n-grams of this size; 0: off
    nbest: int = 1  # hypotheses per sentence of Translator.translate_lines (CLI: --nbest; server: the request's)
    early_stopping: bool = False  # beam search: stop a sentence at `beam` finished hypotheses (fairseq, CTranslate2)
    sampling: bool = False  # sample instead of searching (temperature, top_k, top_p apply)
    temperature: float = 1.0
    top_k: int = 0  # sample from the k most likely tokens; 0: all
    top_p: float = 1.0  # nucleus sampling: the smallest set with this much probability mass
    # sampling: draw each sentence's samples from a generator seeded with this, so that the same seed gives the same
    # samples (whatever batch the sentence is in); None: from torch's global generator
    seed: int | None = None
    max_tokens: int = 4096  # token budget of one translation batch (sentences are sorted by length)
    # keep: translate every line as it is; normalize: lowercase ALL-CAPS and Title-Case lines before translating
    # and give the translation that style back; truecase: the same, with the lowercased line recased to the
    # training sources' usual forms (the table transduce prepare writes; transduce.text.casing)
    input_case: str = "keep"
    # a multilingual model (data.tgt_langs): the target language when a request names none (translate --tgt-lang,
    # Translator.translate(tgt_lang=...), the server's "tgt_lang"); "": a request must name one
    tgt_lang: str = ""

    def __post_init__(self) -> None:
        if self.tgt_lang:
            try:
                self.tgt_lang = check_code(self.tgt_lang, "tgt_lang")
            except LanguageError as e:
                raise ConfigError(str(e)) from None
        for name in ("beam", "nbest", "max_tokens", "temperature"):
            _check_positive(name, getattr(self, name))
        for name in ("length_penalty", "max_len_a", "max_len_b", "min_len", "no_repeat_ngram", "top_k"):
            _check_positive(name, getattr(self, name), allow_zero=True)
        _check_choice("length_norm", self.length_norm, LENGTH_NORMS)
        _check_choice("input_case", self.input_case, INPUT_CASES)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if self.nbest > self.beam and not self.sampling:
            raise ConfigError(f"nbest: {self.nbest} is larger than beam {self.beam}")
        if self.seed is not None and not 0 <= self.seed < 2**64:  # torch.Generator.manual_seed's range
            raise ConfigError(f"seed: must be >= 0, got {self.seed}" if self.seed < 0 else "seed: must be < 2**64")


# ----------------------------------------------------------------------------------------------------------------------
# the whole run


@dataclass
class Config(_Section):
    """Everything a run needs. ``model`` may also be given as ``preset: NAME`` plus overrides in YAML."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self) -> None:
        """The checks that span sections: what a classifier (``data.task: classify``) and a masked language model
        (``data.task: mlm``) take and what only they take."""
        t, m = self.train, self.model
        classify = self.data.task == "classify"
        finetuned = (classify and m.transfer == "finetune") or self.data.task == "parse"
        pretrained_encoder = bool(t.init_from) and finetuned  # (a classifier's or a parser's)
        # a setting that does nothing in this run is a mistake (as optim.ignored_settings says of the schedule's)
        for key, applies, what in (
            ("model.pooling", classify, "data.task: classify"),
            ("model.transfer", classify, "data.task: classify"),
            ("model.cove_layers", classify and m.transfer == "cove", "model.transfer: cove"),
            ("model.cove_task", classify and m.transfer == "cove", "model.transfer: cove"),
            ("train.pretrained_lr_scale", pretrained_encoder,
             "a classifier fine-tuned from, or a parser started from, train.init_from"),
        ):  # fmt: skip
            section, name = key.split(".")
            default = getattr(ModelConfig() if section == "model" else TrainConfig(), name)
            if not applies and getattr(getattr(self, section), name) != default:
                raise ConfigError(f"{key}: has no effect in this run (it is for {what}); leave it out")
        if self.data.task == "mlm":
            self._check_mlm()
            return
        if self.data.task == "parse" and t.init_from:
            for name in ("init_optimizer", "extend_vocab"):
                if getattr(t, name):
                    raise ConfigError(f"train.{name}: not available for a parser started from train.init_from (it "
                                      "takes the pretrained encoder and source vocabulary; its decoder and tree "
                                      "tokens are new)")  # fmt: skip
        if self.data.task != "classify":
            if t.best_metric == "accuracy":
                raise ConfigError("train.best_metric: accuracy is a classifier's or a masked language model's "
                                  "(data.task: classify or mlm); use bleu or loss")  # fmt: skip
            if t.freeze_layers:
                raise ConfigError("train.freeze_layers: for data.task: classify (a translation run has "
                                  "train.train_last_layers)")  # fmt: skip
            return
        if t.best_metric == "bleu":  # the default: a classifier has no BLEU, and accuracy is what it is chosen by
            t.best_metric = "accuracy"
        for name in ("init_optimizer", "extend_vocab", "train_last_layers"):
            if getattr(t, name):
                raise ConfigError(
                    f"train.{name}: not available for data.task: classify"
                    + (" (train.freeze_layers keeps the lowest layers fixed)" if name == "train_last_layers" else "")
                )
        if not t.init_from:
            if m.transfer == "cove":
                raise ConfigError("model.transfer: cove keeps a pretrained encoder fixed, so it needs train.init_from "
                                  "(a translation model)")  # fmt: skip
            if t.freeze_layers or t.freeze_encoder or t.freeze_embeddings:
                raise ConfigError("train.freeze_layers, freeze_encoder and freeze_embeddings keep pretrained layers "
                                  "fixed: they need train.init_from")  # fmt: skip
        elif m.transfer == "cove" and (t.freeze_layers or t.freeze_encoder or t.freeze_embeddings):
            raise ConfigError("train.freeze_layers: model.transfer cove keeps the whole pretrained encoder fixed "
                              "already; leave freeze_layers, freeze_encoder and freeze_embeddings out")  # fmt: skip

    def _check_mlm(self) -> None:
        """A masked language model (``data.task: mlm``) is pretrained from scratch and has no classifier fields."""
        t, m = self.train, self.model
        if t.freeze_layers:
            raise ConfigError("train.freeze_layers: for data.task: classify; leave it out")
        for name in ("init_from", "init_optimizer", "extend_vocab", "freeze_embeddings", "freeze_encoder",
                     "train_last_layers"):  # fmt: skip
            if getattr(t, name):
                raise ConfigError(f"train.{name}: not available for data.task: mlm (a masked language model is "
                                  "pretrained from scratch; data.vocabulary takes a run's vocabulary)")  # fmt: skip
        if m.labels:
            raise ConfigError("model.labels: a classifier's; leave it out for data.task: mlm")
        if t.best_metric == "bleu":  # the default: a masked language model has no BLEU; the lowest masked-LM loss
            t.best_metric = "loss"

    @classmethod
    def from_dict(cls, data: dict, where: str = "") -> Config:
        if data is not None:
            _check_sections(data)
        data = dict(data or {})
        model = data.get("model")
        if isinstance(model, dict) and "preset" in model:
            model = dict(model)
            name = model.pop("preset")
            if name not in MODEL_PRESETS:
                raise ConfigError(f"model.preset: {_preset_error(name)}")
            data["model"] = _from_dict(ModelConfig, {**MODEL_PRESETS[name], **model}, "model.")
        return _from_dict(cls, data)

    @classmethod
    def load(
        cls, path: str | Path, overrides: list[str] | None = None, *, options: dict[str, dict] | None = None
    ) -> Config:
        """Read a YAML file, set the fields of command-line ``options`` (``{"data": {"train": ...}}``) and apply
        dotted ``key=value`` overrides (values are parsed as YAML scalars); see :meth:`resolve`."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except IsADirectoryError:
            raise ConfigError(
                f"{path}: is a directory, not a config file (to continue a training run: transduce train --resume DIR)"
            ) from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start + 1}), so not a YAML config") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the config file: {e.strerror or e}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        try:
            _check_sections(data, "YAML mapping")
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        return cls.resolve(data, overrides or [], source=str(path), options=options)

    @classmethod
    def resolve(
        cls, data: dict, overrides: list[str], *, source: str = "", options: dict[str, dict] | None = None
    ) -> Config:
        """``data`` (read from ``source``: a file name, for messages), then the fields that command-line ``options``
        set (``{"data": {"train": ...}}``), then the dotted ``overrides`` (``train.max_steps=100``), validated.

        Raises:
            ConfigError: the message says where the fault is: ``SOURCE: ...`` when ``data`` is wrong by itself,
                ``command-line options: ...`` when the options make it wrong, ``command-line override 'KEY=VALUE':
                ...`` when an override does.
        """
        with_options = _merge_sections(data, options or {})
        merged = apply_overrides(with_options, overrides)  # a malformed override raises here, naming itself
        try:
            return cls.from_dict(merged)
        except ConfigError as e:
            error = str(e)

        def fails(candidate: dict) -> bool:
            try:
                cls.from_dict(candidate)
            except ConfigError as e:
                return str(e) == error
            return False

        if fails(data):
            raise ConfigError(f"{source}: {error}" if source else error)
        if options and fails(with_options):
            raise ConfigError(f"command-line options: {error}")
        for k, item in enumerate(overrides):  # the first override after which the config fails this way
            if fails(apply_overrides(with_options, overrides[: k + 1])):
                raise ConfigError(f"command-line override {item!r}: {error}")
        raise ConfigError(f"command line: {error}")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml(), encoding="utf-8")


def _merge_sections(data: dict, options: dict[str, dict]) -> dict:
    """A copy of ``data`` with the fields of ``options`` set section by section."""
    data = json.loads(json.dumps(data))
    for section, fields in options.items():
        node = data.setdefault(section, {})
        if isinstance(node, dict):  # else from_dict reports the section's type
            node.update(fields)
    return data


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` strings to a nested mapping (a copy). Values are parsed as YAML scalars."""
    _check_sections(data)
    data = json.loads(json.dumps(data))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"command-line override {item!r}: expected section.key=value")
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"command-line override {item!r}: {part} is not a section")
        node[leaf] = yaml.safe_load(raw) if raw else ""
    return data
