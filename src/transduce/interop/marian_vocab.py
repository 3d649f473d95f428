"""A Hugging Face Marian vocabulary as a :class:`transduce.text.tokenizer.Vocabulary`.

Marian models segment text with SentencePiece (``source.spm``, ``target.spm``) and map the pieces to the model's ids
with ``vocab.json`` (one table for both sides) or ``vocab.json`` + ``target_vocab.json`` (separate vocabularies). The
source side is always segmented with ``source.spm`` and the target side with ``target.spm``; ``MarianTokenizer``
(transformers) does both, and :class:`MarianVocab` wraps it. Extension (:meth:`MarianVocab.extended`) appends pieces
to the SentencePiece models and to the id tables, so every existing piece keeps its id.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece

from transduce.errors import InteropError
from transduce.interop import require
from transduce.text.spm_proto import append_pieces
from transduce.text.tokenizer import NewPiece, Vocabulary

_VOCAB_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json")


class MarianVocab(Vocabulary):
    """A Marian vocabulary (``source.spm``/``target.spm`` SentencePiece models and ``vocab.json`` mapping pieces to
    the model's ids, ``target_vocab.json`` too when the vocabularies are separate), read through
    ``transformers.MarianTokenizer``.

    Args:
        directory: holds the files above.
        meta: ``separate_vocabs`` (bool), optionally ``source_lang`` and ``target_lang``.
    """

    lowercase = False

    def __init__(self, directory: str | Path, meta: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.separate = bool(meta.get("separate_vocabs", False))
        self.meta = {
            "kind": "marian",
            "separate_vocabs": self.separate,
            "source_lang": meta.get("source_lang"),
            "target_lang": meta.get("target_lang"),
        }
        needed = [*_VOCAB_FILES[:3], *_VOCAB_FILES[3:] * self.separate]
        missing = [name for name in needed if not (self.directory / name).is_file()]
        if missing:
            raise InteropError(f"{self.directory}: Marian vocabulary files missing: {', '.join(missing)}")
        self._tok = marian_tokenizer(
            self.directory, separate=self.separate, src_lang=self.meta["source_lang"], tgt_lang=self.meta["target_lang"]
        )
        self._lock = threading.Lock()  # MarianTokenizer switches between source and target mode in place
        self._src = {i: p for p, i in self._tok.encoder.items()}
        self._tgt = dict(self._tok.decoder)
        self.joint = not self.separate
        self.eos_id = self._tok.eos_token_id
        self._skip = {self._tok.pad_token_id}

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> MarianVocab:
        """The vocabulary of a Hugging Face Marian model directory (``tokenizer_config.json`` says whether the
        vocabularies are separate)."""
        directory = Path(directory)
        meta: dict[str, Any] = {}
        config_file = directory / "tokenizer_config.json"
        if config_file.is_file():
            meta = json.loads(config_file.read_text(encoding="utf-8"))
        return cls(directory, meta)

    def save(self, directory: str | Path) -> Path:
        """Copy the vocabulary files into ``directory`` with our ``tokenizer.json`` saying what they are."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in _VOCAB_FILES:
            if (self.directory / name).is_file() and (name != "target_vocab.json" or self.separate):
                shutil.copyfile(self.directory / name, directory / name)
        (directory / "tokenizer.json").write_text(json.dumps(self.meta, indent=2) + "\n", encoding="utf-8")
        return directory

    @property
    def unk_id(self) -> int:
        return self._tok.unk_token_id

    @property
    def src_vocab_size(self) -> int:
        return len(self._src)

    @property
    def tgt_vocab_size(self) -> int:
        return len(self._tgt)

    def normalise(self, text: str) -> str:
        return text

    def encode_src_batch(self, texts: Sequence[str]) -> list[list[int]]:
        with self._lock:
            return [list(ids) for ids in self._tok(list(texts), add_special_tokens=False)["input_ids"]]

    def encode_tgt_batch(self, texts: Sequence[str]) -> list[list[int]]:
        with self._lock:  # text_target: segmented with target.spm, mapped through the target table
            return [list(ids) for ids in self._tok(text_target=list(texts), add_special_tokens=False)["input_ids"]]

    def decode_tgt(self, ids: Iterable[int]) -> str:
        kept = []
        for i in map(int, ids):
            if i == self.eos_id:
                break
            if i not in self._skip:
                kept.append(i)
        with self._lock:
            return self._tok.decode(kept, skip_special_tokens=True)

    def src_pieces(self, ids: Iterable[int]) -> list[str]:
        return [self._src.get(int(i), self._tok.unk_token) for i in ids]

    def tgt_pieces(self, ids: Iterable[int]) -> list[str]:
        return [self._tgt.get(int(i), self._tok.unk_token) for i in ids]

    def pieces_in_id_order(self, side: str) -> list[str]:
        """Every piece of the ``"src"`` or ``"tgt"`` vocabulary, indexed by id."""
        table = self._src if side == "src" else self._tgt
        return [table[i] for i in range(len(table))]

    def sentencepiece_protos(self) -> tuple[bytes, bytes]:
        return (self.directory / "source.spm").read_bytes(), (self.directory / "target.spm").read_bytes()

    def extended(self, directory: str | Path, src_new: Sequence[NewPiece], tgt_new: Sequence[NewPiece]) -> Path:
        """Append pieces: ``src_new`` to source.spm, ``tgt_new`` to target.spm (``src_new`` to both for a joint
        vocabulary), and to the id tables after their last id (``vocab.json`` takes both sides' pieces when it is
        shared). Marian's pad stays where it was (the last id before extension)."""
        directory = self.save(directory)
        if self.joint:
            tgt_new = src_new
        for name, new in (("source.spm", src_new), ("target.spm", tgt_new)):
            proto = (directory / name).read_bytes()
            proc = sentencepiece.SentencePieceProcessor(model_proto=proto)
            has = {proc.id_to_piece(i) for i in range(proc.get_piece_size())}
            (directory / name).write_bytes(append_pieces(proto, [(p, s) for p, s in new if p not in has]))
        tables = [("vocab.json", [*src_new, *tgt_new])] if self.joint else [
            ("vocab.json", src_new), ("target_vocab.json", tgt_new)]  # fmt: skip
        for name, new in tables:
            table = json.loads((directory / name).read_text(encoding="utf-8"))
            for piece, _ in new:
                table.setdefault(piece, len(table))
            (directory / name).write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
        return directory

    def __repr__(self) -> str:
        return f"MarianVocab({self.directory}, separate={self.separate})"


def _vocab_json(pieces: list[str], where: str) -> dict[str, int]:
    vocab = {}
    for i, piece in enumerate(pieces):
        if piece in vocab:
            raise InteropError(f"{where}: piece {piece!r} appears twice (ids {vocab[piece]} and {i})")
        vocab[piece] = i
    return vocab


def marian_tokenizer(directory: Path, *, separate: bool, src_lang: str | None, tgt_lang: str | None):
    """``transformers.MarianTokenizer`` over the Marian vocabulary files in ``directory``."""
    transformers = require("transformers")
    return transformers.MarianTokenizer(
        source_spm=str(directory / "source.spm"),
        target_spm=str(directory / "target.spm"),
        vocab=str(directory / "vocab.json"),
        target_vocab_file=str(directory / "target_vocab.json") if separate else None,
        separate_vocabs=separate,
        source_lang=src_lang,
        target_lang=tgt_lang,
    )


def write_marian_vocab(tokenizer, directory: Path, *, src_lang: str | None, tgt_lang: str | None) -> None:
    """The files ``MarianTokenizer`` reads for our tokenizer (or copies of an imported Marian vocabulary), written
    into ``directory`` by ``MarianTokenizer.save_pretrained``."""
    langs = dict(src_lang=src_lang, tgt_lang=tgt_lang)
    if isinstance(tokenizer, MarianVocab):
        tok = marian_tokenizer(tokenizer.directory, separate=tokenizer.separate, **langs)
        tok.save_pretrained(str(directory))
        return
    staging = Path(tempfile.mkdtemp(prefix="marian-vocab-"))
    try:
        src_proto, tgt_proto = tokenizer.sentencepiece_protos()
        (staging / "source.spm").write_bytes(src_proto)
        (staging / "target.spm").write_bytes(tgt_proto)
        sides = [("vocab.json", tokenizer.src_pieces, tokenizer.src_vocab_size, "source vocabulary")]
        if not tokenizer.joint:
            sides.append(("target_vocab.json", tokenizer.tgt_pieces, tokenizer.tgt_vocab_size, "target vocabulary"))
        for name, pieces, size, what in sides:
            vocab = _vocab_json(pieces(range(size)), what)
            (staging / name).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        marian_tokenizer(staging, separate=not tokenizer.joint, **langs).save_pretrained(str(directory))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
