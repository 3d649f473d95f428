"""Fetch public datasets' raw files (for users with internet; tests serve local files over HTTP instead): Multi30k's
translation pairs, and the Penn Treebank sample that NLTK distributes (parsing).

Every file is written to a temporary name, checked (a gzip file must decompress completely) and then renamed, so an
interrupted download never leaves a truncated file under the final name, and a rerun fetches only what is missing.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from transduce.data.output import install, make_temp_dir
from transduce.errors import TransduceError

log = logging.getLogger(__name__)

#: Multi30k task 1 (https://github.com/multi30k/dataset), raw (untokenised, cased) text
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_SPLITS = {
    "train": ("en", "de", "fr", "cs"),
    "val": ("en", "de", "fr", "cs"),
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
}
DATASETS = ("multi30k", "ptb-sample")


class DownloadError(TransduceError):
    """A file could not be fetched or is damaged."""


def missing_corpus_hint(key: str, spec: str | list[str]) -> str:
    """What to add to the error about a missing corpus file of the data section's ``key`` (``data.train``) naming
    ``spec``: for the datasets :func:`download` fetches (the recipes read them from ``../shared/data``), how to get
    them and the override that points at them; else the key.

    Args:
        key: the dotted key (``data.train``, ``data.valid``, ``data.mix``, ``data.test``).
        spec: its value; for ``data.test``, the entry that is missing.
    """
    text = spec if isinstance(spec, str) else " ".join(spec)
    lowered = text.lower()
    if "multi30k" in lowered and isinstance(spec, str):
        dataset, what, target = "multi30k", "Multi30k", f"DIR/{Path(spec).name}"
    elif "ptb" in lowered or "treebank" in lowered or ".mrg" in lowered:
        span = text.rpartition(":")[2] if ":" in text else ""  # a treebank's FIRST-LAST file range, kept
        dataset, what, target = "ptb-sample", "the Penn Treebank sample", "DIR/treebank.zip" + (":" + span) * bool(span)
    else:
        return f" ({key})"
    value = f"[{target}]" if key == "data.test" else target
    return f"; get {what} with `transduce download {dataset} DIR` and point {key} at it: {key}={value}"


def multi30k_files(langs: tuple[str, ...] | None = None) -> list[str]:
    """File names of Multi30k task 1 in the given languages (all four when None)."""
    if langs:
        unknown = sorted(set(langs) - {"en", "de", "fr", "cs"})
        if unknown:
            raise DownloadError(f"Multi30k has no language {', '.join(unknown)} (valid: en, de, fr, cs)")
    return [
        f"{split}.{lang}.gz"
        for split, split_langs in MULTI30K_SPLITS.items()
        for lang in split_langs
        if not langs or lang in langs
    ]


def fetch(url: str, dest: Path, *, timeout: float = 60.0) -> None:
    """Download ``url`` to ``dest`` atomically; a ``.gz`` file is verified by decompressing it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    shutil.copyfileobj(response, out)
            except (urllib.error.URLError, OSError) as e:
                raise DownloadError(f"{url}: download failed: {getattr(e, 'reason', e)}") from None
        if dest.suffix == ".gz":
            try:
                with gzip.open(tmp, "rb") as f:
                    while f.read(1 << 20):
                        pass
            except (OSError, EOFError) as e:
                raise DownloadError(f"{url}: the downloaded file is not a complete gzip file ({e})") from None
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def download(
    dataset: str,
    directory: str | Path,
    *,
    langs: tuple[str, ...] | None = None,
    base_url: str | None = None,
    force: bool = False,
) -> list[Path]:
    """Fetch ``dataset``'s raw files into ``directory``; files already there are kept unless ``force``.

    Returns:
        the paths of all the dataset's files in ``directory``.
    """
    if dataset not in DATASETS:
        raise DownloadError(f"unknown dataset {dataset!r} (valid: {', '.join(DATASETS)})")
    if dataset == "ptb-sample":  # NLTK's Penn Treebank sample, for data.task: parse
        if langs:
            raise DownloadError("ptb-sample is English only: no languages to choose")
        return download_ptb_sample(directory, base_url=base_url, force=force)
    directory = Path(directory)
    base = (base_url or MULTI30K_URL).rstrip("/")
    paths = []
    for name in multi30k_files(langs):
        dest = directory / name
        if dest.exists() and not force:
            log.info("%s exists, kept", dest)
        else:
            log.info("fetching %s/%s", base, name)
            fetch(f"{base}/{name}", dest)
        paths.append(dest)
    return paths


#: NLTK's data packages; the treebank sample is corpora/treebank.zip under it
NLTK_DATA_URL = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora"
ARCHIVE = "treebank.zip"
MRG_DIR = Path("treebank") / "combined"


def download_ptb_sample(directory: str | Path, *, base_url: str | None = None, force: bool = False) -> list[Path]:
    """Fetch NLTK's treebank sample (``corpora/treebank.zip``, for ``data.task: parse``) into ``directory``: the
    archive, checked to be a zip holding ``.mrg`` files, and its bracketed files unpacked into
    ``DIR/treebank/combined/``. Either the archive or that directory is a treebank for ``data.task: parse``
    (``DIR/treebank.zip:wsj_0001-wsj_0139``, ``DIR/treebank/combined``).

    Returns:
        The archive's path and the unpacked ``.mrg`` files, in name order.

    Raises:
        DownloadError: the download fails or the file is not a zip archive of ``.mrg`` files.
    """
    directory = Path(directory)
    archive = directory / ARCHIVE
    if archive.exists() and not force:
        log.info("%s exists, kept", archive)
    else:
        url = f"{(base_url or NLTK_DATA_URL).rstrip('/')}/{ARCHIVE}"
        log.info("fetching %s", url)
        fetch(url, archive)
    try:
        with zipfile.ZipFile(archive) as zf:
            names = sorted((n for n in zf.namelist() if n.endswith(".mrg")), key=lambda n: Path(n).name)
            if not names:
                raise DownloadError(f"{archive}: the archive holds no .mrg files")
            out = directory / MRG_DIR
            tmp = make_temp_dir(out)  # unpacked beside it, then renamed into place (an earlier one replaced)
            try:
                for name in names:
                    (tmp / Path(name).name).write_bytes(zf.read(name))
                install(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except zipfile.BadZipFile:
        archive.unlink()
        raise DownloadError(f"{archive}: not a zip archive (removed; download it again)") from None
    log.info("%d .mrg files in %s", len(names), out)
    return [archive, *(out / Path(n).name for n in names)]
