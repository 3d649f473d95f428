"""``prepare``: the prepared directory, cleaning counts, every bad-input error, atomic output, the dataset."""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import random
import time
from pathlib import Path

import numpy as np
import pytest
import sentencepiece

import transduce.data.preparation as prep
from transduce.config import DataConfig
from transduce.data import ParallelDataset, TokenBatchSampler, padding_stats, prepare
from transduce.errors import DataError
from transduce.text.tokenizer import Tokenizer

MULTI30K = Path(__file__).parents[2] / "shared" / "data" / "multi30k"
EN_DE = {
    "the": "die", "a": "ein", "man": "mann", "woman": "frau", "dog": "hund", "runs": "läuft", "walks": "geht",
    "park": "park", "street": "straße", "red": "rot", "blue": "blau", "green": "grün", "small": "klein",
    "big": "groß", "coffee": "kaffee", "in": "im", "near": "nahe", "white": "weiß",
}  # fmt: skip


def toy_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Word-for-word 'translations', 3-12 words, so lengths and ratios are predictable."""
    rng = random.Random(seed)
    src = [" ".join(rng.choice(list(EN_DE)) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    return src, [" ".join(EN_DE[w] for w in line.split()) for line in src]


def write(directory: Path, name: str, src: list[str], tgt: list[str], gz: bool = False) -> str:
    for lang, lines in (("en", src), ("de", tgt)):
        data = "".join(line + "\n" for line in lines).encode()
        path = directory / f"{name}.{lang}{'.gz' if gz else ''}"
        path.write_bytes(gzip.compress(data) if gz else data)
    return str(directory / name)


def config(train: str, **kw) -> DataConfig:
    return DataConfig(**{"train": train, "vocab_size": 300, "workers": 1, **kw})


@pytest.fixture
def corpus(tmp_path) -> str:
    return write(tmp_path, "train", *toy_pairs(400), gz=True)


# ----------------------------------------------------------------------------------------------------------------------
# the prepared directory


def test_prepared_directory_dataset_and_manifest(tmp_path, corpus):
    v_src, v_tgt = toy_pairs(30, seed=1)
    t_src, t_tgt = toy_pairs(20, seed=2)
    t_src[3] = ""  # test sets keep every line, empty ones included
    t_src[5] = " ".join(["dog"] * 200)  # and long ones
    cfg = config(corpus, valid=write(tmp_path, "val", v_src, v_tgt), test=[write(tmp_path, "test_x", t_src, t_tgt)])
    out = tmp_path / "out"
    manifest = prepare(cfg, out)

    assert manifest == json.loads((out / "manifest.json").read_text())
    assert list(manifest["splits"]) == ["train", "valid", "test_x"]
    expected = {"manifest.json", "spm.model", "spm.vocab", "tokenizer.json", "truecase.json"}  # (a cased corpus)
    expected |= {
        f"{s}.{suffix}" for s in manifest["splits"] for suffix in ("src.bin", "tgt.bin", "src.idx", "tgt.idx", "line")
    }
    assert {p.name for p in out.iterdir()} == expected
    assert manifest["dtype"] == "uint16" and manifest["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    assert manifest["options"]["vocab_size"] == 300 and manifest["tokenizer"]["joint"] is True
    train_src = manifest["inputs"]["train"]["src"]
    assert train_src["path"] == str(Path(corpus + ".en.gz").resolve()) and train_src["lines"] == 400
    assert len(train_src["sha256"]) == 64

    tok = Tokenizer.load(out)
    src, tgt = toy_pairs(400)
    train = ParallelDataset(out, "train")
    assert len(train) == 400 and train.line_index.tolist() == list(range(400))
    for i in (0, 17, 399):
        assert train[i][0].tolist() == tok.encode_src(src[i]) and train[i][1].tolist() == tok.encode_tgt(tgt[i])
    assert train.src_lengths.tolist() == [len(tok.encode_src(s)) for s in src]
    assert train.tgt_lengths.tolist() == [len(tok.encode_tgt(t)) for t in tgt]
    assert int(train.src_lengths.sum()) == manifest["splits"]["train"]["src_tokens"]

    test = ParallelDataset(out, "test_x")
    assert len(test) == 20 and test.line_index.tolist() == list(range(20))
    assert test[3][0].tolist() == [] and len(test[5][0]) >= 200
    assert [tok.decode_tgt(test[i][1]) for i in range(20)] == t_tgt
    assert ParallelDataset.splits(out) == ["train", "valid", "test_x"]
    with pytest.raises(DataError, match=r"no split 'test' \(available: train, valid, test_x\)"):
        ParallelDataset(out, "test")


def test_cleaning_drops_whole_pairs_and_counts_them(tmp_path):
    src, tgt = toy_pairs(300)
    bad = {
        10: ("", "ein hund"),  # empty source
        11: ("a dog", "   "),  # blank target
        12: (" ".join(["big dog"] * 40), " ".join(["groß hund"] * 40)),  # too long
        13: ("a", " ".join(["die grün straße"] * 2)),  # length ratio
        14: (src[0], tgt[0]),  # duplicate of line 0
        15: (src[1], tgt[1]),  # duplicate of line 1
        16: (src[0], tgt[0]),  # duplicate of line 0
    }
    for i, (s, t) in bad.items():
        src[i], tgt[i] = s, t
    out = tmp_path / "out"
    manifest = prepare(config(write(tmp_path, "c", src, tgt), max_len=60, max_len_ratio=4.0, dedup=True), out)
    info = manifest["splits"]["train"]
    assert info["counts"] == {"invalid_utf8": 0, "empty": 2, "too_long": 1, "ratio": 1, "duplicate": 3}
    assert info["read"] == 300 and info["pairs"] == 293
    train, tok = ParallelDataset(out, "train"), Tokenizer.load(out)
    kept = train.line_index.tolist()
    assert kept == [i for i in range(300) if i not in bad]
    for k, line in enumerate(kept):  # never shifted: every kept pair is still its own line on both sides
        assert tok.decode_src(train[k][0]) == src[line] and tok.decode_tgt(train[k][1]) == tgt[line]


def test_duplicates_are_kept_without_dedup(tmp_path):
    src, tgt = toy_pairs(100)
    src[5], tgt[5] = src[4], tgt[4]
    manifest = prepare(config(write(tmp_path, "c", src, tgt)), tmp_path / "out")
    assert manifest["splits"]["train"]["pairs"] == 100 and manifest["splits"]["train"]["counts"]["duplicate"] == 0


def test_unicode_line_separators_do_not_misalign_pairs(tmp_path):
    src, tgt = toy_pairs(200)
    src[7] = "the dog\u2028runs"
    src[8] = "a man\x85walks\x0cin the park"
    out = tmp_path / "out"
    prepare(config(write(tmp_path, "c", src, tgt)), out)
    train, tok = ParallelDataset(out, "train"), Tokenizer.load(out)
    assert len(train) == 200
    assert tok.decode_tgt(train[9][1]) == tgt[9] and tok.decode_tgt(train[199][1]) == tgt[199]


def test_lowercase_and_separate_vocabularies_are_recorded(tmp_path):
    src, tgt = toy_pairs(400)
    src = [s.capitalize() for s in src]
    out = tmp_path / "out"
    manifest = prepare(config(write(tmp_path, "c", src, tgt), lowercase=True, joint_vocab=False), out)
    assert manifest["tokenizer"]["lowercase"] is True and manifest["tokenizer"]["joint"] is False
    assert {"spm.src.model", "spm.tgt.model"} <= {p.name for p in out.iterdir()}
    tok = Tokenizer.load(out)
    assert tok.lowercase and not tok.joint
    assert ParallelDataset(out, "train")[0][0].tolist() == tok.encode_src(src[0].upper())


def test_the_vocabulary_sample_is_bounded(tmp_path, corpus, caplog):
    with caplog.at_level(logging.INFO):
        prepare(config(corpus, input_sentence_size=101), tmp_path / "joint")
        prepare(config(corpus, input_sentence_size=101, joint_vocab=False), tmp_path / "separate")
    assert "on 51 sampled pairs" in caplog.text  # joint: 101 sentences = 51 pairs, both sides
    assert "on 101 sampled pairs" in caplog.text
    assert ParallelDataset(tmp_path / "joint", "train").line_index.tolist() == list(range(400))  # all encoded


def test_worker_processes_give_identical_output(tmp_path, corpus):
    one = prepare(config(corpus), tmp_path / "one")
    two = prepare(config(corpus, workers=2), tmp_path / "two")
    assert one["splits"] == two["splits"]
    for name in one["splits"]["train"]["files"].values():
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_dataset_sampler_and_collate_in_a_dataloader(tmp_path, corpus):
    import torch.utils.data

    from transduce.data import collate

    prepare(config(corpus), tmp_path / "out")
    ds = ParallelDataset(tmp_path / "out", "train")
    sampler = TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, 600, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=collate)
    batches = list(loader)
    assert len(batches) == len(sampler)
    assert sum(len(b) for b in batches) == 400 == sum(int((b.tgt_out == 2).sum()) for b in batches)
    assert all(b.src.numel() <= 600 and b.tgt_in.numel() <= 600 for b in batches)


def test_dataset_pickles_and_reopens_its_maps(tmp_path, corpus):
    prepare(config(corpus), tmp_path / "out")
    ds = ParallelDataset(tmp_path / "out", "train")
    clone = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 2000  # the maps are not copied
    assert clone[5][0].tolist() == ds[5][0].tolist() and clone[-1][1].tolist() == ds[399][1].tolist()


# ----------------------------------------------------------------------------------------------------------------------
# bad input: one clear error before any work


def test_unequal_line_counts(tmp_path):
    src, tgt = toy_pairs(50)
    prefix = write(tmp_path, "c", src, tgt[:-2])
    with pytest.raises(DataError) as e:
        prepare(config(prefix), tmp_path / "out")
    assert str(e.value) == (
        f"{prefix}.en has 50 lines but {prefix}.de has 48: a parallel corpus needs one line per sentence on both sides"
    )
    assert not (tmp_path / "out").exists()


def test_unequal_line_counts_in_a_test_set_fail_before_the_vocabulary(tmp_path, corpus, monkeypatch):
    monkeypatch.setattr(Tokenizer, "train", lambda *a, **k: pytest.fail("trained before checking all inputs"))
    src, tgt = toy_pairs(10)
    test = write(tmp_path, "t", [*src, "extra"], tgt)
    with pytest.raises(DataError, match=r"t\.en has 11 lines but .*t\.de has 10"):
        prepare(config(corpus, test=[test]), tmp_path / "out")


def test_invalid_utf8_names_file_and_line(tmp_path):
    src, tgt = toy_pairs(100)
    prefix = write(tmp_path, "c", src, tgt)
    path = Path(prefix + ".de")
    lines = path.read_bytes().split(b"\n")
    lines[41] = b"ein \xc3\x28 hund"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(DataError) as e:
        prepare(config(prefix), tmp_path / "out")
    assert str(e.value) == (
        f"{path}, line 42: not valid UTF-8 (byte 0xc3 at column 5); --skip-invalid-utf8 (data.skip_invalid_utf8) "
        "skips such pairs"
    )
    manifest = prepare(config(prefix, skip_invalid_utf8=True), tmp_path / "out")
    assert manifest["splits"]["train"]["counts"]["invalid_utf8"] == 1
    assert manifest["splits"]["train"]["pairs"] == 99
    assert 41 not in ParallelDataset(tmp_path / "out", "train").line_index.tolist()


def test_invalid_utf8_in_a_test_set_is_replaced_when_skipping(tmp_path, corpus):
    src, tgt = toy_pairs(10)
    test = write(tmp_path, "t", src, tgt)
    Path(test + ".en").write_bytes(Path(test + ".en").read_bytes().replace(b"the", b"th\xff", 1))
    manifest = prepare(config(corpus, test=[test], skip_invalid_utf8=True), tmp_path / "out")
    assert manifest["splits"]["t"]["pairs"] == 10 and manifest["splits"]["t"]["counts"]["invalid_utf8"] == 1


def test_missing_file(tmp_path, corpus):
    with pytest.raises(DataError) as e:
        prepare(config(corpus, valid=str(tmp_path / "nope")), tmp_path / "out")
    assert str(e.value) == f"{tmp_path / 'nope.en'}: file not found (nor nope.en.gz) (data.valid)"


def test_a_missing_multi30k_file_says_how_to_get_it_and_which_override_points_at_it(tmp_path, corpus):
    where = tmp_path / "shared" / "data" / "multi30k"
    with pytest.raises(DataError) as e:
        prepare(config(str(where / "train")), tmp_path / "out")
    assert str(e.value) == (f"{where / 'train.en'}: file not found (nor train.en.gz); get Multi30k with `transduce "
                            "download multi30k DIR` and point data.train at it: data.train=DIR/train")  # fmt: skip
    with pytest.raises(DataError) as e:
        prepare(config(corpus, test=[str(where / "test_2016_flickr")]), tmp_path / "out")
    assert str(e.value).endswith("; get Multi30k with `transduce download multi30k DIR` and point data.test at it: "
                                 "data.test=[DIR/test_2016_flickr]")  # fmt: skip


def test_the_recipes_without_their_data_say_how_to_get_it(tmp_path, monkeypatch, capsys):
    from transduce.cli import main

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)  # where ../shared/data does not exist
    expected = {
        "multi30k_en_de.yaml": "../shared/data/multi30k/train.en: file not found (nor train.en.gz); get Multi30k with "
        "`transduce download multi30k DIR` and point data.train at it: data.train=DIR/train",
        "ptb_parse.yaml": "../shared/data/ptb_sample/wsj_0001-0169.mrg.tar.gz: treebank not found (a .mrg file, a "
        "directory of them, a .tar.gz or a .zip); get the Penn Treebank sample with `transduce download ptb-sample "
        "DIR` and point data.train at it: data.train=DIR/treebank.zip:wsj_0001-wsj_0129",
    }
    for recipe, message in expected.items():
        assert main(["train", str(root / "configs" / recipe), "train.run_dir=run"]) == 2
        assert capsys.readouterr().err == f"transduce train: error: {message}\n"
        assert not (tmp_path / "run").exists()


def test_empty_corpus(tmp_path):
    for src, tgt in (([], []), (["", " "], ["x", ""])):
        prefix = write(tmp_path, "c", src, tgt)
        with pytest.raises(DataError) as e:
            prepare(config(prefix), tmp_path / "out")
        assert str(e.value) == (
            f"{prefix}.en and {prefix}.de: no sentence pairs with text on both sides ({len(src)} lines)"
        )


def test_everything_filtered(tmp_path):
    src, tgt = toy_pairs(100)
    with pytest.raises(DataError) as e:
        prepare(config(write(tmp_path, "c", src, tgt), max_len=2), tmp_path / "out")
    assert str(e.value).endswith(": no sentence pairs left after cleaning (100 too long)")


def test_vocabulary_size_the_data_cannot_support(tmp_path, corpus):
    with pytest.raises(DataError, match=r"^vocab_size 100 is too small for the joint vocabulary: it needs at least"):
        prepare(config(corpus).replace(vocab_size=100), tmp_path / "out")
    with pytest.raises(DataError, match=r"^vocab_size 5000 is too large for the joint vocabulary: the data"):
        prepare(config(corpus).replace(vocab_size=5000, vocab_type="unigram"), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_a_vocabulary_too_large_for_the_corpus_is_warned_of_with_what_suits_it(tmp_path, corpus, caplog):
    """400 pairs of mostly distinct words and 5,000 BPE pieces: SentencePiece learns merges the data never uses as
    pieces, whose embeddings would never train."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(1500)]
    src = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) for _ in range(400)]
    prefix = write(tmp_path, "rare", src, src[::-1])
    with caplog.at_level(logging.WARNING, logger="transduce.data.preparation"):
        prepare(config(prefix, vocab_size=5000), tmp_path / "out")
    tok = Tokenizer.load(tmp_path / "out")
    proc = sentencepiece.SentencePieceProcessor(model_proto=tok.model_protos()[0])
    learned = [i for i in range(proc.get_piece_size()) if proc.is_control(i) + proc.is_unknown(i) + proc.is_byte(i)
               + proc.is_unused(i) == 0]  # fmt: skip
    train = ParallelDataset(tmp_path / "out", "train")
    seen = {int(i) for k in range(len(train)) for side in train[k] for i in side}
    used = len(seen & set(learned))
    assert used < len(learned) / 2
    suits = round((used + 260) / 100) * 100
    assert caplog.messages == [
        f"data.vocab_size 5000: the training data uses only {used:,} of the joint vocabulary's {len(learned):,} "
        f"learned pieces (the other {len(learned) - used:,} never occur, so their embeddings never train); a "
        f"vocab_size of about {suits:,} suits these 400 pairs"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="transduce.data.preparation"):
        prepare(config(corpus), tmp_path / "fitting")  # 300 pieces for the toy corpus: no warning
    assert caplog.messages == []


