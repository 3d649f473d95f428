"""Encoding and cleaning chunks of raw pairs; runs in worker processes (or in-process with one worker).

A chunk is a few thousand raw line pairs (bytes). The worker decodes them, drops or keeps pairs according to the
split's rules, encodes with the tokenizer and returns flat numpy arrays, which pickle far more cheaply than lists
of lists. Deduplication needs all pairs seen so far, so the worker only returns 8-byte hashes and the parent
decides.
"""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
import signal
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from transduce.text.casing import augment_pair, augmented
from transduce.text.textio import decode_line
from transduce.text.tokenizer import Vocabulary
from transduce.text.vocab import load_vocabulary

#: Reasons a pair is dropped, in the order they are tested. Only training pairs are ever dropped, except that
#: "invalid_utf8" in validation/test sets counts lines whose bad bytes were replaced by U+FFFD (the line is kept).
DROP_REASONS = ("invalid_utf8", "empty", "too_long", "ratio", "duplicate")
UTF8_HINT = "--skip-invalid-utf8 (data.skip_invalid_utf8) skips such pairs"


@dataclass
class EncodeOptions:
    """What the worker needs besides the text; the same for every chunk of a corpus."""

    tokenizer_dir: str
    max_len: int
    max_len_ratio: float
    skip_invalid_utf8: bool
    dedup: bool
    case_augment: float = 0.0  # share of training pairs added again with the source lowercased (transduce.text.casing)
    # several target languages: each language's token id, put before the source ids (transduce.text.langs)
    lang_ids: dict[str, int] = field(default_factory=dict)


@dataclass
class Chunk:
    """Raw pairs of one corpus; ``first_line`` is the 0-based line of ``src[0]`` in its file(s)."""

    train: bool  # clean (drop empty, long, unbalanced pairs); else keep every line
    src_path: str
    tgt_path: str
    first_line: int
    src: list[bytes]
    tgt: list[bytes]
    langs: list[str] = field(default_factory=list)  # several target languages: each pair's (EncodeOptions.lang_ids)
    offset: int = 0  # the lines of the split's corpora before this one: a pair's line in the split is offset + line


@dataclass
class Encoded:
    """The kept pairs of a chunk: 0-based lines, flat ids and lengths per side, hashes if dedup is on."""

    lines: np.ndarray
    src: np.ndarray
    src_lens: np.ndarray
    tgt: np.ndarray
    tgt_lens: np.ndarray
    hashes: np.ndarray | None
    counts: dict[str, int] = field(default_factory=dict)


_state: dict[str, object] = {}  # per process: the options and the loaded tokenizer


def init_worker(options: EncodeOptions) -> None:
    """Pool initializer: load the tokenizer once per process."""
    if multiprocessing.parent_process() is not None:  # a pool worker: Ctrl-C is the parent's to handle
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _state["options"] = options
    _state["tokenizer"] = load_vocabulary(Path(options.tokenizer_dir))


def _decode_all(raws: list[bytes], path: str, first_line: int, lenient: bool) -> list[str | None]:
    """Decode lines at once (one ``decode`` call for the chunk); line by line only when something is not UTF-8."""
    if not raws:
        return []
    try:
        return b"\n".join(raws).decode("utf-8").split("\n")  # lines hold no \n: the split restores them exactly
    except UnicodeDecodeError:
        errors = "skip" if lenient else "strict"
        return [decode_line(raw, path, first_line + k + 1, errors, hint=UTF8_HINT) for k, raw in enumerate(raws)]


def pair_hash(src: bytes, tgt: bytes) -> int:
    """An 8-byte hash of a raw pair (``\\n`` cannot occur inside a line, so it separates the sides safely)."""
    return int.from_bytes(hashlib.blake2b(src + b"\n" + tgt, digest_size=8).digest(), "little", signed=True)


def _flat(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lens.sum()))
    return flat, lens


