"""Loading any vocabulary directory, and extending a vocabulary with the pieces a new corpus needs.

:func:`load_vocabulary` reads ``tokenizer.json`` and returns the :class:`~transduce.text.tokenizer.Vocabulary` it
describes: our :class:`~transduce.text.tokenizer.Tokenizer`, or the Marian vocabulary of a model imported from Hugging
Face (:mod:`transduce.interop.marian_vocab`, which needs the ``interop`` extra).

:func:`new_pieces` finds what a vocabulary lacks for a corpus: it trains a small SentencePiece model of the same type
(BPE or unigram) on the corpus and keeps its pieces that the vocabulary does not have, with scores below every old
piece's for BPE (old merges keep their priority; each new piece is the merge of two pieces of the union, so the
segmentation can reach it) and the new model's log-probabilities for unigram.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from transduce.errors import DataError
from transduce.text.spm_proto import model_type
from transduce.text.tokenizer import TOKENIZER_FILE, NewPiece, Tokenizer, Vocabulary

log = logging.getLogger(__name__)


def load_vocabulary(directory: str | Path) -> Vocabulary:
    """The vocabulary in ``directory`` (a prepared directory, a run's ``vocab/``, a checkpoint's ``vocab/``).

    Raises:
        DataError: ``tokenizer.json`` is missing or unreadable, or names an unknown kind.
    """
    directory = Path(directory)
    try:
        meta = json.loads((directory / TOKENIZER_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return Tokenizer.load(directory)  # which names the problem
    kind = meta.get("kind", "sentencepiece")
    if kind == "marian":
        from transduce.interop.marian_vocab import MarianVocab

        return MarianVocab(directory, meta)
    if kind != "sentencepiece":
        raise DataError(f"{directory / TOKENIZER_FILE}: unknown vocabulary kind {kind!r}")
    return Tokenizer.load(directory)


def new_pieces(
    proto: bytes, known: set[str], sentences: Iterable[str], *, size: int, threads: int = 1
) -> list[NewPiece]:
    """Pieces that a SentencePiece model of ``size`` pieces, trained on ``sentences``, has and ``known`` lacks.

    Args:
        proto: the serialised SentencePiece model being extended (its type and scores are used).
        known: the pieces the vocabulary already has (its id table, which for Marian may differ from the model's).
        sentences: the new corpus's text on this side, normalised as the vocabulary normalises it.
        size: pieces of the auxiliary model (its special and byte pieces are never added).

    Returns:
        ``(piece, score)`` in the auxiliary model's order.
    """
    kind = model_type(proto)
    old = spm.SentencePieceProcessor(model_proto=proto)
    old_pieces = {old.id_to_piece(i) for i in range(old.get_piece_size())}
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(list(sentences)), model_writer=buffer, vocab_size=size,
            model_type=kind if kind in ("bpe", "unigram") else "unigram", character_coverage=1.0,
            hard_vocab_limit=False, num_threads=max(1, threads), minloglevel=2,
        )  # fmt: skip
    except RuntimeError as e:
        message = str(e).splitlines()[0]
        raise DataError(f"cannot train the {size}-piece model for vocabulary extension: {message}") from None
    aux = spm.SentencePieceProcessor(model_proto=buffer.getvalue())
    floor = min((old.get_score(i) for i in range(old.get_piece_size())), default=0.0)
    out: list[NewPiece] = []
    for i in range(aux.get_piece_size()):
        if aux.is_control(i) or aux.is_unknown(i) or aux.is_byte(i) or aux.is_unused(i):
            continue
        piece = aux.id_to_piece(i)
        if piece in known or piece in old_pieces:
            continue
        score = floor - 1.0 - len(out) if kind == "bpe" else aux.get_score(i)
        out.append((piece, score))
    return out


def extend(
    vocab: Vocabulary, directory: str | Path, src_text: Sequence[str], tgt_text: Sequence[str], *, size: int,
    threads: int = 1,
) -> Vocabulary:  # fmt: skip
    """Write into ``directory`` ``vocab`` extended with the pieces the corpus (``src_text``, ``tgt_text``, raw) needs.

    A joint vocabulary is extended once from both sides; separate ones each from their own side. Every old piece
    keeps its id.
    """
    src_proto, tgt_proto = vocab.sentencepiece_protos()
    src_known, tgt_known = set(vocab.pieces_in_id_order("src")), set(vocab.pieces_in_id_order("tgt"))
    norm = vocab.normalise
    if vocab.joint:
        both = [norm(s) for s in (*src_text, *tgt_text)]
        src_new = new_pieces(src_proto, src_known, both, size=size, threads=threads)
        if tgt_proto != src_proto:  # Marian: one id table, two SentencePiece models
            src_new += new_pieces(tgt_proto, src_known | {p for p, _ in src_new}, both, size=size, threads=threads)
        tgt_new = src_new
    else:
        src_new = new_pieces(src_proto, src_known, [norm(s) for s in src_text], size=size, threads=threads)
        tgt_new = new_pieces(tgt_proto, tgt_known, [norm(t) for t in tgt_text], size=size, threads=threads)
    out = vocab.extended(directory, src_new, tgt_new)
    extended = load_vocabulary(out)
    log.info("vocabulary extended: source %d -> %d, target %d -> %d pieces", vocab.src_vocab_size,
             extended.src_vocab_size, vocab.tgt_vocab_size, extended.tgt_vocab_size)  # fmt: skip
    return extended
