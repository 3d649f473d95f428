"""``transduce download ptb-sample``: the Penn Treebank sample that NLTK distributes (``corpora/treebank.zip``).

The archive is fetched atomically (see :func:`transduce.download.fetch`), checked to be a zip holding ``.mrg``
files, and its bracketed files are unpacked into ``DIR/treebank/combined/``. Either the archive or that directory
is a treebank for ``data.task: parse`` (``DIR/treebank.zip:wsj_0001-wsj_0139``, ``DIR/treebank/combined``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

#: NLTK's data packages; the treebank sample is corpora/treebank.zip under it
NLTK_DATA_URL = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora"
ARCHIVE = "treebank.zip"
MRG_DIR = Path("treebank") / "combined"


def download_ptb_sample(directory: str | Path, *, base_url: str | None = None, force: bool = False) -> list[Path]:
    """Fetch NLTK's treebank sample into ``directory`` and unpack its ``.mrg`` files.

    Returns:
        The archive's path and the unpacked ``.mrg`` files, in name order.

    Raises:
        DownloadError: the download fails or the file is not a zip archive of ``.mrg`` files.
    """
    from transduce.download import DownloadError, fetch

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
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".combined-", dir=out.parent))
            try:
                for name in names:
                    (tmp / Path(name).name).write_bytes(zf.read(name))
                shutil.rmtree(out, ignore_errors=True)
                os.replace(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except zipfile.BadZipFile:
        archive.unlink()
        raise DownloadError(f"{archive}: not a zip archive (removed; download it again)") from None
    log.info("%d .mrg files in %s", len(names), out)
    return [archive, *(out / Path(n).name for n in names)]