def test_test_set_named_like_another_split(tmp_path, corpus):
    with pytest.raises(DataError, match=r"the split name 'train' is already taken"):
        prepare(config(corpus, test=[corpus]), tmp_path / "out")


# ----------------------------------------------------------------------------------------------------------------------
# atomic output, reuse


def test_an_interrupted_prepare_leaves_no_partial_output(tmp_path, corpus, monkeypatch):
    calls = []
    real = prep.encode_chunk

    def interrupted(chunk):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(chunk)

    monkeypatch.setattr(prep, "CHUNK_PAIRS", 64)
    monkeypatch.setattr(prep, "encode_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(config(corpus), tmp_path / "out")
    assert len(calls) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.de.gz", "train.en.gz"]
    monkeypatch.setattr(prep, "encode_chunk", real)
    assert prepare(config(corpus), tmp_path / "out")["splits"]["train"]["pairs"] == 400  # rerunning is safe


def test_leftovers_of_a_killed_run_are_removed(tmp_path, corpus):
    dead = tmp_path / ".out.tmp-999999999-abc"  # no such process
    dead.mkdir()
    (dead / "train.src.bin").write_bytes(b"half")
    alive = tmp_path / f".out.tmp-{os.getpid()}-xyz"  # a concurrent run: left alone
    alive.mkdir()
    prepare(config(corpus), tmp_path / "out")
    assert not dead.exists() and alive.exists()


def test_rerun_reuses_forces_or_refuses(tmp_path, corpus, caplog):
    out = tmp_path / "out"
    first = prepare(config(corpus), out)
    stamp = (out / "train.src.bin").stat().st_mtime_ns
    time.sleep(0.01)
    with caplog.at_level(logging.INFO):
        assert prepare(config(corpus, workers=2), out) == first  # workers do not change the output
    assert "already holds this preparation" in caplog.text and (out / "train.src.bin").stat().st_mtime_ns == stamp
    with pytest.raises(DataError) as e:
        prepare(config(corpus, max_len=30), out)
    assert str(e.value) == f"{out} was prepared from other inputs or options; use --force to replace it"
    second = prepare(config(corpus, max_len=30), out, force=True)
    assert second["options"]["max_len"] == 30 and json.loads((out / "manifest.json").read_text()) == second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "train.de.gz", "train.en.gz"]


