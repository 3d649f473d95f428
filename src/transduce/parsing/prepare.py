"""Preparing a treebank for training: trees -> (words, linearised tree) pairs -> the usual prepared directory.

With ``data.task: parse`` the corpus prefixes of the data section name treebanks (see
:func:`transduce.parsing.trees.read_treebank`: a ``.mrg`` file, a directory, an archive, with an optional
``:FIRST-LAST`` range of file names). :func:`treebank_text` writes each split as a pair of text files, the words
(``PREFIX.<src_lang>``) and the linearised tree (``PREFIX.<tgt_lang>``), and ``transduce prepare`` goes on as for
translation. The vocabularies differ: the source is SentencePiece subwords of ``data.vocab_size`` pieces (or, for a
parser started from a pretrained model, that model's source SentencePiece model: :mod:`transduce.parsing.transfer`);
the target is a closed set of whole tokens (``(NP``, ``)NP``, ``XX``), one id each, made by :func:`train_vocabulary`.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import sentencepiece as spm

from transduce.config import DataConfig
from transduce.data.binary import MANIFEST_FILE
from transduce.data.download import missing_corpus_hint
from transduce.data.output import write_json
from transduce.errors import DataError
from transduce.parsing.linearize import linearise
from transduce.parsing.trees import Tree, read_treebank, split_spec
from transduce.text.special import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, SPECIAL_IDS, UNK, UNK_ID
from transduce.text.spm_proto import model_type
from transduce.text.tokenizer import SRC_MODEL, TGT_MODEL, TOKENIZER_FILE, Tokenizer, _train_one
from transduce.text.vocab import load_vocabulary

log = logging.getLogger(__name__)

TEXT_DIR = "text"  # the sub-directory of a prepared directory that keeps the text made from the treebanks
# the part-of-speech tags whose words data.tree_swap replaces: nouns, verbs, adjectives, adverbs, numbers (open
# classes; a determiner, preposition or conjunction decides the structure around it and is kept)
SWAP_TAGS = frozenset(
    ["NN", "NNS", "NNP", "NNPS", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "JJ", "JJR", "JJS", "RB", "RBR", "RBS", "CD"]
)  # fmt: skip
SWAP_SEED = 12345  # the swapped copies are a deterministic function of the treebank and the options


def swap_words(trees: list[Tree], copies: int, share: float, seed: int = SWAP_SEED) -> list[Tree]:
    """``copies`` copies of each tree in which each word tagged with one of :data:`SWAP_TAGS` is, with probability
    ``share``, replaced by a word drawn from the words that ``trees`` tag so, by frequency (a word seen n times with
    the tag is drawn n times as often). The structure and the tags stay; only words change.

    Returns:
        The new trees: copy 1 of every tree, then copy 2, and so on (``trees`` are not changed).
    """
    lexicon: dict[str, list[str]] = {}
    for tree in trees:
        for word, tag in zip(tree.words(), tree.tags(), strict=True):
            if tag in SWAP_TAGS:
                lexicon.setdefault(tag, []).append(word)
    rng = random.Random(seed)

    def swapped(node: Tree) -> Tree:
        if node.is_preterminal():
            words = lexicon.get(node.label)
            if words and rng.random() < share:
                return Tree(node.label, [rng.choice(words)])
            return Tree(node.label, list(node.children))
        return Tree(node.label, [swapped(child) for child in node.children])  # type: ignore[arg-type]

    return [swapped(tree) for _ in range(copies) for tree in trees]


def split_name(spec: str) -> str:
    """A file-name-safe name for a test treebank: ``dir/wsj.mrg.tar.gz:wsj_0140-wsj_0169`` -> ``wsj_0140-wsj_0169``
    (the range when there is one, else the file name without extensions)."""
    path, first, last = split_spec(spec)
    name = f"{first}-{last}" if first or last else path.name.split(".")[0]
    return re.sub(r"[^\w.-]+", "_", name) or "test"


def treebank_text(cfg: DataConfig, directory: str | Path) -> DataConfig:
    """Write the (words, linearised tree) text pair of every treebank of ``cfg`` into ``directory``.

    Returns:
        ``cfg`` with ``train``, ``valid`` and ``test`` pointing at the written text (``directory/train`` and so on).

    Raises:
        DataError: a treebank cannot be read (see :func:`read_treebank`).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    splits = {"train": cfg.train}
    if cfg.valid:
        splits["valid"] = cfg.valid
    for spec in cfg.test:
        splits[split_name(spec)] = spec
    prefixes = {}
    trees_of = {}
    for name, spec in splits.items():
        try:
            trees_of[name] = read_treebank(spec)
        except DataError as e:
            if "not found" not in str(e):
                raise
            key = f"data.{name}" if name in ("train", "valid") else "data.test"
            raise DataError(f"{e}{missing_corpus_hint(key, spec)}") from None
    known = None
    if cfg.tree_leaves == "word" and cfg.tree_min_count > 1:
        counts = Counter(word for tree in trees_of["train"] for word in tree.words())
        known = {word for word, n in counts.items() if n >= cfg.tree_min_count}
        log.info("word leaves: %d of %d training words seen at least %d times; the others are XX",
                 len(known), len(counts), cfg.tree_min_count)  # fmt: skip
    if cfg.tree_swap_copies:
        added = swap_words(trees_of["train"], cfg.tree_swap_copies, cfg.tree_swap)
        log.info("train: %d trees added with words swapped (%d copies, share %.2f)", len(added),
                 cfg.tree_swap_copies, cfg.tree_swap)  # fmt: skip
        trees_of["train"] = trees_of["train"] + added
    for name, spec in splits.items():
        trees = trees_of[name]
        src = [" ".join(tree.words()) for tree in trees]
        tgt = [" ".join(linearise(tree, leaves=cfg.tree_leaves, closing=cfg.tree_closing, known=known,
                                  order=cfg.tree_order)) for tree in trees]  # fmt: skip
        prefix = directory / name
        for lang, lines in ((cfg.src_lang, src), (cfg.tgt_lang, tgt)):
            Path(f"{prefix}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        log.info("%s: %d trees from %s", name, len(trees), spec)
        prefixes[name] = str(prefix)
    tests = [prefixes[split_name(spec)] for spec in cfg.test]
    return cfg.replace(train=prefixes["train"], valid=prefixes.get("valid", ""), test=tests)


def train_vocabulary(
    directory: str | Path, pairs: Iterable[tuple[str, str]], cfg: DataConfig, *, threads: int = 1,
    source: str | Path | None = None,
) -> Tokenizer:  # fmt: skip
    """Source subwords and whole-token target vocabulary for parsing, written with ``tokenizer.json``.

    Args:
        directory: where the model files go.
        pairs: (words, linearised tree) training pairs (a sample is enough for the source; the target vocabulary
            must see every token, so pass them all: a treebank is small).
        cfg: the data section (``vocab_size``, ``vocab_type``, ``lowercase``, ``character_coverage``).
        threads: SentencePiece training threads.
        source: a vocabulary directory (a pretrained model's) whose source SentencePiece model becomes the source
            model, as it is (same pieces, same ids), instead of one trained here; ``cfg``'s source options are then
            unused.

    Returns:
        The tokenizer (separate source and target models).

    Raises:
        DataError: ``source`` is not a cased transduce SentencePiece vocabulary.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pairs = list(pairs)
    lowercase = cfg.lowercase and source is None  # (a pretrained source model is a cased one: _copy_source_model)
    lower = (lambda s: s.lower()) if lowercase else (lambda s: s)
    if source is None:
        vocab_type = cfg.vocab_type
        _train_one(directory / SRC_MODEL, (lower(s) for s, _ in pairs), "source", vocab_size=cfg.vocab_size,
                   vocab_type=vocab_type, coverage=cfg.character_coverage, threads=threads)  # fmt: skip
    else:
        vocab_type = _copy_source_model(source, directory / SRC_MODEL)
    # the target: one piece per distinct token; no byte pieces (a token never seen in training is <unk>)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([lower(t) for _, t in pairs]),
        model_prefix=str((directory / TGT_MODEL).with_suffix("")),
        model_type="word",
        vocab_size=1_000_000,
        hard_vocab_limit=False,  # as many pieces as there are distinct tokens
        character_coverage=1.0,
        split_by_whitespace=True,
        max_sentencepiece_length=64,
        pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        pad_piece=PAD, bos_piece=BOS, eos_piece=EOS, unk_piece=UNK,
        input_sentence_size=0, num_threads=max(1, threads), minloglevel=2,
    )  # fmt: skip
    meta = {
        "joint": False,
        "lowercase": lowercase,
        "vocab_type": vocab_type,
        "tgt_vocab_type": "word",
        "files": {"src": SRC_MODEL, "tgt": TGT_MODEL},
        "special_ids": dict(SPECIAL_IDS),
    }
    if cfg.tree_order != "top-down":  # how to read the target back (and no ensemble with a top-down model)
        meta["tree_order"] = cfg.tree_order
    tok = Tokenizer.load_files(directory, meta)
    meta.update(src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size)
    (directory / TOKENIZER_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    log.info("parsing vocabularies: %d source subwords%s, %d target tokens", tok.src_vocab_size,
             f" (the source model of {source})" if source is not None else "", tok.tgt_vocab_size)  # fmt: skip
    return tok


def _copy_source_model(vocab_dir: str | Path, path: Path) -> str:
    """Write the source SentencePiece model of the vocabulary in ``vocab_dir`` to ``path``; returns its model type.

    Raises:
        DataError: the vocabulary is not a transduce SentencePiece one (an imported Marian vocabulary maps its
            pieces to other ids), or it lowercases (a vocabulary lowercases both sides: the trees' labels too).
    """
    vocab = load_vocabulary(vocab_dir)
    if not isinstance(vocab, Tokenizer):
        raise DataError(f"{vocab_dir}: a parser takes the source SentencePiece model of a transduce vocabulary, and "
                        f"this is a {type(vocab).__name__}; start the parser from a transduce run")  # fmt: skip
    if vocab.lowercase:
        raise DataError(f"{vocab_dir}: the vocabulary lowercases its text, and a parser's would lowercase the trees' "
                        "labels too; start the parser from a cased run")  # fmt: skip
    proto = vocab.model_protos()[0]
    path.write_bytes(proto)
    return model_type(proto)


def prepare_treebank(
    cfg: DataConfig, out_dir: str | Path, *, force: bool, prepare_text: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    """``transduce prepare`` for treebanks: the text pairs are made in a temporary directory, prepared by
    ``prepare_text`` (the translation path) and kept in ``out_dir/text``; the manifest records the treebanks.

    Returns:
        The manifest.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.text-", dir=out_dir.parent))
    try:
        text_cfg = treebank_text(cfg, tmp)
        manifest = prepare_text(text_cfg, out_dir, force=force)
        if "treebanks" not in manifest:  # made now, not reused: keep the text beside the binaries
            text_dir = out_dir / TEXT_DIR
            shutil.rmtree(text_dir, ignore_errors=True)
            shutil.copytree(tmp, text_dir)
            for record in manifest["inputs"].values():  # (a record also holds the corpus's format and fields)
                for side in ("src", "tgt"):
                    record[side]["path"] = str((text_dir / Path(record[side]["path"]).name).resolve())
            specs = {"train": cfg.train, "valid": cfg.valid, **{split_name(t): t for t in cfg.test}}
            manifest["treebanks"] = {split: spec for split, spec in specs.items() if spec}
            write_json(out_dir / MANIFEST_FILE, manifest)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
