"""``transduce prepare``: raw parallel text -> SentencePiece vocabulary + binarised, cleaned corpus.

Two streaming passes over the training pair, in memory bounded by ``input_sentence_size`` (plus the dedup hashes
when ``dedup`` is on), never by the corpus size:

1. **check and sample**: every input is read from end to end, which catches missing files, unequal line counts,
   malformed TSV or JSON Lines lines (:mod:`transduce.data.corpus`) and bytes that are not UTF-8 *before* any work
   is done; a uniform sample of at most ``input_sentence_size`` training sentences is kept for the vocabulary;
2. **encode**: chunks of raw pairs go to ``workers`` processes (bounded in flight, order preserved), which decode,
   clean and encode them; the parent deduplicates and appends the ids to the binary files.

Training pairs are dropped (and counted) when a side is empty, a side is longer than ``max_len`` tokens, the
token-length ratio exceeds ``max_len_ratio``, the pair repeats an earlier one (``dedup``) or has bytes that are
not UTF-8 (``skip_invalid_utf8``). Validation and test sets keep every line.

Everything is written into ``.NAME.tmp-PID-XXXX`` beside the output and renamed into place at the end, so an
interrupted run leaves no partial output. The prepared directory holds:

- ``manifest.json``: inputs (path, size, SHA-256, lines), options, tokenizer, dtype, per-split counts;
- ``tokenizer.json`` and ``spm.model`` (joint) or ``spm.src.model`` + ``spm.tgt.model`` (see
  :mod:`transduce.text.tokenizer`), and for a cased corpus ``truecase.json``, the source words' usual case
  (:class:`transduce.text.casing.Truecaser`);
- per split (``train``, ``valid``, one per test prefix named after its basename): the files of
  :mod:`transduce.data.binary`.
"""

from __future__ import annotations

import collections
import functools
import logging
import multiprocessing
import os
import random
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece

import transduce
from transduce.config import DataConfig
from transduce.data.binary import MIX_SPLIT, SplitWriter, ids_dtype, split_files
from transduce.data.corpus import Corpus, line_language, resolve_corpora, split_entries, split_name
from transduce.data.download import missing_corpus_hint
from transduce.data.encode import (
    DROP_REASONS,
    UTF8_HINT,
    Chunk,
    Encoded,
    EncodeOptions,
    drop_duplicates,
    encode_chunk,
    init_worker,
)
from transduce.data.manifest import FORMAT, VERSION, earlier_preparation, file_record, install_prepared
from transduce.data.output import make_temp_dir, read_json
from transduce.errors import DataError
from transduce.text.casing import Truecaser, augment_pair, augmented
from transduce.text.langs import tokens_for
from transduce.text.special import SPECIAL_IDS
from transduce.text.textio import line_count_error, scan_text
from transduce.text.tokenizer import Tokenizer, Vocabulary
from transduce.text.vocab import load_vocabulary

log = logging.getLogger(__name__)

CHUNK_PAIRS = 8192  # raw pairs per worker task
SAMPLE_SEED = 12345  # the vocabulary sample is a deterministic function of the data
# DataConfig fields that change the prepared output (workers and paths do not)
_OPTION_KEYS = (
    "src_lang",
    "tgt_lang",
    "vocab_type",
    "vocab_size",
    "joint_vocab",
    "character_coverage",
    "input_sentence_size",
    "lowercase",
    "case_augment",
    "max_len",
    "max_len_ratio",
    "dedup",
    "skip_invalid_utf8",
)


