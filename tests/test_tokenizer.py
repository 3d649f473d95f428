"""The SentencePiece tokenizer: special ids, no bos/eos in encodings, decoding stops at eos, byte fallback,
lowercasing recorded and reapplied, clear errors; round trips on real Multi30k lines."""

from __future__ import annotations

import gzip
import json
import random
import unicodedata
from pathlib import Path

import pytest

from transduce.errors import DataError
from transduce.text.special import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS, UNK_ID
from transduce.text.tokenizer import Tokenizer

MULTI30K = Path(__file__).parents[2] / "shared" / "data" / "multi30k"
WORDS = [
    "the",
    "a",
    "man",
    "woman",
    "dog",
    "runs",
    "walks",
    "park",
    "street",
    "red",
    "blue",
    "green",
    "small",
    "big",
    "über",
    "straße",
    "café",
    "naïve",
]


def toy_lines(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def joint(tmp_path_factory) -> Tokenizer:
    return Tokenizer.train(tmp_path_factory.mktemp("joint"), toy_lines(), vocab_size=320)


def test_special_ids_are_the_package_ones(joint):
    assert joint.src_pieces([PAD_ID, BOS_ID, EOS_ID, UNK_ID]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert joint.joint and joint.src_vocab_size == joint.tgt_vocab_size == 320


def test_encoding_has_no_bos_or_eos_and_round_trips(joint):
    ids = joint.encode_src("the small dog runs")
    assert ids and not {PAD_ID, BOS_ID, EOS_ID, UNK_ID} & set(ids)
    assert joint.decode_src(ids) == "the small dog runs"
    assert joint.encode_tgt("über straße") == joint.encode_src("über straße")  # one model when joint
    assert joint.encode_src_batch(["a man", "the dog"]) == [joint.encode_src("a man"), joint.encode_src("the dog")]


def test_decoding_stops_at_eos_and_ignores_pad_and_bos(joint):
    ids = joint.encode_tgt("a red café")
    assert joint.decode_tgt([BOS_ID, *ids, EOS_ID, *joint.encode_tgt("dog"), PAD_ID]) == "a red café"
    assert joint.decode_tgt([*ids, PAD_ID, PAD_ID]) == "a red café"
    assert joint.decode_tgt([EOS_ID, *ids]) == ""


def test_byte_fallback_round_trips_unseen_characters(joint):
    text = "the dog 😀 sees Ωμέγα ∑ and 漢字"
    ids = joint.encode_src(text)
    assert UNK_ID not in ids
    assert "<0xF0>" in joint.src_pieces(ids)  # the emoji's first byte
    assert joint.decode_src(ids) == text


def test_load_gives_the_same_tokenizer(joint, tmp_path):
    directory = tmp_path / "tok"
    tok = Tokenizer.train(directory, toy_lines(), vocab_size=320)
    loaded = Tokenizer.load(directory)
    text = "the big woman walks in the park"
    assert loaded.encode_src(text) == tok.encode_src(text) == joint.encode_src(text)
    meta = json.loads((directory / "tokenizer.json").read_text())
    assert meta["special_ids"] == SPECIAL_IDS and meta["files"] == {"src": "spm.model", "tgt": "spm.model"}
    assert sorted(p.name for p in directory.iterdir()) == ["spm.model", "spm.vocab", "tokenizer.json"]


def test_lowercase_is_recorded_and_reapplied_on_load(tmp_path):
    Tokenizer.train(tmp_path, toy_lines(), vocab_size=320, lowercase=True)
    tok = Tokenizer.load(tmp_path)
    assert tok.lowercase
    assert tok.encode_src("The BIG Dog") == tok.encode_src("the big dog")
    assert tok.decode_src(tok.encode_src("The BIG Dog")) == "the big dog"


def test_separate_vocabularies(tmp_path):
    src = toy_lines(300, seed=1)
    tgt = [line.upper() for line in toy_lines(300, seed=2)]
    tok = Tokenizer.train(tmp_path, src, tgt, vocab_size=300, vocab_type="unigram")
    assert not tok.joint
    assert {p.name for p in tmp_path.iterdir()} >= {"spm.src.model", "spm.tgt.model", "tokenizer.json"}
    loaded = Tokenizer.load(tmp_path)
    assert not loaded.joint
    assert loaded.decode_tgt(loaded.encode_tgt("THE DOG RUNS")) == "THE DOG RUNS"
    assert loaded.encode_tgt("THE DOG") != loaded.encode_src("THE DOG")


def test_vocabulary_too_small_is_one_clear_line(tmp_path):
    with pytest.raises(DataError) as e:
        Tokenizer.train(tmp_path, toy_lines(), vocab_size=100)
    assert str(e.value) == (
        "vocab_size 100 is too small for the joint vocabulary: it needs at least 286 pieces (4 special ids, "
        "256 byte pieces and every character of the data); raise vocab_size or lower character_coverage"
    )


def test_vocabulary_too_large_is_one_clear_line(tmp_path):
    with pytest.raises(DataError) as e:
        Tokenizer.train(tmp_path, toy_lines(), vocab_size=2000, vocab_type="unigram")
    msg = str(e.value)
    assert msg.startswith("vocab_size 2000 is too large for the joint vocabulary: the data (300 sentences) supports ")
    assert msg.endswith("pieces; lower vocab_size") and "\n" not in msg


def test_no_text_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"^cannot train the joint vocabulary: no text$"):
        Tokenizer.train(tmp_path, [], vocab_size=300)


def test_load_of_a_missing_directory(tmp_path):
    with pytest.raises(DataError) as e:
        Tokenizer.load(tmp_path / "nowhere")
    assert str(e.value) == f"{tmp_path / 'nowhere' / 'tokenizer.json'}: file not found (not a prepared directory?)"


# ----------------------------------------------------------------------------------------------------------------------
# real text


def _multi30k(name: str, n: int) -> list[str]:
    path = MULTI30K / f"{name}.gz"
    if not path.is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K} (../shared/data/multi30k beside the checkout)")
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for _, line in zip(range(n), f)]


@pytest.mark.shared
def test_round_trip_on_multi30k_lines_with_accents_and_emoji(tmp_path):
    train = _multi30k("train.en", 3000) + _multi30k("train.de", 3000)
    tok = Tokenizer.train(tmp_path, train, vocab_size=1000)
    lines = _multi30k("val.de", 1014) + _multi30k("val.en", 1014)
    lines += [line + " 😀👍🏽" for line in lines[:50]] + ["Ein Café in Zürich, naïve Größe 🚲 ✓"]
    accented = [line for line in lines if any(c in line for c in "äöüßé")]
    assert len(accented) > 400
    for line in lines:
        ids = tok.encode_tgt(line)
        assert UNK_ID not in ids
        # SentencePiece's nmt_nfkc normalisation: NFKC, runs of spaces collapsed (the only changes it makes)
        assert tok.decode_tgt(ids) == " ".join(unicodedata.normalize("NFKC", line).split())
    exact = [line for line in lines if tok.decode_tgt(tok.encode_tgt(line)) == line]
    assert len(exact) >= len(lines) - 5
