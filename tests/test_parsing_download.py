"""`transduce download ptb-sample` against an archive served from a temporary directory on 127.0.0.1."""

from __future__ import annotations

import zipfile

import pytest

from httpkit import serve_directory
from transduce.cli import main
from transduce.data.download import DownloadError, download
from transduce.parsing.trees import read_treebank

FILES = {
    "treebank/combined/wsj_0002.mrg": "( (S (NP-SBJ (NNP Mr.) (NNP Vinken)) (VP (VBZ is)) (. .)) )\n",
    "treebank/combined/wsj_0001.mrg": "( (S (NP-SBJ (-NONE- *)) (VP (VB Join)) (. .)) )\n",
    "treebank/tagged/wsj_0001.pos": "[ Join/VB ]\n",
}


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    with zipfile.ZipFile(root / "treebank.zip", "w") as archive:
        for name, text in FILES.items():
            archive.writestr(name, text)
    (root / "bad").mkdir()
    (root / "bad" / "treebank.zip").write_bytes(b"<html>not found</html>")
    with serve_directory(root) as url:
        yield url


def test_download_ptb_sample_fetches_and_unpacks_the_mrg_files(server, tmp_path):
    out = tmp_path / "ptb"
    paths = download("ptb-sample", out, base_url=server)
    assert [p.relative_to(out).as_posix() for p in paths] == [
        "treebank.zip", "treebank/combined/wsj_0001.mrg", "treebank/combined/wsj_0002.mrg",
    ]  # fmt: skip
    assert paths[2].read_text(encoding="utf-8") == FILES["treebank/combined/wsj_0002.mrg"]
    for spec in (out / "treebank.zip", out / "treebank" / "combined"):
        assert [t.to_string() for t in read_treebank(f"{spec}:wsj_0002-wsj_0002")] == [
            "(S (NP (NNP Mr.) (NNP Vinken)) (VP (VBZ is)) (. .))"
        ]
    (out / "treebank.zip").write_bytes((tmp_path / "served" / "treebank.zip").read_bytes())
    assert download("ptb-sample", out, base_url=server + "/missing") == paths  # kept: nothing fetched


def test_download_ptb_sample_errors(server, tmp_path, capsys):
    with pytest.raises(DownloadError, match=r"treebank.zip: not a zip archive \(removed; download it again\)"):
        download("ptb-sample", tmp_path / "a", base_url=server + "/bad")
    assert not (tmp_path / "a" / "treebank.zip").exists()
    with pytest.raises(DownloadError, match="ptb-sample is English only"):
        download("ptb-sample", tmp_path / "a", langs=("en",), base_url=server)
    assert main(["download", "ptb-sample", str(tmp_path / "b"), "--base-url", server + "/missing"]) == 2
    assert "treebank.zip: download failed" in capsys.readouterr().err
    assert main(["download", "ptb-sample", str(tmp_path / "b"), "--base-url", server]) == 0
    assert (tmp_path / "b" / "treebank" / "combined" / "wsj_0001.mrg").is_file()