def prepare(
    cfg: DataConfig, out_dir: str | Path, *, force: bool = False, vocabulary: str | Path | None = None
) -> dict[str, Any]:
    """Prepare the corpora of ``cfg`` into ``out_dir`` (see the module docstring).

    With ``data.task: parse`` the corpora are treebanks, first turned into text pairs
    (:func:`transduce.parsing.prepare.prepare_treebank`); with ``data.task: classify`` they are labelled texts
    (:func:`transduce.transfer.classify.data.prepare_classification`); with ``data.task: mlm`` raw texts for masked-LM
    pretraining (:func:`transduce.transfer.mlm.data.prepare_mlm`, whose vocabulary is learned or ``data.vocabulary``).

    Args:
        cfg: the data section of the configuration (``train`` is required).
        out_dir: the prepared directory to create.
        force: rebuild even when ``out_dir`` already holds this preparation, and replace a different one.
        vocabulary: a vocabulary directory (a pretrained model's, see :func:`transduce.text.vocab.load_vocabulary`) to
            encode with instead of training one: its ids are kept, the source side is encoded with its source
            model and the target side with its target model. The vocabulary options of ``cfg`` are then unused.
            With ``data.task: parse`` only its source model is taken (the target is always the trees' tokens).

    Returns:
        The manifest (also written to ``out_dir/manifest.json``).

    Raises:
        DataError: bad input (missing files, unequal line counts, invalid UTF-8, an empty corpus, an unusable
            vocabulary size) or an ``out_dir`` that cannot be replaced safely.
    """
    if cfg.task == "parse":
        from transduce.parsing.prepare import prepare_treebank

        return prepare_treebank(cfg, out_dir, force=force,
                                prepare_text=functools.partial(_prepare_text, vocabulary=vocabulary))  # fmt: skip
    if cfg.task == "classify":
        from transduce.transfer.classify.data import prepare_classification

        return prepare_classification(cfg, out_dir, force=force, vocabulary=vocabulary)
    if cfg.task == "mlm":
        from transduce.transfer.mlm.data import prepare_mlm

        return prepare_mlm(cfg, out_dir, force=force)
    return _prepare_text(cfg, out_dir, force=force, vocabulary=vocabulary)


def _prepare_text(
    cfg: DataConfig, out_dir: str | Path, *, force: bool = False, vocabulary: str | Path | None = None
) -> dict[str, Any]:
    started = time.perf_counter()
    out_dir = Path(out_dir)
    corpora = _corpora(cfg)
    options = {key: getattr(cfg, key) for key in _OPTION_KEYS}
    if cfg.tgt_langs:  # (only then, so that earlier preparations of one target language are still reused)
        options.update(tgt_langs=list(cfg.tgt_langs), lang_field=cfg.lang_field)
    if cfg.task != "translate":  # (only then, so that earlier translation preparations are still reused)
        options.update(task=cfg.task, tree_leaves=cfg.tree_leaves, tree_closing=cfg.tree_closing)
        if cfg.tree_min_count != 1:
            options.update(tree_min_count=cfg.tree_min_count)
        if cfg.tree_order != "top-down":
            options.update(tree_order=cfg.tree_order)
    if vocabulary is not None:
        from transduce.training.checkpoint import vocab_sha256

        options["vocabulary"] = vocab_sha256(vocabulary)
    inputs = {split: _describe(corpus) for split, corpus in corpora.items()}
    existing = earlier_preparation(out_dir, options, inputs, force=force)
    if existing is not None:
        return existing
    tmp = make_temp_dir(out_dir)
    try:
        manifest = _prepare_into(tmp, cfg, corpora, inputs, options, vocabulary)
        install_prepared(tmp, out_dir, manifest, started)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("prepared %s in %.1f s", out_dir, manifest["seconds"])
    return manifest


# ----------------------------------------------------------------------------------------------------------------------
# the work