def test_refuses_to_replace_a_directory_that_is_not_prepared(tmp_path, corpus):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    for force in (False, True):
        with pytest.raises(DataError) as e:
            prepare(config(corpus), out, force=force)
        assert str(e.value) == f"{out} exists and is not a prepared directory; refusing to overwrite it"
    assert (out / "precious.txt").read_text() == "keep me"
    (out / "precious.txt").unlink()
    assert prepare(config(corpus), out)["splits"]["train"]["pairs"] == 400  # an empty directory is fine


# ----------------------------------------------------------------------------------------------------------------------
# real data


@pytest.mark.shared
@pytest.mark.slow
def test_multi30k_prepares_fast_with_little_padding(tmp_path):
    if not (MULTI30K / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K} (../shared/data/multi30k beside the checkout)")
    cfg = DataConfig(train=str(MULTI30K / "train"), valid=str(MULTI30K / "val"),
                     test=[str(MULTI30K / "test_2016_flickr")], vocab_size=8000)  # fmt: skip
    started = time.perf_counter()
    manifest = prepare(cfg, tmp_path / "m30k")
    assert time.perf_counter() - started < 60
    assert manifest["splits"]["train"]["pairs"] == 29000
    assert manifest["splits"]["valid"]["pairs"] == 1014 and manifest["splits"]["test_2016_flickr"]["pairs"] == 1000
    train = ParallelDataset(tmp_path / "m30k", "train")
    stats = padding_stats(TokenBatchSampler(train.src_lengths, train.tgt_lengths, 4096, seed=1))
    assert stats["padding_share"] < 0.10
    tok = Tokenizer.load(tmp_path / "m30k")
    with gzip.open(MULTI30K / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    test = ParallelDataset(tmp_path / "m30k", "test_2016_flickr")
    assert np.array_equal(test.line_index, np.arange(1000))
    assert sum(tok.decode_tgt(test[i][1]) == refs[i] for i in range(1000)) >= 995
