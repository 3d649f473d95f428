"""The quickstart's corpus generator, and the quickstart + report path end to end on a tiny budget."""

import datetime as dt
import json

import pytest

from transduce.cli import main
from transduce.data.quickstart import (
    make_pairs,
    number_words,
    ordinal_suffix,
    ordinal_words,
    surface_forms,
    write_corpus,
    year_words,
)
from transduce.training.report import evaluate_run, write_report


def test_number_and_date_words():
    assert [number_words(n) for n in (7, 13, 40, 99)] == ["seven", "thirteen", "forty", "ninety-nine"]
    assert [ordinal_words(n) for n in (1, 2, 3, 12, 20, 21, 30, 31)] == [
        "first", "second", "third", "twelfth", "twentieth", "twenty-first", "thirtieth", "thirty-first",
    ]  # fmt: skip
    assert [ordinal_suffix(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd",
    ]  # fmt: skip
    assert year_words(1998) == "nineteen ninety-eight"
    assert year_words(2005) == "two thousand five" and year_words(2000) == "two thousand"
    assert year_words(1907) == "nineteen oh seven" and year_words(1900) == "nineteen hundred"
    assert year_words(2031) == "twenty thirty-one"


def test_surface_forms_name_the_right_weekday_and_two_digit_years_only_when_unambiguous():
    forms = surface_forms(dt.date(2026, 11, 21))
    assert "Saturday, November 21, 2026" in forms and "11/21/26" in forms
    assert "the twenty-first of november, twenty twenty-six" in forms
    assert not any("/99" in f for f in surface_forms(dt.date(1899 + 200, 1, 1)))  # 2099: four digits only


def test_corpus_is_deterministic_and_held_out_pairs_are_unseen(tmp_path):
    assert make_pairs(50, seed=3) == make_pairs(50, seed=3) != make_pairs(50, seed=4)
    write_corpus(tmp_path, train=2000, valid=100, test=200, seed=5)
    read = lambda name: (tmp_path / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    train = set(zip(read("train.date"), read("train.iso")))
    test = list(zip(read("test.date"), read("test.iso")))
    assert len(read("train.date")) == 2000 and len(test) == 200 and len(read("valid.iso")) == 100
    assert not train & set(test)
    for source, target in test:
        year, month, day = map(int, target.split("-"))
        assert source in surface_forms(dt.date(year, month, day))


@pytest.mark.slow
def test_quickstart_then_report_end_to_end(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", "-o", str(out), "--minutes", "0.05", "--train-pairs", "1500", "--test-pairs", "40"]) == 0
    printed = capsys.readouterr().out
    assert "exact match" in printed and "BLEU" in printed and "nrefs:1|case:mixed" in printed
    result = json.loads((out / "results.json").read_text())
    assert result["test_sentences"] == 40 and 0.0 <= result["exact_match"] <= 1.0
    for png in ("attention.png", "training_curves.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    scores = evaluate_run(out / "run", beam=1)
    assert set(scores["sets"]) == {"valid", "test"}
    test = scores["sets"]["test"]
    assert test["sentences"] == 40 and "tok:13a" in test["bleu_signature"]
    assert "lowercase+moses-tok" in test["bleu_lc_tok_signature"]
    assert len((out / "run" / "eval" / "test.hyp.iso").read_text(encoding="utf-8").splitlines()) == 40
    page = write_report(out / "run").read_text(encoding="utf-8")
    assert "sacreBLEU (cased, detokenised)" in page and "lowercased, Moses-tokenised" in page
    assert page.count("<tr><td>") >= 2 + 12  # two score rows, twelve sample rows
    assert page.count("data:image/png;base64,") == 1 + 3  # curves, three attention maps
    assert "http://" not in page and "https://" not in page  # self-contained
