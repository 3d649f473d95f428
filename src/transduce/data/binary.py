"""The binarised corpus: token ids in flat memory-mapped arrays plus an offsets index.

For a split ``NAME`` the prepared directory holds five raw little-endian arrays (their dtype is in the manifest):

- ``NAME.src.bin``, ``NAME.tgt.bin``: the ids of all kept sentences, concatenated (``uint16`` when the vocabulary
  has at most 65,536 pieces, else ``uint32``); no bos/eos;
- ``NAME.src.idx``, ``NAME.tgt.idx``: ``int64`` offsets, one more than there are pairs; sentence ``i`` is
  ``bin[idx[i]:idx[i + 1]]``;
- ``NAME.line``: ``int64``, the 0-based line of each kept pair in the raw files (test sets keep every line, so
  there ``line[i] == i``).

Writing appends to these files chunk by chunk, so a corpus never has to fit in memory; reading maps them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from transduce.data.output import read_json
from transduce.errors import DataError

MANIFEST_FILE = "manifest.json"
MIX_SPLIT = "mix"  # the split of data.mix, the corpus mixed into training batches
SPLIT_SUFFIXES = ("src.bin", "tgt.bin", "src.idx", "tgt.idx", "line")


def ids_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a vocabulary of ``vocab_size`` pieces."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def split_files(split: str) -> dict[str, str]:
    """File names of one split, keyed by their suffix (``src.bin`` -> ``train.src.bin``)."""
    return {suffix: f"{split}.{suffix}" for suffix in SPLIT_SUFFIXES}


class SplitWriter:
    """Appends encoded pairs to the files of one split.

    Args:
        directory: the (temporary) output directory.
        split: the split name.
        dtype: dtype of the ids.
    """

    def __init__(self, directory: Path, split: str, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.pairs = 0
        self.src_tokens = 0
        self.tgt_tokens = 0
        names = split_files(split)
        self._files: dict[str, BinaryIO] = {k: open(directory / v, "wb") for k, v in names.items()}  # noqa: SIM115
        np.zeros(1, np.int64).tofile(self._files["src.idx"])
        np.zeros(1, np.int64).tofile(self._files["tgt.idx"])

    def append(
        self, lines: np.ndarray, src: np.ndarray, src_lens: np.ndarray, tgt: np.ndarray, tgt_lens: np.ndarray
    ) -> None:
        """Append pairs: 0-based line numbers, the flat ids of each side and their per-sentence lengths."""
        src.astype(self.dtype, copy=False).tofile(self._files["src.bin"])
        tgt.astype(self.dtype, copy=False).tofile(self._files["tgt.bin"])
        (self.src_tokens + np.cumsum(src_lens, dtype=np.int64)).tofile(self._files["src.idx"])
        (self.tgt_tokens + np.cumsum(tgt_lens, dtype=np.int64)).tofile(self._files["tgt.idx"])
        lines.astype(np.int64, copy=False).tofile(self._files["line"])
        self.pairs += len(lines)
        self.src_tokens += int(src_lens.sum())
        self.tgt_tokens += int(tgt_lens.sum())

    def close(self) -> dict[str, Any]:
        """Close the files; returns the split's entry for the manifest (without the cleaning counts)."""
        for f in self._files.values():
            f.close()
        return {"pairs": self.pairs, "src_tokens": self.src_tokens, "tgt_tokens": self.tgt_tokens}


def _map(path: Path, dtype: np.dtype | type) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{path}: file not found (prepared directory incomplete?)")
    if path.stat().st_size == 0:  # np.memmap refuses empty files
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def read_manifest(prepared_dir: str | Path) -> dict[str, Any]:
    """The manifest of a prepared directory.

    Raises:
        DataError: the directory or its manifest is missing or unreadable.
    """
    return read_json(Path(prepared_dir) / MANIFEST_FILE, missing_hint="run `transduce prepare` first")


class ParallelDataset:
    """One split of a prepared corpus, memory-mapped: ``dataset[i] -> (src_ids, tgt_ids)``.

    Ids are ``int64`` arrays without bos/eos. Only the lengths (two ``int32`` per pair) live in memory; the ids
    stay in the page cache. Picklable (for ``DataLoader`` workers): the maps are reopened after unpickling.

    Args:
        prepared_dir: a directory written by :func:`transduce.data.prepare`.
        split: ``"train"``, ``"valid"`` or a test set's name (see :meth:`splits`).

    Raises:
        DataError: unknown split or missing files.
    """

    def __init__(self, prepared_dir: str | Path, split: str) -> None:
        self.directory = Path(prepared_dir)
        self.split = split
        self.manifest = read_manifest(self.directory)
        splits = self.manifest.get("splits", {})
        if split not in splits:
            raise DataError(f"{self.directory}: no split {split!r} (available: {', '.join(splits) or 'none'})")
        self.info: dict[str, Any] = splits[split]
        self._open()

    def _open(self) -> None:
        dtype = np.dtype(self.manifest["dtype"])
        names = split_files(self.split)
        self._src = _map(self.directory / names["src.bin"], dtype)
        self._tgt = _map(self.directory / names["tgt.bin"], dtype)
        self._src_idx = _map(self.directory / names["src.idx"], np.int64)
        self._tgt_idx = _map(self.directory / names["tgt.idx"], np.int64)
        self._line = _map(self.directory / names["line"], np.int64)
        n = len(self._line)
        if len(self._src_idx) != n + 1 or len(self._tgt_idx) != n + 1 or n != self.info["pairs"]:
            raise DataError(f"{self.directory}: the files of split {self.split!r} are truncated or inconsistent")
        self._src_lengths: np.ndarray | None = None
        self._tgt_lengths: np.ndarray | None = None

    @staticmethod
    def splits(prepared_dir: str | Path) -> list[str]:
        """The split names of a prepared directory, in the order they were prepared."""
        return list(read_manifest(prepared_dir).get("splits", {}))

    def __len__(self) -> int:
        return len(self._line)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} out of range for {len(self)} pairs")
        i = int(i) % len(self)
        src = np.asarray(self._src[self._src_idx[i] : self._src_idx[i + 1]], dtype=np.int64)
        tgt = np.asarray(self._tgt[self._tgt_idx[i] : self._tgt_idx[i + 1]], dtype=np.int64)
        return src, tgt

    @property
    def src_lengths(self) -> np.ndarray:
        """Source lengths in subword tokens, bos/eos not counted; ``int32``, shape ``(len,)``."""
        if self._src_lengths is None:
            self._src_lengths = np.diff(self._src_idx).astype(np.int32)
        return self._src_lengths

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Target lengths in subword tokens, bos/eos not counted; ``int32``, shape ``(len,)``."""
        if self._tgt_lengths is None:
            self._tgt_lengths = np.diff(self._tgt_idx).astype(np.int32)
        return self._tgt_lengths

    @property
    def line_index(self) -> np.ndarray:
        """The 0-based line in the raw files of every pair (``int64``); ``arange(len)`` for test sets."""
        return self._line

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "split": self.split, "manifest": self.manifest, "info": self.info}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __repr__(self) -> str:
        return f"ParallelDataset({str(self.directory)!r}, {self.split!r}, pairs={len(self)})"
