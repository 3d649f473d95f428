"""`transduce download` against files served from a temporary directory on 127.0.0.1 (no network)."""

import gzip

import pytest

from httpkit import serve_directory
from transduce.cli import main
from transduce.data.download import DownloadError, download, multi30k_files


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    for name in multi30k_files(("en", "de")):
        with gzip.open(root / name, "wt", encoding="utf-8") as f:
            f.write(f"{name} line 1\n{name} line 2\n")
    (root / "train.de.gz").write_bytes((root / "train.de.gz").read_bytes()[:-6])  # a truncated file
    with serve_directory(root) as url:
        yield root, url


def test_download_fetches_verifies_and_is_resumable(server, tmp_path):
    root, url = server
    out = tmp_path / "multi30k"
    with pytest.raises(DownloadError, match=r"train.de.gz: the downloaded file is not a complete gzip file"):
        download("multi30k", out, langs=("en", "de"), base_url=url)
    assert (out / "train.en.gz").exists()  # fetched before the damaged one
    assert not (out / "train.de.gz").exists() and not list(out.glob(".*"))  # nothing truncated or temporary left
    with gzip.open(root / "train.de.gz", "wt", encoding="utf-8") as f:  # the server is repaired
        f.write("Ein Hund.\n")
    (out / "train.en.gz").write_bytes(b"kept")  # an existing file is not fetched again
    paths = download("multi30k", out, langs=("en", "de"), base_url=url)
    assert [p.name for p in paths] == multi30k_files(("en", "de"))
    assert (out / "train.en.gz").read_bytes() == b"kept"
    assert gzip.decompress((out / "train.de.gz").read_bytes()) == b"Ein Hund.\n"
    assert gzip.decompress((out / "test_2016_flickr.en.gz").read_bytes()).startswith(b"test_2016_flickr.en.gz line 1")


def test_download_cli_and_errors(server, tmp_path, capsys):
    root, url = server
    (root / "train.de.gz").unlink()
    code = main(["download", "multi30k", str(tmp_path / "m"), "--langs", "en,de", "--base-url", url])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("transduce download: error: ") and "train.de.gz: download failed" in err
    assert main(["download", "multi30k", str(tmp_path / "m"), "--langs", "en", "--base-url", url]) == 0
    assert len(list((tmp_path / "m").glob("*.en.gz"))) == 5
    with pytest.raises(DownloadError, match="Multi30k has no language xx"):
        multi30k_files(("xx",))
