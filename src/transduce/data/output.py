"""Atomic output directories: build in a hidden temporary directory beside the target, then rename.

An interrupted run leaves at most a hidden ``.NAME.tmp-PID-XXXX`` directory, never a half-written ``NAME``; the
next run on the same target deletes such leftovers once their process is gone. Replacing an earlier directory
moves it aside (``.NAME.old-PID-XXXX``), renames the new one into place, then deletes the old one.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from transduce.errors import DataError

log = logging.getLogger(__name__)


def make_temp_dir(out_dir: Path) -> Path:
    """A new hidden directory beside ``out_dir`` (same file system, so the final rename is atomic)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{os.getpid()}-", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result gets the usual permissions
    return tmp


def install(tmp: Path, out_dir: Path) -> None:
    """Move the finished ``tmp`` to ``out_dir``; an earlier directory there is moved aside, then deleted."""
    if out_dir.exists() and any(out_dir.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-{os.getpid()}-", dir=out_dir.parent))
        os.replace(out_dir, old / "old")
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)  # atomic; also replaces an empty directory


def remove_stale(out_dir: Path) -> None:
    """Delete temporary directories of earlier runs on ``out_dir`` whose process no longer exists."""
    for name in glob.glob(f".{glob.escape(out_dir.name)}.*-*-*", root_dir=out_dir.parent):
        kind, _, rest = name[len(out_dir.name) + 2 :].partition("-")
        pid = rest.partition("-")[0]
        if kind in ("tmp", "old") and pid.isdigit() and not _alive(int(pid)):
            log.info("removing %s left by an interrupted run", out_dir.parent / name)
            shutil.rmtree(out_dir.parent / name, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def read_json(path: Path, *, missing_hint: str = "") -> dict[str, Any]:
    """A JSON file's content.

    Args:
        missing_hint: what to do when the file is missing, added to that message in parentheses.

    Raises:
        DataError: naming the file: not found, not readable or not valid JSON.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: file not found" + (f" ({missing_hint})" if missing_hint else "")) from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