def _prepare_into(
    tmp: Path, cfg: DataConfig, corpora: dict[str, list[Corpus]], inputs: dict, options: dict,
    vocabulary: str | Path | None,
) -> dict[str, Any]:  # fmt: skip
    lines: dict[str, int] = {}
    for split, parts in corpora.items():  # every input is checked before any real work
        records = inputs[split].get("parts", [inputs[split]])
        for part, record in zip(parts, records):
            record["src"]["lines"] = record["tgt"]["lines"] = _check(part, cfg.skip_invalid_utf8, cfg.tgt_langs)
        lines[split] = sum(record["src"]["lines"] for record in records)
    workers = cfg.workers or os.cpu_count() or 1
    if vocabulary is not None and cfg.task != "parse":
        from transduce.training.checkpoint import copy_vocab

        copy_vocab(vocabulary, tmp)  # the very files: the run's vocabulary identity is the pretrained one's
        tok = load_vocabulary(tmp)
        log.info("encoding with the vocabulary of %s (%s)", vocabulary, tok)
    else:  # (a parser's tree tokens always come from its treebank; a pretrained vocabulary gives its source side)
        tok = _train_vocabulary(tmp, cfg, corpora["train"], lines["train"], workers, vocabulary)
    lang_ids = _language_tokens(tmp, tok, cfg, given=vocabulary is not None and cfg.task != "parse")
    if lang_ids:
        tok = load_vocabulary(tmp)
    dtype = ids_dtype(max(tok.src_vocab_size, tok.tgt_vocab_size))
    enc_opts = EncodeOptions(
        str(tmp), cfg.max_len, cfg.max_len_ratio, cfg.skip_invalid_utf8, cfg.dedup, cfg.case_augment, lang_ids
    )

    splits: dict[str, Any] = {}
    with _Encoder(enc_opts, workers) as encoder:
        for split, parts in corpora.items():
            writer = SplitWriter(tmp, split, dtype)
            chunks = _chunks(split, parts, cfg.tgt_langs)
            counts = _encode_split(encoder, writer, split, chunks, dedup=cfg.dedup and _kind(split) == "train")
            info = writer.close()
            splits[split] = {
                **info,
                "kind": _kind(split),
                "read": lines[split],
                "counts": counts,
                "files": split_files(split),
            }
            _log_counts(split, splits[split], cfg)
    if splits["train"]["pairs"] == 0:
        raise DataError(f"{_names(corpora['train'])}: no sentence pairs left after cleaning "
                        f"({_dropped(splits['train']['counts'])})")  # fmt: skip
    if vocabulary is None:
        _check_vocabulary_use(tmp, tok, cfg, dtype, splits["train"]["pairs"])
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "transduce_version": transduce.__version__,
        "sentencepiece_version": sentencepiece.__version__,
        "options": options,
        "inputs": inputs,
        "special_ids": dict(SPECIAL_IDS),
        "tokenizer": read_json(tmp / "tokenizer.json"),
        "dtype": dtype.name,
        "splits": splits,
    }


def _names(parts: list[Corpus]) -> str:
    return " + ".join(map(str, parts))


def _language_tokens(tmp: Path, tok: Vocabulary, cfg: DataConfig, *, given: bool) -> dict[str, int]:
    """With ``data.tgt_langs``: the token id of each language, the tokens the vocabulary in ``tmp`` lacks added to
    it (a pretrained vocabulary, ``given``, already has them: :func:`transduce.training.finetune.vocabulary` adds
    them)."""
    if not cfg.tgt_langs:
        return {}
    tokens = tokens_for(cfg.tgt_langs, tok.lang_tokens())
    missing = [t for t in tokens if t not in tok.lang_tokens()]
    if missing and given:
        raise DataError(f"the pretrained vocabulary has no token for {', '.join(missing)} (data.tgt_langs); "
                        "train adds them when it starts from train.init_from")  # fmt: skip
    if missing:
        tok.with_lang_tokens(tmp, tokens)
        log.info("target-language tokens added to the vocabulary: %s", ", ".join(missing))
    held = load_vocabulary(tmp).lang_tokens()
    return {lang: held[token] for lang, token in zip(cfg.tgt_langs, tokens)}


