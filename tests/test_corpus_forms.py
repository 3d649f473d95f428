"""Corpora as users have them: TSV, JSON Lines and two explicit files prepare to exactly what the prefix form gives,
and every malformed line is a one-line error naming the file and line, before any work."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from test_data_prepare import config, toy_pairs, write
from transduce.cli import main
from transduce.data import ParallelDataset, prepare
from transduce.data.corpus import Corpus, parse_jsonl, read_corpus, resolve_corpus, split_tsv
from transduce.errors import DataError
from transduce.training.validate import read_references

FIELDS = ("src", "tgt")


def write_tsv(path: Path, src: list[str], tgt: list[str]) -> str:
    data = "".join(f"{s}\t{t}\n" for s, t in zip(src, tgt)).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return str(path)


def write_jsonl(path: Path, src: list[str], tgt: list[str], fields: tuple[str, str] = FIELDS) -> str:
    def obj(s: str, t: str) -> dict:
        out: dict = {"id": 7}
        for name, value in zip(fields, (s, t)):
            *parents, leaf = name.split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out

    path.write_text("".join(json.dumps(obj(s, t), ensure_ascii=False) + "\n" for s, t in zip(src, tgt)), "utf-8")
    return str(path)


def arrays(directory: Path, split: str) -> list[tuple[list[int], list[int]]]:
    data = ParallelDataset(directory, split)
    return [(s.tolist(), t.tolist()) for s, t in (data[i] for i in range(len(data)))]


# ----------------------------------------------------------------------------------------------------------------------
# the line readers


def test_tsv_lines_need_exactly_one_tab():
    assert split_tsv(b"a b\tc d", "x.tsv", 1) == (b"a b", b"c d")
    assert split_tsv(b"\t", "x.tsv", 1) == (b"", b"")  # both sides empty: cleaning counts it, as for two files
    with pytest.raises(DataError, match=r"^x.tsv, line 3: expected source<TAB>target \(one tab\), found no tab$"):
        split_tsv(b"a b c", "x.tsv", 3)
    with pytest.raises(DataError, match=r"^x.tsv, line 4: expected source<TAB>target \(one tab\), found 2 tabs$"):
        split_tsv(b"a\tb\tc", "x.tsv", 4)


def test_jsonl_lines_fields_nesting_and_errors():
    assert parse_jsonl(b'{"src": "a", "tgt": "b", "x": 1}', "d.jsonl", 1, FIELDS) == (b"a", b"b")
    line = '{"translation": {"en": "a\\nb", "de": "caf\u00e9"}}'.encode()
    assert parse_jsonl(line, "d.jsonl", 1, ("translation.en", "translation.de")) == (b"a b", "café".encode())
    assert parse_jsonl(b'{"src": "\xff", "tgt": "b"}', "d.jsonl", 1, FIELDS) == (b"\xff", b"b")  # for decode_line
    cases = [
        (b'{"src": "a", "tgt": "b"', "d.jsonl, line 2: not valid JSON (Expecting ',' delimiter at column 24); JSON "
                                     "Lines needs one object per line"),
        (b"", "d.jsonl, line 2: not valid JSON (an empty line); JSON Lines needs one object per line"),
        (b'["a", "b"]', "d.jsonl, line 2: expected a JSON object, got an array"),
        (b'{"source": "a", "tgt": "b"}', "d.jsonl, line 2: no field 'src' for the source (found: 'source', 'tgt'); "
                                         "--src-field names another"),
        (b'{"src": "a", "target": "b"}', "d.jsonl, line 2: no field 'tgt' for the target (found: 'src', 'target'); "
                                         "--tgt-field names another"),
        (b'{"src": "a", "tgt": 5}', "d.jsonl, line 2: field 'tgt' must be a string, got a number"),
        (b'{"src": null, "tgt": "b"}', "d.jsonl, line 2: field 'src' must be a string, got null"),
    ]  # fmt: skip
    for raw, message in cases:
        with pytest.raises(DataError) as info:
            parse_jsonl(raw, "d.jsonl", 2, FIELDS)
        assert str(info.value) == message
    with pytest.raises(DataError, match=r"no field 'translation.fr' for the target \(found: 'en', 'de'\)"):
        parse_jsonl(line, "d.jsonl", 1, ("translation.en", "translation.fr"))


def test_resolve_corpus_forms(tmp_path):
    prefix = write(tmp_path, "train", ["a"], ["b"])
    assert resolve_corpus(prefix, "en", "de", FIELDS) == Corpus("files", Path(prefix + ".en"), Path(prefix + ".de"))
    tsv = write_tsv(tmp_path / "t.tsv.gz", ["a"], ["b"])
    assert resolve_corpus(tsv, "en", "de", FIELDS) == Corpus("tsv", Path(tsv), Path(tsv))
    js = write_jsonl(tmp_path / "t.jsonl", ["a"], ["b"])
    assert resolve_corpus(js, "en", "de", ("x", "y")) == Corpus("jsonl", Path(js), Path(js), ("x", "y"))
    pair = [prefix + ".en", prefix + ".de"]
    assert resolve_corpus(pair, "xx", "yy", FIELDS) == Corpus("files", Path(pair[0]), Path(pair[1]))
    with pytest.raises(DataError, match=r"missing.tsv: file not found$"):
        resolve_corpus(str(tmp_path / "missing.tsv"), "en", "de", FIELDS)
    with pytest.raises(DataError, match=r"nope.de: file not found$"):
        resolve_corpus([pair[0], str(tmp_path / "nope.de")], "en", "de", FIELDS)
    assert read_corpus(resolve_corpus(tsv, "en", "de", FIELDS)) == (["a"], ["b"])


# ----------------------------------------------------------------------------------------------------------------------
# preparation: every form gives the prefix form's output


@pytest.mark.parametrize("form", ["tsv", "tsv.gz", "jsonl", "jsonl-nested", "files"])
def test_every_form_prepares_what_the_prefix_form_prepares(tmp_path, form):
    src, tgt = toy_pairs(300)
    src[5], tgt[9] = "", "   "  # dropped from training, kept in validation, by the same rules
    v_src, v_tgt = toy_pairs(20, seed=1)
    v_src[3] = ""
    reference = tmp_path / "reference"
    (tmp_path / "p").mkdir()
    prepare(config(write(tmp_path / "p", "train", src, tgt), valid=write(tmp_path / "p", "valid", v_src, v_tgt)),
            reference)  # fmt: skip
    options: dict = {}
    sets = (("train", src, tgt), ("valid", v_src, v_tgt))
    if form.startswith("tsv"):
        train, valid = (write_tsv(tmp_path / f"{name}.{form}", s, t) for name, s, t in sets)
    elif form.startswith("jsonl"):
        fields = ("translation.en", "translation.de") if form == "jsonl-nested" else FIELDS
        train, valid = (write_jsonl(tmp_path / f"{name}.jsonl", s, t, fields) for name, s, t in sets)
        options = dict(src_field=fields[0], tgt_field=fields[1])
    else:
        train, valid = ([f"{tmp_path}/p/{name}.en", f"{tmp_path}/p/{name}.de"] for name, _, _ in sets)
    out = tmp_path / "out"
    manifest = prepare(config(train, valid=valid, **options), out)
    assert manifest["inputs"]["train"]["format"] == form.split(".")[0].split("-")[0]
    for split in ("train", "valid"):
        assert arrays(out, split) == arrays(reference, split)
        lines = ParallelDataset(reference, split).line_index
        np.testing.assert_array_equal(ParallelDataset(out, split).line_index, lines)
    assert manifest["splits"]["train"]["counts"]["empty"] == 2
    # validation BLEU reads the raw target side of the corpus, whatever its form
    from transduce.text.tokenizer import Tokenizer

    tok = Tokenizer.load(out)
    refs, kind = read_references(ParallelDataset(out, "valid"), tok)
    assert kind == "raw" and refs == [tok.normalise(t) for t in v_tgt]
    # the same inputs again: reused; other JSON fields: refused without --force
    assert prepare(config(train, valid=valid, **options), out)["created"] == manifest["created"]
    if form == "jsonl":
        with pytest.raises(DataError, match="was prepared from other inputs or options"):
            prepare(config(train, valid=valid, src_field="tgt", tgt_field="src"), out)


def test_malformed_lines_fail_before_any_work(tmp_path):
    src, tgt = toy_pairs(50)
    lines = [f"{s}\t{t}" for s, t in zip(src, tgt)]
    lines[40] = "no tab here"
    path = tmp_path / "train.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(DataError, match=rf"^{path}, line 41: expected source<TAB>target \(one tab\), found no tab$"):
        prepare(config(str(path)), out)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["train.tsv"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"src": "a b", "tgt": "c d"}\n{"src": "caf\xe9", "tgt": "x"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl, line 2: not valid UTF-8 \(byte 0xe9 at column 13\)"):
        prepare(config(str(bad)), out)


# ----------------------------------------------------------------------------------------------------------------------
# the command line


def test_prepare_cli_forms_and_errors(tmp_path, capsys):
    src, tgt = toy_pairs(200)
    tsv = write_tsv(tmp_path / "train.tsv", src, tgt)
    js = write_jsonl(tmp_path / "test_set.jsonl", src[:10], tgt[:10], ("en", "de"))
    prefix = write(tmp_path, "two", src, tgt)
    out = tmp_path / "out"
    argv = ["prepare", "--train", tsv, "--test", js, "--src-field", "en", "--tgt-field", "de", "--vocab-size", "300",
            "--workers", "1", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["splits"]) == ["train", "test_set"] and manifest["splits"]["test_set"]["pairs"] == 10
    assert manifest["inputs"]["test_set"]["fields"] == ["en", "de"]
    out2 = tmp_path / "out2"
    argv = ["prepare", "--src-file", f"{prefix}.en", "--tgt-file", f"{prefix}.de", "--vocab-size", "300",
            "--workers", "1", "--output", str(out2)]  # fmt: skip
    assert main(argv) == 0
    assert arrays(out2, "train") == arrays(out, "train")
    capsys.readouterr()
    assert main(["prepare", "--train", js, "--vocab-size", "300", "-o", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert err == (f"transduce prepare: error: {js}, line 1: no field 'src' for the source (found: 'id', 'en', 'de'); "
                   "--src-field names another\n")  # fmt: skip
    assert not (tmp_path / "o3").exists()


def test_one_side_of_a_corpus_file_is_read_in_whichever_form_it_has(tmp_path):
    from transduce.data.corpus import read_side

    src, tgt = ["a dog.", "", "café"], ["ein Hund.", "leer", "Café"]
    text = tmp_path / "test.en"
    text.write_text("".join(s + "\n" for s in src), encoding="utf-8")
    tsv = write_tsv(tmp_path / "test.tsv.gz", src, tgt)
    jsonl = write_jsonl(tmp_path / "test.jsonl", src, tgt, ("translation.en", "translation.de"))
    numbered = lambda lines: list(enumerate(lines, start=1))  # noqa: E731
    assert list(read_side(text, "source")) == list(read_side(text, "target")) == numbered(src)
    assert list(read_side(tsv, "source")) == numbered(src) and list(read_side(tsv, "target")) == numbered(tgt)
    assert list(read_side(jsonl, "target", "translation.de")) == numbered(tgt)
    # only the side read needs its field
    only_src = tmp_path / "only.jsonl"
    only_src.write_text('{"src": "a dog."}\n', encoding="utf-8")
    assert list(read_side(only_src, "source")) == [(1, "a dog.")]
    with pytest.raises(DataError, match=r"only.jsonl, line 1: no field 'tgt' for the target \(found: 'src'\); "
                       r"--tgt-field names another$"):  # fmt: skip
        list(read_side(only_src, "target"))
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"ok\tgut\nbad \xff\tschlecht\n")
    with pytest.raises(DataError, match=r"bad.tsv, line 2: not valid UTF-8 \(byte 0xff at column 5\); fix it$"):
        list(read_side(bad, "source", hint="fix it"))
    assert list(read_side(bad, "source", errors="replace")) == [(1, "ok"), (2, "bad \ufffd")]
