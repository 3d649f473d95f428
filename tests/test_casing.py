"""Cased output and robustness to the casing of the input: case augmentation in preparation, case normalisation in
the translator, `precision: auto`, and sacreBLEU's refusal of tokenised references."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import transduce.training.trainer as trainer_module
from test_data_prepare import config, toy_pairs, write
from transduce.config import Config, ConfigError, DataConfig, DecodeConfig
from transduce.data import ParallelDataset, prepare
from transduce.errors import DataError
from transduce.search.evaluate import tokenized_evidence
from transduce.search.translator import Translator
from transduce.text import casing
from transduce.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------------------------
# the casing functions


@pytest.mark.parametrize(
    ("text", "style"),
    [
        ("TWO DOGS ARE PLAYING IN THE SNOW.", "upper"),
        ("A MAN", "upper"),
        ("Two Dogs Are Playing In The Snow.", "title"),
        ("Two dogs are playing in the snow.", None),
        ("Ein Mann mit einem Hut spielt Gitarre.", None),  # German nouns are capitalised; the other words are not
        ("Zwei Hunde.", None),  # too short to tell Title Case from a sentence
        ("OK.", None),
        ("NASA launches a rocket.", None),
        ("", None),
        ("123 456", None),
    ],
)
def test_input_style(text, style):
    assert casing.input_style(text) == style


@pytest.mark.parametrize(
    ("text", "style"),
    [
        ("EIN GROßER HUND LÄUFT AUF DER STRAßE", "upper"),  # ß has no one-letter capital: not a lowercase letter here
        ("EIN GROẞER HUND AUF DER STRAẞE", "upper"),
        ("EL 1º PREMIO", "upper"),  # º and ª are lowercase to Unicode but have no capital
        ("LA 2ª EDICIÓN", "upper"),
        ("Ein Großer Hund Läuft Auf Der Straße", "title"),
        ("ΔΥΟ ΣΚΥΛΙΑ ΠΑΙΖΟΥΝ ΣΤΟ ΧΙΟΝΙ.", "upper"),
        ("Δύο Σκυλιά Παίζουν Στο Χιόνι", "title"),
        ("Δύο σκυλιά παίζουν στο χιόνι.", None),
        ("ДВЕ СОБАКИ ИГРАЮТ В СНЕГУ.", "upper"),
        ("Две Собаки Играют В Снегу", "title"),
        ("Две собаки играют в снегу.", None),
        ("İSTANBUL'DA BÜYÜK BİR KÖPEK", "upper"),  # dotted İ lowercases to two characters, still a capital
        ("İstanbul Büyük Bir Şehir", "title"),
        ("İstanbul'da büyük bir köpek ıslandı.", None),
        ("我们在 NASA 和 FBI 工作", None),  # two acronyms in a Chinese line: not an ALL-CAPS line
        ("NASA と FBI で働いています", None),
        ("אני עובד ב-NASA וב-FBI", None),
        ("أعمل في NASA و FBI", None),
        ("١٢٣ 456 ٧٨٩", None),
        ("   ", None),
    ],
)
def test_input_style_counts_only_letters_with_distinct_upper_and_lower_forms(text, style):
    assert casing.input_style(text) == style


def test_normalize_and_restore():
    assert casing.normalize("TWO DOGS RUN.") == ("two dogs run.", "upper")
    assert casing.normalize("Two Dogs Run Fast") == ("two dogs run fast", "title")
    assert casing.normalize("Two dogs run.") == ("Two dogs run.", None)
    assert casing.restore("Zwei Hunde rennen.", "upper") == "ZWEI HUNDE RENNEN."
    assert casing.restore("Ein großer Hund auf der Straße.", "upper") == "EIN GROẞER HUND AUF DER STRAẞE."
    assert casing.restore("Straße", "upper").lower() == "straße"  # "SS" would not give the word back
    assert casing.restore("zwei Hunde rennen im Park.", "title") == "Zwei Hunde Rennen Im Park."
    assert casing.restore("Zwei Hunde rennen.", None) == "Zwei Hunde rennen."
    assert casing.title("l'homme  d'affaires") == "L'homme  D'affaires"  # not str.title's "L'Homme"


def test_truecaser_learns_the_usual_form_of_each_word():
    truecaser = casing.Truecaser.train([
        "Ein Hund läuft im Schnee.",
        "Der Hund spielt mit Max und einem Ball.",
        "Hund und Katze im Garten",  # a line's first word does not count: "Hund" here, "Ein" above
        "Zwei Hunde spielen. Mit Max!",  # "Mit" once, "mit" once: a tie goes to the lowercase form
        "Das T-Shirt von Max ist rot; das Auto auch.",  # "das" twice, "Das" only first: "das" stays lowercase
    ])  # fmt: skip
    assert truecaser.forms == {
        "auto": "Auto", "ball": "Ball", "garten": "Garten", "hund": "Hund", "hunde": "Hunde", "katze": "Katze",
        "max": "Max", "schnee": "Schnee", "shirt": "Shirt", "t": "T",
    }  # fmt: skip
    assert truecaser("ZWEI HUNDE IM SCHNEE MIT MAX.") == "Zwei Hunde im Schnee mit Max."
    assert truecaser("Ein Hund Spielt Mit Einem Ball Im Garten") == "Ein Hund spielt mit einem Ball im Garten"
    assert truecaser("«DAS T-SHIRT», 2 MAL: UNBEKANNT.") == "«Das T-Shirt», 2 mal: unbekannt."
    assert truecaser("") == ""
    assert casing.normalize("ZWEI HUNDE IM SCHNEE.", truecaser) == ("Zwei Hunde im Schnee.", "upper")
    assert casing.normalize("Ein Hund Im Schnee", truecaser) == ("Ein Hund im Schnee", "title")
    assert casing.normalize("Ein Hund im Schnee.", truecaser) == ("Ein Hund im Schnee.", None)  # not touched


def test_truecaser_matches_words_by_their_case_folded_composed_form():
    truecaser = casing.Truecaser.train(["Er wohnt in der Straße am Fluss.", "Wir fahren nach İstanbul.",
                                        "Sie hat A\u0308rger mit ihm.", "Kein ärger, kein Ärger."])  # fmt: skip
    assert casing.normalize("DIE STRASSE AM FLUSS", truecaser) == ("Die Straße am Fluss", "upper")  # ß in caps: SS
    assert casing.normalize(
        "EINE GROSSE STRASSE", casing.Truecaser.train(["Eine große Straße, eine große Stadt."])
    ) == ("Eine große Straße", "upper")  # a lowercase word with ß is stored too: its case fold is not itself
    assert casing.normalize("DIE STRAẞE", truecaser) == ("Die Straße", "upper")
    assert casing.normalize("WIR FAHREN NACH İSTANBUL.", truecaser) == ("Wir fahren nach İstanbul.", "upper")
    assert truecaser.forms["ärger"] == "Ärger"  # decomposed "A" + combining diaeresis counts as "Ä"
    assert truecaser("DER A\u0308RGER") == "Der Ärger"


def test_truecaser_round_trips_and_names_a_bad_file(tmp_path):
    truecaser = casing.Truecaser.train(["A dog meets Anna in Straße Köln.", "The cat and Anna."])
    assert casing.Truecaser.load(tmp_path) is None  # no table: no truecaser
    path = truecaser.save(tmp_path)
    assert path == tmp_path / casing.TRUECASE_FILE
    assert casing.Truecaser.load(tmp_path).forms == truecaser.forms == {"anna": "Anna", "köln": "Köln",
                                                                        "strasse": "Straße"}  # fmt: skip
    path.write_text('{"words": {}}', encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: not a truecasing table \(KeyError: 'forms'\)$"):
        casing.Truecaser.load(tmp_path)


def test_augmented_lines_are_a_fixed_share():
    lines = [n for n in range(20_000) if casing.augmented(n, 0.2)]
    assert abs(len(lines) / 20_000 - 0.2) < 4 * (0.2 * 0.8 / 20_000) ** 0.5  # binomial: within 4 sigma
    assert lines == [n for n in range(20_000) if casing.augmented(n, 0.2)]  # the same lines every time
    assert not any(casing.augmented(n, 0.0) for n in range(1000))
    assert all(casing.augmented(n, 1.0) for n in range(1000))
    assert casing.augment_pair("Two Dogs", "Zwei Hunde") == ("two dogs", "Zwei Hunde")


# ----------------------------------------------------------------------------------------------------------------------
# preparation


def test_case_augment_adds_lowercased_source_copies(tmp_path):
    src, tgt = toy_pairs(300)
    src = [s.capitalize() for s in src]  # "The man ..." so that lowercasing changes every source
    tgt = [t.capitalize() for t in tgt]
    out = tmp_path / "out"
    manifest = prepare(config(write(tmp_path, "c", src, tgt), case_augment=0.25, vocab_size=400), out)
    assert manifest["options"]["case_augment"] == 0.25
    chosen = [n for n in range(300) if casing.augmented(n, 0.25)]
    train, tok = ParallelDataset(out, "train"), Tokenizer.load(out)
    assert len(train) == 300 + len(chosen)
    # each chosen line appears twice, the copy right after the original, with the source lowercased
    assert train.line_index.tolist() == sorted(list(range(300)) + chosen)
    pairs = [(int(line), tok.decode_src(train[i][0]), tok.decode_tgt(train[i][1])) for i, line in
             enumerate(train.line_index)]  # fmt: skip
    for n in chosen:
        copies = [(s, t) for line, s, t in pairs if line == n]
        assert copies == [(src[n], tgt[n]), (src[n].lower(), tgt[n])]
    assert prepare(config(write(tmp_path, "c", src, tgt), case_augment=0.25, vocab_size=400), out) == manifest
    with pytest.raises(ConfigError, match=r"case_augment: must be in \[0, 1\], got 1.5"):
        DataConfig(train="x", case_augment=1.5)


def test_prepare_writes_the_truecasing_table_of_the_original_sources(tmp_path):
    src, tgt = toy_pairs(200)
    src = [re.sub(r"\bman\b", "Man", s) for s in src]  # a name, and sentence-initial capitals that do not count
    src = [s[:1].upper() + s[1:] if i % 2 else s for i, s in enumerate(src)]
    out = tmp_path / "out"
    prepare(config(write(tmp_path, "c", src, tgt), case_augment=1.0, vocab_size=400), out)
    expected = casing.Truecaser.train(src).forms
    assert expected == {"man": "Man"} == casing.Truecaser.load(out).forms  # augmented copies not counted
    assert Tokenizer.load(out).truecaser.forms == expected
    lowered = tmp_path / "lowered"
    prepare(config(write(tmp_path, "c", src, tgt), lowercase=True, vocab_size=400), lowered)
    assert Tokenizer.load(lowered).truecaser is None and not (lowered / casing.TRUECASE_FILE).exists()


def test_case_augment_skips_copies_that_change_nothing(tmp_path):
    src, tgt = toy_pairs(200)  # already lowercase: a lowercased copy would only repeat the pair
    manifest = prepare(config(write(tmp_path, "c", src, tgt), case_augment=0.5), tmp_path / "out")
    assert manifest["splits"]["train"]["pairs"] == 200


# ----------------------------------------------------------------------------------------------------------------------
# translation


def test_normalize_translates_the_lowercased_line_and_restores_its_style(copy_checkpoint):
    translator = Translator.load(copy_checkpoint)
    plain = translator.translate(["two girls play on the grass.", "a man rides the red bike."], beam=2)
    assert plain == ["two girls play on the grass.", "a man rides the red bike."]  # the model copies
    shouting = ["TWO GIRLS PLAY ON THE GRASS.", "A Man Rides The Red Bike."]
    normalized = translator.translate(shouting, beam=2, input_case="normalize")
    assert normalized == ["TWO GIRLS PLAY ON THE GRASS.", "A Man Rides The Red Bike."]
    assert translator.translate(shouting, beam=2) != normalized  # keep: the model sees the capitals
    nbest = translator.translate_nbest(shouting[:1], nbest=2, input_case="normalize")[0]
    assert nbest[0].text == "TWO GIRLS PLAY ON THE GRASS." and all(t.text.isupper() for t in nbest)
    with pytest.raises(ConfigError, match=r"input_case: 'lower' is not one of 'keep', 'normalize', 'truecase'"):
        DecodeConfig(input_case="lower")


def test_truecase_gives_the_model_the_recased_line_and_travels_with_the_checkpoint(copy_checkpoint, tmp_path):
    from transduce.training.checkpoint import copy_vocab, vocab_dir_of

    translator = Translator.load(copy_checkpoint)
    shouting = ["TWO GIRLS PLAY ON THE GRASS.", "A Man Rides The Red Bike.", "a man rides the red bike."]
    with pytest.raises(ConfigError, match=r"^input_case: 'truecase' needs the source truecasing table "
                       r"\(truecase.json\) .*; this model has none \(use 'normalize'\)$"):  # fmt: skip
        translator.translate(shouting, input_case="truecase")
    vocab = copy_vocab(vocab_dir_of(copy_checkpoint), tmp_path / "vocab")
    casing.Truecaser({"grass": "Grass", "man": "Man"}).save(vocab)
    copied = copy_vocab(vocab, tmp_path / "copied")  # the table goes where the vocabulary goes
    assert (copied / casing.TRUECASE_FILE).is_file()
    translator.tokenizer = Tokenizer.load(copied)
    seen = []
    encode = translator._encode
    translator._encode = lambda texts: seen.extend(texts) or encode(texts)
    out = translator.translate(shouting, beam=2, input_case="truecase")
    assert seen == ["Two girls play on the Grass.", "A Man rides the red bike.", "a man rides the red bike."]
    assert out[0].isupper() and out[1] == casing.title(out[1]) and out[2] == "a man rides the red bike."


def test_output_is_detokenised_and_keeps_case_and_punctuation(tmp_path):
    """A cased toy model (trained in seconds on the copy task with capitals and punctuation) writes plain text."""
    from decodekit import fit
    from transduce.config import ModelConfig
    from transduce.model import Transformer
    from transduce.search.common import pad_sequences
    from transduce.text.special import BOS_ID, EOS_ID, PAD_ID
    from transduce.training.checkpoint import save_model

    sentences = ["Hello, World!", "The Dog's Café.", "Zwei Hunde, ein Mann.", "Ça va? Oui!"] * 16
    tok = Tokenizer.train(tmp_path / "vocab", sentences, vocab_size=320)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("test", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                             dropout=0.0, d_model=64, d_ff=128)  # fmt: skip
    model = Transformer(cfg)
    ids = tok.encode_src_batch(sentences[:4])
    batch = (
        pad_sequences([[*s, EOS_ID] for s in ids], PAD_ID),
        pad_sequences([[BOS_ID, *s] for s in ids], PAD_ID),
        pad_sequences([[*s, EOS_ID] for s in ids], PAD_ID),
    )
    fit(model, lambda: batch, steps=150, lr=1e-2)
    path = save_model(tmp_path / "model", model.eval(), Config(model=cfg), tmp_path / "vocab")
    out = Translator.load(path).translate(sentences[:4], beam=2)
    assert out == sentences[:4]
    assert not any("▁" in line or "<unk>" in line for line in out)


# ----------------------------------------------------------------------------------------------------------------------
# precision: auto


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16"), (False, "fp32")])
def test_auto_precision_on_the_cpu_follows_its_bf16_instructions(monkeypatch, native, expected):
    monkeypatch.setattr(trainer_module, "cpu_has_native_bf16", lambda: native)
    precision, why = trainer_module.resolve_precision("auto", torch.device("cpu"))
    assert precision == expected and why.startswith("auto: this CPU")
    assert trainer_module.resolve_precision("fp32", torch.device("cpu")) == ("fp32", "as configured")
    assert trainer_module.resolve_precision("bf16", torch.device("cpu")) == ("bf16", "as configured")


@pytest.mark.parametrize(("supported", "expected"), [(True, "bf16"), (False, "fp32")])
def test_auto_precision_on_a_gpu_follows_its_bf16_support(monkeypatch, supported, expected):
    calls = []

    def is_bf16_supported(including_emulation=True):
        calls.append(including_emulation)
        return supported

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert trainer_module.resolve_precision("auto", torch.device("cuda:0"))[0] == expected
    assert calls == [False]  # emulated bf16 (e.g. a V100) is no reason to train in bf16


def test_the_trainer_logs_the_resolved_precision(monkeypatch, caplog):
    from transduce.config import ModelConfig, TrainConfig
    from transduce.model import Transformer

    monkeypatch.setattr(trainer_module, "cpu_has_native_bf16", lambda: False)
    model = Transformer(ModelConfig.preset("test", src_vocab_size=20, tgt_vocab_size=20))
    with caplog.at_level(logging.INFO, logger="transduce.training.trainer"):
        trainer = trainer_module.Trainer(Config(train=TrainConfig()), model, torch.device("cpu"))
    assert trainer.precision == "fp32" and trainer.autocast_dtype is None
    assert "precision: fp32 (auto: this CPU has no bf16 instructions" in caplog.text


def test_the_multi30k_configs_are_cased_and_train_in_auto_precision():
    for pair in ("en_de", "de_en", "en_fr"):
        raw = yaml.safe_load((ROOT / "configs" / f"multi30k_{pair}.yaml").read_text())
        assert raw["data"].get("lowercase", False) is False, pair
        assert raw["train"].get("precision", "auto") == "auto", pair
        assert Config.load(ROOT / "configs" / f"multi30k_{pair}.yaml").train.precision == "auto"
        # German sources are recased, English ones lowercased (docs/multi30k.md measured both on German)
        assert raw["decode"]["input_case"] == ("truecase" if pair == "de_en" else "normalize"), pair


# ----------------------------------------------------------------------------------------------------------------------
# sacreBLEU and tokenised references


def test_tokenized_references_are_recognised():
    raw = ["Zwei junge Männer sind im Freien.", "Ein Mann, der Gitarre spielt.", "L'homme dit : « Oui ! »"]
    assert tokenized_evidence(raw) is None  # French spaces before : ! ? ; are typography, not tokenisation
    tokenized = ["zwei junge männer sind im freien .", "ein mann , der gitarre spielt .", "L'homme dit : « Oui ! »"]
    expected = "2 of 3 lines have a space before '.' or ',' or a Moses escape such as &apos;"
    assert tokenized_evidence(tokenized) == expected
    assert tokenized_evidence(["it &apos;s a dog", "the dog &apos;s ball", "a dog ."]) is not None
    assert tokenized_evidence([]) is None


def test_evaluate_refuses_tokenized_references_before_translating(tmp_path):
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp.write_text("Ein Mann fährt.\nZwei Hunde.\n", encoding="utf-8")
    ref.write_text("ein mann fährt .\nzwei hunde .\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "transduce.cli", "evaluate", "--hyp", str(hyp), "--ref", str(ref)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0 and done.stdout == ""
    assert f"{ref}: the references look tokenised (2 of 2 lines have a space before '.' or ','" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    forced = subprocess.run([*cmd, "--force"], capture_output=True, text=True)
    assert forced.returncode == 0 and forced.stdout.startswith("BLEU = ")