def _check(corpus: Corpus, skip_invalid: bool, tgt_langs: list[str] | tuple[str, ...] = ()) -> int:
    """Pass 1: the files are UTF-8 (unless ``skip_invalid``) and the corpus is well formed (two files of equal
    line counts; every TSV line with one tab, two with a language column; every JSON Lines line an object with the
    fields; every line's language one of ``tgt_langs``); returns the count of pairs."""
    counts = []
    for path in (corpus.src,) if corpus.single_file else (corpus.src, corpus.tgt):
        scan = scan_text(path)
        if scan.invalid and not skip_invalid:
            raise DataError(f"{scan.first_invalid}; {UTF8_HINT}")
        counts.append(scan.lines)
    if corpus.single_file:
        for lineno, _, _, lang in corpus.entries():  # raises at the first malformed line, naming it
            if corpus.lang_field:
                line_language(lang, tgt_langs, f"{corpus.src}, line {lineno}")
        return counts[0]
    if counts[0] != counts[1]:
        raise DataError(line_count_error(corpus.src, counts[0], corpus.tgt, counts[1]))
    return counts[0]


def _train_vocabulary(tmp: Path, cfg: DataConfig, parts: list[Corpus], lines: int, workers: int,
                      source: str | Path | None = None) -> Tokenizer:  # fmt: skip
    """Train the tokenizer on a uniform sample of at most ``input_sentence_size`` training sentences (parsing with a
    ``source`` vocabulary directory: the target vocabulary alone, the source model being ``source``'s).

    The sampled line numbers are drawn first (the line count is known), then one lockstep pass picks them out:
    memory is bounded by the sample, and only the sampled lines are decoded.
    """
    k = -(-cfg.input_sentence_size // 2) if cfg.joint_vocab else cfg.input_sentence_size  # pairs
    rng = random.Random(SAMPLE_SEED)
    wanted = iter(sorted(rng.sample(range(lines), k)) if lines > k else range(lines))
    sample: list[tuple[str, str]] = []
    sources: list[str] = []  # the sampled source sentences, without the case-augmented copies (for the truecaser)
    next_line = next(wanted, None)
    for lineno, s_raw, t_raw, _ in split_entries(parts):
        if lineno - 1 != next_line:
            continue
        next_line = next(wanted, None)
        try:
            s, t = s_raw.decode("utf-8"), t_raw.decode("utf-8")
        except UnicodeDecodeError:
            continue  # skip_invalid_utf8 (else _check has failed)
        if s.strip() and t.strip():
            sample.append((s, t))
            sources.append(s)
            if augmented(lineno - 1, cfg.case_augment):  # the vocabulary also sees the augmented copies
                sample.append(augment_pair(s, t))
        if next_line is None:
            break
    if not sample:
        where = f"{lines} lines" if lines <= k else f"none in a sample of {k} of {lines} lines"
        raise DataError(f"{_names(parts)}: no sentence pairs with text on both sides ({where})")
    if source is None:
        log.info("training a %s vocabulary of %d on %d sampled pairs", cfg.vocab_type, cfg.vocab_size, len(sample))
    rng.shuffle(sample)
    if cfg.task == "parse":
        from transduce.parsing.prepare import train_vocabulary

        return train_vocabulary(tmp, sample, cfg, threads=workers, source=source)
    options = dict(
        vocab_size=cfg.vocab_size,
        vocab_type=cfg.vocab_type,
        lowercase=cfg.lowercase,
        character_coverage=cfg.character_coverage,
        threads=workers,
    )
    if cfg.joint_vocab:
        tokenizer = Tokenizer.train(tmp, (s for pair in sample for s in pair), **options)
    else:
        tokenizer = Tokenizer.train(tmp, (s for s, _ in sample), (t for _, t in sample), **options)
    if not cfg.lowercase:  # for decode.input_case=truecase; the augmented copies' lowercased sources not counted
        tokenizer.truecaser = Truecaser.train(sources)
        tokenizer.truecaser.save(tmp)
        log.info("truecasing table: %d source words whose usual form is not lowercase", len(tokenizer.truecaser.forms))
    return tokenizer


def _check_vocabulary_use(tmp: Path, tok: Tokenizer, cfg: DataConfig, dtype: np.dtype, pairs: int) -> None:
    """Warn when the training data uses fewer than half of a trained vocabulary's learned pieces: a ``vocab_size``
    too large for the corpus (BPE goes on merging pairs seen once; the pieces the data never uses keep untrained
    embeddings and take a share of every softmax)."""
    files = split_files("train")

    def counts(*sides: str) -> np.ndarray:  # how often each id occurs on these sides, read in bounded chunks
        total = np.zeros(max(tok.src_vocab_size, tok.tgt_vocab_size), dtype=np.int64)
        for side in sides:
            path = tmp / files[f"{side}.bin"]
            if path.stat().st_size:
                ids = np.memmap(path, dtype=dtype, mode="r")
                for start in range(0, len(ids), 1 << 24):
                    total += np.bincount(ids[start : start + (1 << 24)], minlength=len(total))
        return total

    src_proto, tgt_proto = tok.model_protos()
    if cfg.task == "parse":  # the target is a closed vocabulary of the trees' tokens
        sides = [("source", src_proto, counts("src"))]
    elif cfg.joint_vocab:
        sides = [("joint", src_proto, counts("src", "tgt"))]
    else:
        sides = [("source", src_proto, counts("src")), ("target", tgt_proto, counts("tgt"))]
    for what, proto, seen in sides:
        proc = sentencepiece.SentencePieceProcessor(model_proto=proto)
        size = proc.get_piece_size()
        learned = np.asarray([not (proc.is_control(i) or proc.is_unknown(i) or proc.is_byte(i) or proc.is_unused(i))
                              for i in range(size)], dtype=bool)  # fmt: skip
        used = int((seen[:size] > 0)[learned].sum())
        total = int(learned.sum())
        if used >= total / 2:
            continue
        suits = round((used + size - total) / 100) * 100
        log.warning("data.vocab_size %d: the training data uses only %s of the %s vocabulary's %s learned pieces (the "
                    "other %s never occur, so their embeddings never train); a vocab_size of about %s suits these "
                    "%s pairs", cfg.vocab_size, f"{used:,}", what, f"{total:,}", f"{total - used:,}", f"{suits:,}",
                    f"{pairs:,}")  # fmt: skip


def _chunks(split: str, parts: list[Corpus], tgt_langs: list[str]) -> Iterator[Chunk]:
    """The chunks of a split's corpora, one after the other (a chunk never spans two corpora, so that its line
    numbers name its files' lines); with ``tgt_langs`` each pair's language as it is declared there."""
    train = _kind(split) == "train"  # the mixed-in corpus is training data too: cleaned the same way
    offset = 0
    for corpus in parts:
        src, tgt = str(corpus.src), str(corpus.tgt)
        first, s_buf, t_buf, l_buf = 0, [], [], []
        lineno = 0
        for lineno, s, t, lang in corpus.entries():
            s_buf.append(s)
            t_buf.append(t)
            if tgt_langs:
                l_buf.append(line_language(lang, tgt_langs, f"{corpus.src}, line {lineno}"))
            if len(s_buf) == CHUNK_PAIRS:
                yield Chunk(train, src, tgt, first, s_buf, t_buf, l_buf, offset)
                first, s_buf, t_buf, l_buf = lineno, [], [], []
        if s_buf:
            yield Chunk(train, src, tgt, first, s_buf, t_buf, l_buf, offset)
        offset += lineno


def _encode_split(encoder: _Encoder, writer: SplitWriter, split: str, chunks: Iterator[Chunk], *,
                  dedup: bool) -> dict[str, int]:  # fmt: skip
    counts = dict.fromkeys(DROP_REASONS, 0)
    seen: set[int] = set()
    next_report = 1_000_000
    for enc in encoder.map(chunks):
        for key, value in enc.counts.items():
            counts[key] += value
        if dedup:
            counts["duplicate"] += drop_duplicates(enc, seen)
        writer.append(enc.lines, enc.src, enc.src_lens, enc.tgt, enc.tgt_lens)
        if writer.pairs >= next_report:
            log.info("%s: %d pairs encoded", split, writer.pairs)
            next_report += 1_000_000
    return counts


class _Encoder:
    """Runs :func:`encode_chunk` over chunks in ``workers`` processes, in order, with few chunks in flight."""

    def __init__(self, options: EncodeOptions, workers: int) -> None:
        self.options, self.workers = options, workers
        self.pool = None

    def __enter__(self) -> _Encoder:
        if self.workers > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self.pool = ctx.Pool(self.workers, initializer=init_worker, initargs=(self.options,))
        else:
            init_worker(self.options)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            if exc[0] is None:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()

    def map(self, chunks: Iterator[Chunk]) -> Iterator[Encoded]:
        if self.pool is None:
            yield from map(encode_chunk, chunks)
            return
        pending: collections.deque = collections.deque()
        for chunk in chunks:  # Pool.imap would read the whole input ahead: bound what is in flight instead
            pending.append(self.pool.apply_async(encode_chunk, (chunk,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ----------------------------------------------------------------------------------------------------------------------
# inputs, reporting and atomic output


def _kind(split: str) -> str:
    return "train" if split in ("train", MIX_SPLIT) else "valid" if split == "valid" else "test"


def _corpora(cfg: DataConfig) -> dict[str, list[Corpus]]:
    if not cfg.train:
        raise DataError("no training corpus: set data.train (--train PREFIX|FILE.tsv|FILE.jsonl, or --src-file and "
                        "--tgt-file)")  # fmt: skip
    fields = (cfg.src_field, cfg.tgt_field)

    def resolve(key: str, spec: str | list[str]) -> list[Corpus]:
        try:
            return resolve_corpora(spec, cfg.src_lang, cfg.tgt_lang, fields, tgt_langs=cfg.tgt_langs,
                                   lang_field=cfg.lang_field)  # fmt: skip
        except DataError as e:
            if "not found" not in str(e):
                raise
            raise DataError(f"{e}{missing_corpus_hint(key, spec)}") from None

    corpora = {"train": resolve("data.train", cfg.train)}
    if cfg.mix:
        corpora[MIX_SPLIT] = resolve("data.mix", cfg.mix)
    if cfg.valid:
        corpora["valid"] = resolve("data.valid", cfg.valid)
    for spec in cfg.test:
        parts = resolve("data.test", spec)
        name = split_name(spec, parts[0])
        if name in corpora:
            raise DataError(f"test set {_names(parts)}: the split name {name!r} is already taken; rename the files")
        corpora[name] = parts
    return corpora


def _describe(parts: list[Corpus]) -> dict[str, Any]:
    """A split's inputs in the manifest: one corpus's record, or ``parts``, one record per corpus (several target
    languages' files)."""
    if len(parts) > 1:
        return {"format": "parts", "parts": [_describe([part]) for part in parts]}
    corpus = parts[0]
    src = file_record(corpus.src)
    return {**corpus.record(), "src": src, "tgt": dict(src) if corpus.single_file else file_record(corpus.tgt)}


def _dropped(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in counts.items() if n) or "none dropped"


def _log_counts(split: str, info: dict[str, Any], cfg: DataConfig) -> None:
    counts = info["counts"]
    if info["kind"] != "train":
        bad = f", {counts['invalid_utf8']} with invalid UTF-8 replaced" if counts["invalid_utf8"] else ""
        log.info("%s: %d pairs, every line kept%s", split, info["pairs"], bad)
        return
    log.info(
        "%s: read %d pairs, kept %d; dropped %d with an empty side, %d longer than %d tokens, %d with a length "
        "ratio over %g, %d duplicates%s, %d with invalid UTF-8",
        split,
        info["read"],
        info["pairs"],
        counts["empty"],
        counts["too_long"],
        cfg.max_len,
        counts["ratio"],
        cfg.max_len_ratio,
        counts["duplicate"],
        "" if cfg.dedup else " (dedup off)",
        counts["invalid_utf8"],
    )
