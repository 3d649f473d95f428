"""Subword vocabularies: SentencePiece training and use, joint or separate for source and target.

The models reserve exactly the ids of :mod:`transduce.text.special` (pad 0, bos 1, eos 2, unk 3) and use byte fallback,
so any character (emoji, rare scripts) becomes byte pieces rather than ``<unk>``. Encoded ids never contain
bos/eos: the consumer (:func:`transduce.data.collate`, the translator) adds them.

Files written into a prepared directory:

- ``spm.model`` / ``spm.vocab``: the joint model, or ``spm.src.model`` + ``spm.tgt.model`` (and ``.vocab``) when
  source and target have their own vocabularies;
- ``tokenizer.json``: which files, joint or not, lowercasing, the special ids. :meth:`Tokenizer.load` reads it
  and reapplies the same text normalisation at translation time.

    tok = Tokenizer.load("data/multi30k.en-de")
    ids = tok.encode_src("A man on a bike.")   # [412, 35, ...] without bos/eos
    tok.decode_tgt([*ids, EOS_ID, PAD_ID])   # stops at eos
"""

from __future__ import annotations

import abc
import json
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from transduce.errors import DataError
from transduce.text.casing import Truecaser
from transduce.text.special import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, SPECIAL_IDS, UNK, UNK_ID

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
JOINT_MODEL = "spm.model"
SRC_MODEL, TGT_MODEL = "spm.src.model", "spm.tgt.model"
_SKIP_ON_DECODE = frozenset({PAD_ID, BOS_ID})  # dropped wherever they appear; EOS ends the sentence


class Vocabulary(abc.ABC):
    """What training, translation and export need of a vocabulary: text to ids and back on each side.

    Two implementations: :class:`Tokenizer` (ours: SentencePiece ids are the model's ids) and
    ``transduce.interop.marian_vocab.MarianVocab`` (a Hugging Face Marian vocabulary: SentencePiece segments,
    ``vocab.json`` maps the pieces to the model's ids). :func:`transduce.text.vocab.load_vocabulary` loads either from a
    directory by its ``tokenizer.json``.
    """

    joint: bool  # one vocabulary for both sides
    lowercase: bool  # text is lowercased before encoding

    @property
    @abc.abstractmethod
    def src_vocab_size(self) -> int:
        """Number of source ids, special ids included."""

    @property
    @abc.abstractmethod
    def tgt_vocab_size(self) -> int:
        """Number of target ids, special ids included."""

    @abc.abstractmethod
    def normalise(self, text: str) -> str:
        """The normalisation applied to text before encoding (lowercasing when set)."""

    @abc.abstractmethod
    def encode_src_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Source sentences -> ids, without bos/eos."""

    @abc.abstractmethod
    def encode_tgt_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Target sentences -> ids, without bos/eos."""

    @abc.abstractmethod
    def decode_tgt(self, ids: Iterable[int]) -> str:
        """Target ids -> text; stops at the first eos, skips padding and bos."""

    @abc.abstractmethod
    def src_pieces(self, ids: Iterable[int]) -> list[str]:
        """The source piece of every id."""

    @abc.abstractmethod
    def tgt_pieces(self, ids: Iterable[int]) -> list[str]:
        """The target piece of every id."""

    @abc.abstractmethod
    def sentencepiece_protos(self) -> tuple[bytes, bytes]:
        """The serialised SentencePiece models that segment the source and the target text."""

    @abc.abstractmethod
    def save(self, directory: str | Path) -> Path:
        """Write the vocabulary files (with ``tokenizer.json``) into ``directory``; returns it."""

    @abc.abstractmethod
    def extended(self, directory: str | Path, src_new: Sequence[NewPiece], tgt_new: Sequence[NewPiece]) -> Path:
        """Write into ``directory`` this vocabulary with pieces appended: every existing piece keeps its id, the new
        ones get the next ids in order (see :mod:`transduce.text.vocab`). A joint vocabulary takes ``src_new`` only."""

    def encode_src(self, text: str) -> list[int]:
        """Source text -> ids, without bos/eos."""
        return self.encode_src_batch([text])[0]

    def encode_tgt(self, text: str) -> list[int]:
        """Target text -> ids, without bos/eos."""
        return self.encode_tgt_batch([text])[0]

    def pieces_in_id_order(self, side: str) -> list[str]:
        """Every piece of the ``"src"`` or ``"tgt"`` vocabulary, indexed by id."""
        if side == "src":
            return self.src_pieces(range(self.src_vocab_size))
        return self.tgt_pieces(range(self.tgt_vocab_size))

    def lang_tokens(self) -> dict[str, int]:
        """The target-language tokens (``>>fra<<``, :mod:`transduce.text.langs`) of the source side: token -> id."""
        from transduce.text.langs import TOKEN

        return {p: i for i, p in enumerate(self.pieces_in_id_order("src")) if TOKEN.fullmatch(p)}

    def lang_token_tgt_ids(self) -> list[int]:
        """The target ids of target-language tokens (a joint vocabulary has them on both sides): never generated."""
        from transduce.text.langs import TOKEN

        return [i for i, p in enumerate(self.pieces_in_id_order("tgt")) if TOKEN.fullmatch(p)]

    def with_lang_tokens(self, directory: str | Path, tokens: Sequence[str]) -> Path:
        """Write into ``directory`` this vocabulary with the target-language ``tokens`` it lacks appended to the
        source side (to the one model of a joint vocabulary): every existing piece keeps its id."""
        held = self.lang_tokens()
        return self.extended(directory, [(t, 0.0) for t in dict.fromkeys(tokens) if t not in held], [])


