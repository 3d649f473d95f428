"""The package's top level: the main names importable from ``transduce`` (lazily), the version, and the
Translator's guard against a single string and its file method."""

from __future__ import annotations

import gzip
import subprocess
import sys

import pytest

import transduce
from decodekit import CharTokenizer, one_thread, reversal_model
from transduce.cli import main
from transduce.errors import DataError
from transduce.search.translator import Translator


@pytest.fixture(scope="module")
def translator() -> Translator:
    return Translator(reversal_model(), CharTokenizer())


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


def test_top_level_names_are_the_library_objects():
    from transduce.config import Config, DecodeConfig
    from transduce.data import prepare
    from transduce.search.evaluate import score
    from transduce.training.checkpoint import load_model

    assert transduce.Translator is Translator
    assert (transduce.Config, transduce.DecodeConfig) == (Config, DecodeConfig)
    assert (transduce.load_model, transduce.prepare, transduce.score) == (load_model, prepare, score)
    assert sorted(transduce.__all__) == sorted(["__version__", *transduce._EXPORTS]) == dir(transduce)
    for name in transduce.__all__:
        assert getattr(transduce, name) is not None
    with pytest.raises(AttributeError, match="module 'transduce' has no attribute 'Translater'"):
        _ = transduce.Translater


def test_import_transduce_does_not_import_torch():
    code = "import sys, transduce; assert 'torch' not in sys.modules; from transduce import Config; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"transduce {transduce.__version__}\n"


def test_version_is_the_installed_distribution():
    import importlib.metadata

    assert importlib.metadata.version("transduce") == transduce.__version__


@pytest.mark.parametrize("method", ["translate", "translate_nbest", "embed"])
def test_a_single_string_is_refused_not_translated_per_character(translator, method):
    kwargs = {"nbest": 1} if method == "translate_nbest" else {}
    with pytest.raises(TypeError) as info:
        getattr(translator, method)("abc", **kwargs)
    assert str(info.value) == (
        f"Translator.{method}() takes a list of sentences, got a single str; pass [text] (one sentence) or "
        "text.split('\\n') (one per line)"
    )
    assert getattr(translator, method)(["abc"], **kwargs)  # a list of one is fine


def test_translate_file_round_trip(translator, tmp_path):
    src = tmp_path / "in.txt.gz"
    lines = ["abc", "", "hgfe", "ab"]
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    out = tmp_path / "sub" / "out.txt"
    assert translator.translate_file(src, out, beam=2) == 4
    assert out.read_text(encoding="utf-8") == "cba\n\nefgh\nba\n"
    assert [p.name for p in out.parent.iterdir()] == ["out.txt"]  # no temporary left


def test_translate_file_bad_input_leaves_no_output(translator, tmp_path):
    src, out = tmp_path / "bad.txt", tmp_path / "out.txt"
    src.write_bytes(b"abc\n\xffab\n")
    with pytest.raises(DataError, match=r"bad.txt, line 2: not valid UTF-8 \(byte 0xff at column 1\)"):
        translator.translate_file(src, out)
    assert list(tmp_path.iterdir()) == [src]
    assert translator.translate_file(src, out, replace_invalid=True) == 2
    first, second, end = out.read_text(encoding="utf-8").split("\n")
    assert first == "cba" and second.startswith("ba") and end == ""  # U+FFFD is an unknown token to this model
