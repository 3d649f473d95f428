"""Translator tests: exact output of a trained reversal model, order and count preserved through sorting and
batching, empty / long / emoji / accented lines, n-best lists, threads, loading a checkpoint, reading input."""

from __future__ import annotations

import logging
import random
import threading

import pytest
import torch

from decodekit import ALPHABET, CharTokenizer, make_checkpoint, one_thread, reversal_model
from transduce.config import ConfigError, DecodeConfig, ModelConfig
from transduce.errors import DataError
from transduce.model import Transformer
from transduce.search.translator import Translation, Translator, read_source_lines


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def translator() -> Translator:
    return Translator(reversal_model(), CharTokenizer())


def random_words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8))) for _ in range(n)]


@pytest.mark.slow
def test_trained_model_translates_exactly_in_input_order(translator):
    sentences = random_words(random.Random(1), 60)
    expected = [s[::-1] for s in sentences]
    assert translator.translate(sentences) == expected
    assert translator.translate(sentences, beam=1) == expected
    # a tiny token budget forces many batches; sorting by length must not change the order
    assert translator.translate(sentences, max_tokens=40) == expected


@pytest.mark.slow
def test_empty_blank_emoji_and_accented_lines_keep_count_and_order(translator):
    sentences = ["abc", "", "   ", "ab😀c", "déf", "hgf", "é", "🙂🙂"]
    out = translator.translate(sentences)
    assert len(out) == len(sentences)
    assert out[0] == "cba" and out[5] == "fgh"
    assert out[1] == out[2] == ""
    assert all("\n" not in t for t in out)


@pytest.mark.slow
def test_long_line_is_split_joined_and_warned(caplog):
    translator = Translator(reversal_model(), CharTokenizer(), max_input_tokens=8)
    with caplog.at_level(logging.WARNING, logger="transduce.search.translator"):
        out = translator.translate(["abc", "abcdefgh" * 3 + "ab", "hg"])
    assert out == ["cba", "hgfedcba hgfedcba hgfedcba ba", "gh"]
    assert "line 2: 26 source tokens exceed max_input_tokens=8; translated in 4 pieces" in caplog.text


def test_split_prefers_sentence_ends():
    tok = CharTokenizer("abcdefgh.")
    model = Transformer(ModelConfig.preset("test", src_vocab_size=13, tgt_vocab_size=13))
    tr = Translator(model, tok, max_input_tokens=8)
    ids = tok.encode_src("abcde.fghabcd.ef")
    parts = tr._split(ids)
    assert ["".join(tok.src_pieces(p)) for p in parts] == ["abcde.", "fghabcd.", "ef"]
    no_punct = tok.encode_src("a" * 20)
    assert [len(p) for p in tr._split(no_punct)] == [8, 8, 4]


@pytest.mark.slow
def test_nbest_lists_with_scores(translator):
    result = translator.translate_nbest(["abc", "", "hgfe"], nbest=3)
    assert [len(r) for r in result] == [3, 1, 3]
    assert result[0][0].text == "cba" and result[2][0].text == "efgh"
    assert result[1] == [Translation("", 0.0, 0.0)]
    for r in (result[0], result[2]):
        assert [t.score for t in r] == sorted((t.score for t in r), reverse=True)
        assert len({t.text for t in r}) == 3
    assert translator.translate_nbest(["abc"], nbest=4, beam=2)[0].__len__() == 4  # beam widened to nbest


def test_unknown_decode_option_is_rejected():
    tr = Translator(Transformer(ModelConfig.preset("test", src_vocab_size=12, tgt_vocab_size=12)), CharTokenizer())
    with pytest.raises(ConfigError, match="length_penalty"):
        tr.translate(["abc"], length_penaly=1.0)


def test_translator_puts_model_in_eval_mode_and_uses_its_config():
    model = Transformer(ModelConfig.preset("test", src_vocab_size=12, tgt_vocab_size=12)).train()
    tr = Translator(model, CharTokenizer(), DecodeConfig(beam=2, max_len_b=3))
    assert not tr.model.training and tr.decode.beam == 2
    assert len(tr.translate(["abc", "de"])) == 2


@pytest.mark.slow
def test_threads_share_one_translator(translator):
    batches = [random_words(random.Random(seed), 12) for seed in range(4)]
    expected = [translator.translate(b) for b in batches]
    results: list[list[str] | None] = [None] * len(batches)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with one_thread():
                for _ in range(2):
                    results[i] = translator.translate(batches[i])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == expected


def test_load_from_checkpoint(tmp_path):
    path = make_checkpoint(tmp_path)
    tr = Translator.load(path)
    assert tr.decode.max_len_b == 5  # the run's decode config
    lines = ["a man rides the bike.", "", "café 😀 Ünïcode", "x" * 1500, "ein Hund."]
    out = tr.translate(lines)
    assert len(out) == 5 and out[1] == "" and all("\n" not in t for t in out)
    assert tr.translate(lines[4:]) == out[4:]  # batch composition does not change a translation
    torch.testing.assert_close(
        tr.model.output.weight, Translator.load(tmp_path / "model").model.output.weight
    )  # deterministic load


def test_read_source_lines_strict_and_replace(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"ok\n\xffbad\r\n\nlast")
    with pytest.raises(DataError, match=r"line 2: not valid UTF-8.*--replace-invalid"):
        list(read_source_lines(path))
    assert list(read_source_lines(path, replace_invalid=True)) == [(1, "ok"), (2, "\ufffdbad"), (3, ""), (4, "last")]
