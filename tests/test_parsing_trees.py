"""Treebank reading and the standard preprocessing, on hand-written trees and on the Penn Treebank sample."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import pytest

from transduce.errors import DataError
from transduce.parsing.trees import Tree, parse_trees, preprocess, read_treebank, split_spec, strip_label

PTB = Path(__file__).parents[2] / "shared" / "data" / "ptb_sample" / "wsj_0001-0169.mrg.tar.gz"

RAW = """
( (S
    (NP-SBJ-1 (DT The) (NN cat) )
    (VP (VBD was)
      (VP (VBN seen)
        (NP (-NONE- *-1) )
        (PP-LOC (IN on)
          (NP (DT the) (NN mat) ))))
    (. .) ))
( (S (NP-SBJ (PRP It)) (VP (VBZ is) (ADJP-PRD (JJ big))) (. .)) )
"""


def test_parse_trees_reads_every_tree_as_written():
    trees = list(parse_trees(RAW))
    assert len(trees) == 2
    assert trees[0].label == "" and trees[0].children[0].label == "S"
    assert trees[0].words() == ["The", "cat", "was", "seen", "*-1", "on", "the", "mat", "."]
    assert trees[1].to_string() == "( (S (NP-SBJ (PRP It)) (VP (VBZ is) (ADJP-PRD (JJ big))) (. .)))"


def test_preprocess_removes_empty_elements_function_tags_and_the_empty_root():
    tree = preprocess(next(parse_trees(RAW)))
    assert tree is not None
    # the trace and the NP it leaves empty are gone; NP-SBJ-1 -> NP, PP-LOC -> PP; the root label "" is dropped
    assert tree.to_string() == (
        "(S (NP (DT The) (NN cat)) (VP (VBD was) (VP (VBN seen) (PP (IN on) (NP (DT the) (NN mat))))) (. .))"
    )
    assert tree.tags() == ["DT", "NN", "VBD", "VBN", "IN", "DT", "NN", "."]


def test_preprocess_keeps_unary_chains_and_removes_nested_empties():
    raw = "( (S (S-TPC-2 (NP (-NONE- *)) (VP (-NONE- *T*))) (NP=3 (NP (NNP John))) (VP (VBD left)) (. .)))"
    tree = preprocess(next(parse_trees(raw)))
    assert tree.to_string() == "(S (NP (NP (NNP John))) (VP (VBD left)) (. .))"


def test_preprocess_of_a_tree_without_words_is_none():
    assert preprocess(next(parse_trees("( (S (NP (-NONE- *)) ))"))) is None


def test_a_root_with_several_children_becomes_top():
    tree = preprocess(next(parse_trees("( (NP (NN a)) (. .) )")))
    assert tree.to_string() == "(TOP (NP (NN a)) (. .))"


@pytest.mark.parametrize(
    ("label", "stripped"),
    [("NP-SBJ-1", "NP"), ("NP=2", "NP"), ("PP-LOC-CLR", "PP"), ("-LRB-", "-LRB-"), ("-NONE-", "-NONE-"), ("S", "S")],
)
def test_strip_label(label, stripped):
    assert strip_label(label) == stripped


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("(S (NP (DT a))", r"1 bracket\(s\) not closed"),
        ("(S (NP (DT a))))", r"<string>:1: '\)' closes no bracket"),
        ("word (S (DT a))", r"<string>:1: 'word' outside any bracket"),
        ("(S\n (NP))", r"<string>:2: a bracket without children"),
    ],
)
def test_malformed_text_is_an_error_naming_the_line(text, message):
    with pytest.raises(DataError, match=message):
        list(parse_trees(text))


def _write_mrg(directory: Path) -> dict[str, str]:
    files = {
        "wsj_0001.mrg": "( (S (NP (NN a)) (VP (VBZ is))) )\n",
        "wsj_0002.mrg": "( (S (NP (NN b)) (VP (VBZ is))) )\n( (NP (NN c)) )\n",
        "wsj_0003.mrg": "( (S (NP (NN d)) (VP (VBZ is))) )\n",
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return files


def test_read_treebank_from_a_directory_a_tar_gz_and_a_zip_with_a_file_range(tmp_path):
    files = _write_mrg(tmp_path / "combined")
    with tarfile.open(tmp_path / "tb.tar.gz", "w:gz") as tar:
        for name in files:
            tar.add(tmp_path / "combined" / name, arcname=f"treebank/combined/{name}")
    with zipfile.ZipFile(tmp_path / "tb.zip", "w") as archive:
        for name, text in files.items():
            archive.writestr(f"treebank/combined/{name}", text)
    for source in ("combined", "tb.tar.gz", "tb.zip"):
        words = [t.words() for t in read_treebank(f"{tmp_path / source}:wsj_0002-wsj_0003")]
        assert words == [["b", "is"], ["c"], ["d", "is"]], source
        assert len(read_treebank(tmp_path / source)) == 4
    assert [t.words() for t in read_treebank(tmp_path / "combined" / "wsj_0001.mrg")] == [["a", "is"]]
    with pytest.raises(DataError, match=r"no \.mrg files from wsj_0100 to wsj_0200"):
        read_treebank(f"{tmp_path / 'tb.zip'}:wsj_0100-wsj_0200")
    with pytest.raises(DataError, match="treebank not found"):
        read_treebank(tmp_path / "missing.tar.gz")


def test_split_spec():
    assert split_spec("a/b.tar.gz:wsj_0001-wsj_0139") == (Path("a/b.tar.gz"), "wsj_0001", "wsj_0139")
    assert split_spec("a/b.tar.gz:wsj_0007") == (Path("a/b.tar.gz"), "wsj_0007", "wsj_0007")
    assert split_spec("a/b.mrg") == (Path("a/b.mrg"), "", "")


def test_tree_equality_and_copy_semantics():
    a = Tree("S", [Tree("NN", ["x"])])
    assert a == Tree("S", [Tree("NN", ["x"])]) and a != Tree("S", [Tree("NNS", ["x"])])


@pytest.mark.shared
def test_the_ptb_sample_split_has_the_documented_sizes():
    if not PTB.exists():
        pytest.skip(f"{PTB} not found (../shared beside the checkout)")
    train = read_treebank(f"{PTB}:wsj_0001-wsj_0139")
    dev = read_treebank(f"{PTB}:wsj_0140-wsj_0169")
    assert (len(train), len(dev)) == (3068, 433)
    for tree in train + dev:
        for node in tree.subtrees():
            assert node.children, node
            assert node.label != "-NONE-" and ("-" not in node.label or node.label.startswith("-"))
