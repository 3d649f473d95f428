"""A prepared directory's identity: its ``manifest.json`` (format, version, options, the checksums of its inputs),
written last when a preparation is complete, and compared with a new preparation's to reuse or refuse the earlier
one. Every task's preparation (translation, classification, masked-LM text, treebanks) writes and checks it here."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from transduce.data.binary import MANIFEST_FILE
from transduce.data.output import install, read_json, write_json
from transduce.errors import DataError
from transduce.text.textio import sha256_file

log = logging.getLogger(__name__)

FORMAT, VERSION = "transduce-prepared", 1


def file_record(path: Path) -> dict[str, Any]:
    """A corpus file's identity in the manifest: its path, size and SHA-256 (what :func:`earlier_preparation`
    compares)."""
    return {"path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _fingerprint(manifest: dict[str, Any]) -> tuple:
    """What must match for an earlier preparation to be reused: format version, options, inputs (how each corpus is
    read and the checksums of its files)."""
    inputs = {
        split: tuple(
            (
                record.get("format", "files"),
                tuple(record.get("fields", ())),
                record.get("lang", ""),
                record.get("lang_field", ""),
                *(record[side]["sha256"] for side in ("src", "tgt")),
            )
            for record in split_record.get("parts", [split_record])
        )
        for split, split_record in manifest["inputs"].items()
    }
    return manifest.get("version", VERSION), manifest["options"], inputs


def install_prepared(tmp: Path, out_dir: Path, manifest: dict[str, Any], started: float) -> None:
    """Complete a preparation built in ``tmp``: its time since ``started`` and the manifest (written last: its
    presence marks a complete directory), then ``tmp`` renamed to ``out_dir``."""
    manifest["seconds"] = round(time.perf_counter() - started, 2)
    write_json(tmp / MANIFEST_FILE, manifest)
    install(tmp, out_dir)


def earlier_preparation(
    out_dir: Path, options: dict[str, Any], inputs: dict[str, Any], *, force: bool
) -> dict[str, Any] | None:
    """The manifest of an earlier preparation in ``out_dir`` from the same ``inputs`` and ``options``, to reuse;
    ``None`` where there is none or ``force`` replaces it.

    Raises:
        DataError: ``out_dir`` holds a preparation from other inputs or options (and not ``force``), or something
            that is not a prepared directory.
    """
    existing = _existing_manifest(out_dir)
    if existing is None or force:
        return None
    if _fingerprint(existing) == _fingerprint({"options": options, "inputs": inputs}):
        log.info("%s already holds this preparation (same inputs and options); reusing it", out_dir)
        return existing
    raise DataError(f"{out_dir} was prepared from other inputs or options; use --force to replace it")


def _existing_manifest(out_dir: Path) -> dict[str, Any] | None:
    """The manifest of a complete earlier preparation in ``out_dir``, ``None`` if there is nothing there.

    Raises:
        DataError: ``out_dir`` is a non-empty directory (or a file) that is not a prepared directory.
    """
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        return None
    if (out_dir / MANIFEST_FILE).is_file():
        manifest = read_json(out_dir / MANIFEST_FILE)
        if manifest.get("format") == FORMAT and all(
            (out_dir / name).is_file() for info in manifest["splits"].values() for name in info["files"].values()
        ):
            return manifest
    raise DataError(f"{out_dir} exists and is not a prepared directory; refusing to overwrite it")