def encode_chunk(chunk: Chunk) -> Encoded:
    """Decode, clean and encode one chunk (see :data:`DROP_REASONS`)."""
    opts: EncodeOptions = _state["options"]  # type: ignore[assignment]
    tok: Vocabulary = _state["tokenizer"]  # type: ignore[assignment]
    counts = dict.fromkeys(DROP_REASONS, 0)
    src_texts = _decode_all(chunk.src, chunk.src_path, chunk.first_line, opts.skip_invalid_utf8)
    tgt_texts = _decode_all(chunk.tgt, chunk.tgt_path, chunk.first_line, opts.skip_invalid_utf8)
    kept, srcs, tgts, prefixes = [], [], [], []
    for k, (s, t) in enumerate(zip(src_texts, tgt_texts)):
        if s is None or t is None:
            counts["invalid_utf8"] += 1
            if chunk.train:
                continue
            s = chunk.src[k].decode("utf-8", "replace") if s is None else s
            t = chunk.tgt[k].decode("utf-8", "replace") if t is None else t
        elif chunk.train and (not s.strip() or not t.strip()):
            counts["empty"] += 1
            continue
        prefix = [opts.lang_ids[chunk.langs[k]]] if chunk.langs else []  # the target-language token
        kept.append(k)
        srcs.append(s)
        tgts.append(t)
        prefixes.append(prefix)
        if chunk.train and augmented(chunk.offset + chunk.first_line + k, opts.case_augment):
            s_aug, t_aug = augment_pair(s, t)
            if s_aug != s:  # a copy only where lowercasing changes something
                kept.append(k)
                srcs.append(s_aug)
                tgts.append(t_aug)
                prefixes.append(prefix)
    lines = [chunk.offset + chunk.first_line + k for k in kept]
    raws = [(s.encode(), t.encode()) for s, t in zip(srcs, tgts)] if opts.dedup and chunk.train else []
    if chunk.langs:  # (a duplicate is the same pair into the same language)
        raws = [(p[0].to_bytes(4, "little") + s, t) for p, (s, t) in zip(prefixes, raws)]
    prefixed = 1 if chunk.langs else 0
    src, src_lens = _flat([[*p, *ids] for p, ids in zip(prefixes, tok.encode_src_batch(srcs))])
    tgt, tgt_lens = _flat(tok.encode_tgt_batch(tgts))
    line_arr = np.asarray(lines, dtype=np.int64)
    if chunk.train:
        empty = (src_lens == prefixed) | (tgt_lens == 0)  # e.g. only characters that normalisation removes
        too_long = ~empty & ((src_lens > opts.max_len) | (tgt_lens > opts.max_len))
        text_lens = src_lens - prefixed  # the ratio compares the texts: a language token is not part of either
        longer, shorter = np.maximum(text_lens, tgt_lens), np.maximum(np.minimum(text_lens, tgt_lens), 1)
        ratio = ~empty & ~too_long & (longer > opts.max_len_ratio * shorter)
        counts["empty"] += int(empty.sum())
        counts["too_long"] += int(too_long.sum())
        counts["ratio"] += int(ratio.sum())
        keep = ~(empty | too_long | ratio)
        if not keep.all():
            src, tgt = src[np.repeat(keep, src_lens)], tgt[np.repeat(keep, tgt_lens)]
            src_lens, tgt_lens, line_arr = src_lens[keep], tgt_lens[keep], line_arr[keep]
            raws = list(itertools.compress(raws, keep.tolist())) if raws else raws
    hashes = None
    if opts.dedup and chunk.train:
        hashes = np.fromiter((pair_hash(s, t) for s, t in raws), dtype=np.int64, count=len(raws))
    return Encoded(line_arr, src, src_lens, tgt, tgt_lens, hashes, counts)


def drop_duplicates(enc: Encoded, seen: set[int]) -> int:
    """Remove from ``enc`` (in place) the pairs whose hash is in ``seen``, adding the others; returns the count.

    ``seen`` costs about 60-70 bytes per distinct training pair (a Python int in a set): ~2.5 GB for 40M pairs.
    """
    if enc.hashes is None:
        return 0
    keep = np.ones(len(enc.hashes), dtype=bool)
    for i, h in enumerate(enc.hashes.tolist()):
        if h in seen:
            keep[i] = False
        else:
            seen.add(h)
    dropped = int((~keep).sum())
    if dropped:
        enc.src, enc.tgt = enc.src[np.repeat(keep, enc.src_lens)], enc.tgt[np.repeat(keep, enc.tgt_lens)]
        enc.src_lens, enc.tgt_lens, enc.lines = enc.src_lens[keep], enc.tgt_lens[keep], enc.lines[keep]
    return dropped