#: A piece to add to a SentencePiece model: its text (``▁`` for a space) and its score.
NewPiece = tuple[str, float]


class Tokenizer(Vocabulary):
    """Source and target SentencePiece models (one shared model when ``joint``) plus text normalisation.

    Build one with :meth:`train` or :meth:`load`; the constructor takes already loaded processors.
    """

    def __init__(
        self,
        src: spm.SentencePieceProcessor,
        tgt: spm.SentencePieceProcessor | None = None,
        *,
        lowercase: bool,
        truecaser: Truecaser | None = None,
        tree_order: str = "top-down",
    ) -> None:
        self._src = src
        self._tgt = tgt if tgt is not None else src
        self.joint = tgt is None or tgt is src
        self.lowercase = lowercase
        self.truecaser = truecaser  # the source side's (transduce.text.casing; decode.input_case=truecase)
        self.tree_order = tree_order  # a parsing model's linearisation (transduce.parsing.linearize)
        for side, proc in (("source", self._src), ("target", self._tgt)):
            _check_special_ids(proc, side)

    # ------------------------------------------------------------------------------------------------------------------
    # building

    @classmethod
    def train(
        cls,
        directory: str | Path,
        src_sentences: Iterable[str],
        tgt_sentences: Iterable[str] | None = None,
        *,
        vocab_size: int,
        vocab_type: str = "bpe",
        lowercase: bool = False,
        character_coverage: float = 1.0,
        threads: int = 1,
    ) -> Tokenizer:
        """Train SentencePiece model(s) and write them with ``tokenizer.json`` into ``directory``.

        Args:
            directory: where the model files go (created if needed).
            src_sentences: training text for the joint model (both sides already interleaved) or, when
                ``tgt_sentences`` is given, for the source model. Raw text: lowercasing is applied here.
                Pass a sample: SentencePiece keeps what it is given in memory.
            tgt_sentences: training text for a separate target model; ``None`` trains one joint model.
            vocab_size: pieces per model, special ids and the 256 byte pieces included.
            vocab_type: ``"bpe"`` or ``"unigram"``.
            lowercase: lowercase all text before training and before every encode.
            character_coverage: SentencePiece ``character_coverage``; uncovered characters become bytes.
            threads: SentencePiece training threads.

        Returns:
            The trained tokenizer.

        Raises:
            DataError: the vocabulary size does not suit the data (too small for the characters, or more
                pieces than the data can make), or there is no text.
        """
        if vocab_type not in ("bpe", "unigram"):
            raise DataError(f"vocab_type: {vocab_type!r} is not one of 'bpe', 'unigram'")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        norm = _normaliser(lowercase)
        options = dict(vocab_size=vocab_size, vocab_type=vocab_type, coverage=character_coverage, threads=threads)
        if tgt_sentences is None:
            files = {"src": JOINT_MODEL, "tgt": JOINT_MODEL}
            _train_one(directory / JOINT_MODEL, map(norm, src_sentences), "joint", **options)
        else:
            files = {"src": SRC_MODEL, "tgt": TGT_MODEL}
            _train_one(directory / SRC_MODEL, map(norm, src_sentences), "source", **options)
            _train_one(directory / TGT_MODEL, map(norm, tgt_sentences), "target", **options)
        meta = {
            "joint": tgt_sentences is None,
            "lowercase": lowercase,
            "vocab_type": vocab_type,
            "files": files,
            "special_ids": dict(SPECIAL_IDS),
        }
        tok = cls.load_files(directory, meta)
        meta.update(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size)
        (directory / TOKENIZER_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return tok

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Load the tokenizer that :meth:`train` (or ``transduce prepare``) wrote into ``directory``
        (:func:`transduce.text.vocab.load_vocabulary` also loads an imported Marian vocabulary).

        Raises:
            DataError: files are missing or the special ids differ from :mod:`transduce.text.special`.
        """
        directory = Path(directory)
        try:
            meta = json.loads((directory / TOKENIZER_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"{directory / TOKENIZER_FILE}: file not found (not a prepared directory?)") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{directory / TOKENIZER_FILE}: not valid JSON ({e})") from None
        if meta.get("kind", "sentencepiece") != "sentencepiece":
            raise DataError(
                f"{directory / TOKENIZER_FILE}: a {meta['kind']} vocabulary, not ours (load it with "
                "transduce.text.vocab.load_vocabulary)"
            )
        if meta.get("special_ids") != SPECIAL_IDS:
            raise DataError(
                f"{directory / TOKENIZER_FILE}: special ids {meta.get('special_ids')} differ from this version's "
                f"{SPECIAL_IDS}"
            )
        return cls.load_files(directory, meta)

    @classmethod
    def load_files(cls, directory: Path, meta: dict[str, Any]) -> Tokenizer:
        """Load from ``directory`` the model files named in ``meta`` (the content of ``tokenizer.json``)."""
        src = _load_model(directory / meta["files"]["src"])
        tgt = None if meta["joint"] else _load_model(directory / meta["files"]["tgt"])
        return cls(src, tgt, lowercase=bool(meta["lowercase"]), truecaser=Truecaser.load(directory),
                   tree_order=meta.get("tree_order", "top-down"))  # fmt: skip

    # ------------------------------------------------------------------------------------------------------------------
    # use

    @property
    def src_vocab_size(self) -> int:
        """Number of source ids, special ids included."""
        return self._src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        """Number of target ids, special ids included."""
        return self._tgt.get_piece_size()

    def model_protos(self) -> tuple[bytes, bytes]:
        """The serialised SentencePiece models of the source and target side (the same bytes when joint)."""
        return self._src.serialized_model_proto(), self._tgt.serialized_model_proto()

    sentencepiece_protos = model_protos

    def save(self, directory: str | Path) -> Path:
        """Write the model file(s) and ``tokenizer.json`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        src, tgt = self.model_protos()
        files = {"src": JOINT_MODEL, "tgt": JOINT_MODEL} if self.joint else {"src": SRC_MODEL, "tgt": TGT_MODEL}
        (directory / files["src"]).write_bytes(src)
        if not self.joint:
            (directory / files["tgt"]).write_bytes(tgt)
        meta = {
            "joint": self.joint,
            "lowercase": self.lowercase,
            "files": files,
            "special_ids": dict(SPECIAL_IDS),
            "src_vocab_size": self.src_vocab_size,
            "tgt_vocab_size": self.tgt_vocab_size,
        }
        if self.tree_order != "top-down":
            meta["tree_order"] = self.tree_order
        (directory / TOKENIZER_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if self.truecaser is not None:
            self.truecaser.save(directory)
        return directory

    def extended(self, directory: str | Path, src_new: Sequence[NewPiece], tgt_new: Sequence[NewPiece]) -> Path:
        from transduce.text.langs import TOKEN
        from transduce.text.spm_proto import (  # the proto arithmetic, beside its users
            NORMAL,
            USER_DEFINED,
            append_pieces,
        )

        def append(proto: bytes, new: Sequence[NewPiece]) -> bytes:  # a language token: one piece, never split
            for piece, score in new:
                proto = append_pieces(proto, [(piece, score)], USER_DEFINED if TOKEN.fullmatch(piece) else NORMAL)
            return proto

        src, tgt = self.model_protos()
        src_proc = spm.SentencePieceProcessor(model_proto=append(src, src_new))
        tgt_proc = None if self.joint else spm.SentencePieceProcessor(model_proto=append(tgt, tgt_new))
        return Tokenizer(src_proc, tgt_proc, lowercase=self.lowercase, truecaser=self.truecaser,
                         tree_order=self.tree_order).save(directory)  # fmt: skip

    def normalise(self, text: str) -> str:
        """The text normalisation applied before SentencePiece's own (NFKC, whitespace): lowercasing if set."""
        return text.lower() if self.lowercase else text

    def encode_src(self, text: str) -> list[int]:
        """Source text -> ids, without bos/eos."""
        return self._src.encode(self.normalise(text))

    def encode_tgt(self, text: str) -> list[int]:
        """Target text -> ids, without bos/eos."""
        return self._tgt.encode(self.normalise(text))

    def encode_src_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Many source sentences at once (SentencePiece's batched encode is faster than a loop)."""
        return self._src.encode([self.normalise(t) for t in texts])

    def encode_tgt_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Many target sentences at once."""
        return self._tgt.encode([self.normalise(t) for t in texts])

    def decode_src(self, ids: Iterable[int]) -> str:
        """Source ids -> text. Stops at the first eos; pad and bos are ignored; unk shows as ``⁇``."""
        return self._src.decode(_clean_ids(ids))

    def decode_tgt(self, ids: Iterable[int]) -> str:
        """Target ids -> text. Stops at the first eos; pad and bos are ignored; unk shows as ``⁇``."""
        return self._tgt.decode(_clean_ids(ids))

    def src_pieces(self, ids: Iterable[int]) -> list[str]:
        """The source piece of every id (specials included, e.g. ``</s>``), for attention plots."""
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: Iterable[int]) -> list[str]:
        """The target piece of every id (specials included), for attention plots."""
        return [self._tgt.id_to_piece(int(i)) for i in ids]

    def __repr__(self) -> str:
        sizes = f"{self.src_vocab_size}" if self.joint else f"{self.src_vocab_size}/{self.tgt_vocab_size}"
        return f"Tokenizer(joint={self.joint}, vocab={sizes}, lowercase={self.lowercase})"


# ----------------------------------------------------------------------------------------------------------------------
# helpers


def _normaliser(lowercase: bool):
    return str.lower if lowercase else (lambda s: s)


def _clean_ids(ids: Iterable[int]) -> list[int]:
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in _SKIP_ON_DECODE:
            out.append(i)
    return out


def _load_model(path: Path) -> spm.SentencePieceProcessor:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as e:
        raise DataError(f"{path}: not a SentencePiece model ({_first_line(e)})") from None


def _check_special_ids(proc: spm.SentencePieceProcessor, side: str) -> None:
    found = {"pad": proc.pad_id(), "bos": proc.bos_id(), "eos": proc.eos_id(), "unk": proc.unk_id()}
    if found != SPECIAL_IDS:
        raise DataError(f"the {side} SentencePiece model has special ids {found}, expected {SPECIAL_IDS}")


def _train_one(
    path: Path, sentences: Iterable[str], what: str, *, vocab_size: int, vocab_type: str, coverage: float, threads: int
) -> None:
    counter = _Counter(sentences)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(counter),
            model_prefix=str(path.with_suffix("")),
            model_type=vocab_type,
            vocab_size=vocab_size,
            character_coverage=coverage,
            byte_fallback=True,  # unseen characters become byte pieces, never <unk>
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            pad_piece=PAD,
            bos_piece=BOS,
            eos_piece=EOS,
            unk_piece=UNK,
            input_sentence_size=0,  # the caller passes a sample; SentencePiece takes all of it
            num_threads=max(1, threads),
            minloglevel=2,  # SentencePiece's own progress logging is very verbose
        )
    except RuntimeError as e:
        raise DataError(_vocab_error(e, vocab_size, what, counter.n)) from None
    log.info("trained a %s %s vocabulary of %d pieces on %d sentences", what, vocab_type, vocab_size, counter.n)


class _Counter:
    """Iterates over sentences and counts them (SentencePiece's errors do not say how many it saw)."""

    def __init__(self, items: Iterable[str]) -> None:
        self.items, self.n = items, 0

    def __iter__(self):
        for item in self.items:
            self.n += 1
            yield item


def _vocab_error(e: RuntimeError, vocab_size: int, what: str, n: int) -> str:
    msg = str(e)
    if n == 0 or "Not found sentences" in msg or "No valid sentence" in msg:
        return f"cannot train the {what} vocabulary: no text"
    if m := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", msg):
        return (
            f"vocab_size {vocab_size} is too small for the {what} vocabulary: it needs at least {m.group(2)} pieces "
            "(4 special ids, 256 byte pieces and every character of the data); raise vocab_size or lower "
            "character_coverage"
        )
    if m := re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg):
        return (
            f"vocab_size {vocab_size} is too large for the {what} vocabulary: the data ({n} sentences) supports at "
            f"most {m.group(2)} pieces; lower vocab_size"
        )
    return f"SentencePiece could not train the {what} vocabulary (vocab_size {vocab_size}): {_first_line(e)}"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
