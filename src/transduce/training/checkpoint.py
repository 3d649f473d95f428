"""Checkpoints: self-describing, written atomically, loaded without unpickling anything.

On-disk format (``FORMAT_VERSION`` 1)::

    RUN_DIR/
      config.yaml                   the resolved Config of the run
      vocab/                        copy of the tokenizer files: spm*.model, spm*.vocab, tokenizer.json
      metrics.jsonl  train.log      one JSON object per log/validation event; the human log
      checkpoints/
        step_00001000/              one checkpoint = one directory
          model.safetensors         weights (tied tensors stored once); metadata: format, config (JSON of the
                                    resolved Config), vocab_sha256, step
          trainer.pt                optimizer, schedule, step, RNG states, data position: tensors and plain types
                                    only, read with torch.load(weights_only=True); absent in inference checkpoints
          manifest.json             size and sha256 of every other file; written last, so its presence means
                                    the directory is complete
          vocab/                    only in standalone checkpoints (save_model, transduce average)
        last                        text file: name of the newest checkpoint directory
        best                        text file: name of the best checkpoint directory (by train.best_metric)

Atomicity: a checkpoint is written into a hidden temporary directory (``.tmp-*``) beside its final place, every file
is fsynced, then the directory is renamed into place with :func:`os.replace` and the parent is fsynced. The
pointer files are replaced the same way. A process killed at any moment therefore leaves either the old state or
the new one. A temporary directory is named after its writer (``.tmp-NAME-PID@HOST``); the next write into the
same directory sweeps only stale ones (their process is no longer alive on this host, or they were not touched for
:data:`STALE_TEMPORARY_S` seconds), never another live writer's work in progress (a ``transduce average`` beside a
training, two runs sharing a directory).

The vocabulary of a checkpoint is ``CKPT/vocab`` when present, else ``RUN_DIR/vocab``. Its identity is the sha256
of the SentencePiece ``*.model`` files and ``tokenizer.json``; loading checks it against the checkpoint's metadata.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model as _st_load_model
from safetensors.torch import save_model as _st_save_model

from transduce.config import Config, ConfigError
from transduce.errors import CheckpointError
from transduce.model import Transformer
from transduce.text.casing import TRUECASE_FILE
from transduce.text.textio import sha256_file

log = logging.getLogger(__name__)

FORMAT_VERSION = "1"
MODEL_FILE = "model.safetensors"
TRAINER_FILE = "trainer.pt"
MANIFEST_FILE = "manifest.json"
VOCAB_DIR = "vocab"
CHECKPOINTS_DIR = "checkpoints"
LAST, BEST = "last", "best"
# ours: SentencePiece *.model (+ derived *.vocab) and tokenizer.json; an imported Marian vocabulary (transduce.interop):
# source.spm / target.spm with vocab.json (and target_vocab.json) mapping pieces to the model's ids
# plus the source side's truecasing table (transduce.text.casing), which is not part of the vocabulary's identity
_VOCAB_PATTERNS = ("*.model", "*.vocab", "*.spm", "vocab.json", "target_vocab.json", "tokenizer.json", TRUECASE_FILE)
_VOCAB_IDENTITY = ("*.model", "*.spm", "vocab.json", "target_vocab.json", "tokenizer.json")  # not *.vocab: derived
#: A temporary checkpoint directory untouched for this long is taken for debris even when a process of its writer's id
#: is alive (process ids are reused; a writer on another host cannot be asked): a checkpoint is written in minutes.
STALE_TEMPORARY_S = 3600.0
_HOST = socket.gethostname()
_writing: set[Path] = set()  # this process's temporary directories being written (by any of its threads)
_writing_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint's metadata says about it (read without loading the weights)."""

    path: Path  # the checkpoint directory
    config: Config  # the resolved config the weights were trained with
    vocab_sha256: str  # identity of the vocabulary files
    step: int  # optimizer updates done; -1 for an averaged or imported model


# ----------------------------------------------------------------------------------------------------------------------
# vocabulary


def vocab_files(directory: str | Path) -> list[Path]:
    """The tokenizer files of a prepared (or vocab) directory, sorted by name."""
    directory = Path(directory)
    found = {p for pattern in _VOCAB_PATTERNS for p in directory.glob(pattern) if p.is_file()}
    return sorted(found)


def vocab_sha256(directory: str | Path) -> str:
    """Identity of a vocabulary: sha256 over the names and contents of its ``*.model`` files and ``tokenizer.json``."""
    directory = Path(directory)
    files = sorted({p for pattern in _VOCAB_IDENTITY for p in directory.glob(pattern) if p.is_file()})
    if not files:
        raise CheckpointError(f"{directory}: no vocabulary files (*.model, tokenizer.json)")
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def copy_vocab(src_dir: str | Path, dst_dir: str | Path) -> Path:
    """Copy the tokenizer files of ``src_dir`` into ``dst_dir`` (created); returns ``dst_dir``."""
    dst_dir = Path(dst_dir)
    files = vocab_files(src_dir)
    if not files:
        raise CheckpointError(f"{src_dir}: no vocabulary files (*.model, *.vocab, tokenizer.json) to copy")
    dst_dir.mkdir(parents=True, exist_ok=True)
    for p in files:
        shutil.copyfile(p, dst_dir / p.name)
    return dst_dir


# ----------------------------------------------------------------------------------------------------------------------
# atomic file system helpers


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically (temporary file, fsync, rename, fsync of the directory)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)


def _temporary_name(path: Path, what: str = "") -> Path:
    """The hidden directory beside ``path`` that this process writes it in: ``.tmp-[WHAT-]NAME-PID@HOST``."""
    return path.parent / f".tmp-{what}{path.name}-{os.getpid()}@{_HOST}"


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # cannot ask without side effects: the age decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _last_touched(path: Path) -> float:
    """The newest modification time of ``path`` and of what it holds (a long write keeps touching its files)."""
    times = [path.stat().st_mtime]
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):  # removed meanwhile
            times.append(p.stat().st_mtime)
    return max(times)


def _is_stale(path: Path) -> bool:
    """Whether a ``.tmp-*`` directory is debris: not this process's write in progress, and either its writer (named
    by ``-PID@HOST``) is no longer alive on this host or it was not touched for :data:`STALE_TEMPORARY_S` seconds."""
    with _writing_lock:
        if path in _writing:
            return False
    try:
        if time.time() - _last_touched(path) > STALE_TEMPORARY_S:
            return True
    except OSError:  # gone already
        return False
    owner, _, host = path.name.rpartition("@")
    pid = owner.rpartition("-")[2]
    if not pid.isdigit():  # a name of another form: only its age decides
        return False
    if host != _HOST:  # another machine's writer (a shared file system): only its age decides
        return False
    return int(pid) == os.getpid() or not _pid_alive(int(pid))  # ours but not being written: left by a failed write


def _sweep_temporaries(directory: Path) -> None:
    """Remove the stale temporary directories in ``directory`` (see :func:`_is_stale`)."""
    for p in directory.glob(".tmp-*"):
        if p.is_dir() and _is_stale(p):
            shutil.rmtree(p, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------------
# writing


def write_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    config: Config,
    *,
    vocab_sha: str,
    step: int = -1,
    trainer_state: dict[str, Any] | None = None,
    vocab_dir: str | Path | None = None,
) -> Path:
    """Write one checkpoint directory atomically.

    Args:
        path: the checkpoint directory to create (replaced if it exists).
        model: the model to save; pass the unwrapped module (not a DDP or compiled wrapper).
        config: the resolved config, stored in the weights' metadata.
        vocab_sha: :func:`vocab_sha256` of the vocabulary the model was trained with.
        step: optimizer updates done (-1: not a training checkpoint).
        trainer_state: tensors and plain Python values only (loadable with ``weights_only=True``).
        vocab_dir: if given, its tokenizer files are copied into ``path/vocab`` (a standalone checkpoint).
    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(path)
    with _writing_lock:
        if tmp in _writing:
            raise CheckpointError(f"{path}: this process is writing it already")
        _writing.add(tmp)
    try:
        _sweep_temporaries(path.parent)
        shutil.rmtree(tmp, ignore_errors=True)  # left by an earlier failed write of this process
        tmp.mkdir()
        return _write_into(tmp, path, model, config, vocab_sha, step, trainer_state, vocab_dir)
    finally:
        with _writing_lock:
            _writing.discard(tmp)


def _write_into(
    tmp: Path, path: Path, model: torch.nn.Module, config: Config, vocab_sha: str, step: int,
    trainer_state: dict[str, Any] | None, vocab_dir: str | Path | None,
) -> Path:  # fmt: skip
    """:func:`write_checkpoint`'s work: fill ``tmp``, then rename it into place as ``path``."""
    metadata = {
        "format": FORMAT_VERSION,
        "config": json.dumps(config.to_dict()),
        "vocab_sha256": vocab_sha,
        "step": str(step),
    }
    _st_save_model(model, str(tmp / MODEL_FILE), metadata=metadata)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER_FILE)
    if vocab_dir is not None:
        copy_vocab(vocab_dir, tmp / VOCAB_DIR)
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for p in files:
        _fsync_path(p)
    manifest = {
        "format": FORMAT_VERSION,
        "step": step,
        "files": {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files},
    }
    with open(tmp / MANIFEST_FILE, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    _fsync_path(tmp)
    if path.exists():  # overwriting (rare: same step saved twice); keep the old one until the new one is in place
        old = _temporary_name(path, "old-")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    _fsync_path(path.parent)
    return path


def save_model(
    path: str | Path, model: torch.nn.Module, config: Config, vocab_dir: str | Path, *, step: int = -1
) -> Path:
    """Write a standalone inference checkpoint: weights, config and a copy of the vocabulary in one directory.

    ``load_model(path)`` reads it back; ``path/vocab`` is what :func:`transduce.text.vocab.load_vocabulary` takes.
    """
    return write_checkpoint(path, model, config, vocab_sha=vocab_sha256(vocab_dir), step=step, vocab_dir=vocab_dir)


# ----------------------------------------------------------------------------------------------------------------------
# finding and checking


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete training checkpoints (``step_*`` with a manifest) of a run, oldest first."""
    directory = Path(run_dir) / CHECKPOINTS_DIR
    found = [p for p in directory.glob("step_*") if p.is_dir() and (p / MANIFEST_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def read_pointer(run_dir: str | Path, name: str) -> Path | None:
    """The checkpoint the ``last`` or ``best`` pointer names, or None when unset or pointing at nothing."""
    pointer = Path(run_dir) / CHECKPOINTS_DIR / name
    if not pointer.is_file():
        return None
    target = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    return target if (target / MANIFEST_FILE).is_file() else None


def set_pointer(run_dir: str | Path, name: str, checkpoint: Path) -> None:
    """Point ``last`` or ``best`` at ``checkpoint`` (a directory under ``RUN_DIR/checkpoints``), atomically."""
    write_text_atomic(Path(run_dir) / CHECKPOINTS_DIR / name, Path(checkpoint).name + "\n")


def resolve(path: str | Path, prefer: str = BEST) -> Path:
    """The checkpoint directory meant by ``path``.

    ``path`` may be a run directory (the ``prefer`` pointer, else ``last``, else the newest complete checkpoint),
    a checkpoint directory, or its ``model.safetensors`` file.
    """
    path = Path(path)
    if path.is_file() and path.name == MODEL_FILE:
        return path.parent
    if (path / MODEL_FILE).exists() or (path / MANIFEST_FILE).exists():
        return path
    if (path / CHECKPOINTS_DIR).is_dir():
        for name in dict.fromkeys((prefer, LAST)):
            target = read_pointer(path, name)
            if target is not None:
                return target
        found = list_checkpoints(path)
        if found:
            return found[-1]
        raise CheckpointError(f"{path}: run directory without any complete checkpoint in {CHECKPOINTS_DIR}/")
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run directory")
    raise CheckpointError(f"{path}: neither a checkpoint (no {MODEL_FILE}) nor a run directory (no {CHECKPOINTS_DIR}/)")


def verify(checkpoint: str | Path, *, checksums: bool = True) -> dict[str, Any]:
    """Check a checkpoint directory against its manifest; returns the manifest.

    Raises:
        CheckpointError: naming the file that is missing, truncated or corrupt.
    """
    checkpoint = Path(checkpoint)
    manifest_path = checkpoint / MANIFEST_FILE
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        entries = manifest["files"]
    except FileNotFoundError:
        raise CheckpointError(f"{manifest_path}: missing; the checkpoint is incomplete (interrupted write?)") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{manifest_path}: corrupt manifest ({e})") from None
    for name, entry in entries.items():
        p = checkpoint / name
        if not p.is_file():
            raise CheckpointError(f"{p}: missing (listed in {MANIFEST_FILE})")
        size = p.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointError(f"{p}: truncated or overwritten: {size} bytes, the manifest says {entry['bytes']}")
        if checksums and sha256_file(p) != entry["sha256"]:
            raise CheckpointError(f"{p}: corrupt: sha256 differs from the one in {MANIFEST_FILE}")
    return manifest


def read_info(checkpoint: str | Path) -> CheckpointInfo:
    """Read a checkpoint's metadata (config, vocabulary identity, step) without loading the weights."""
    checkpoint = resolve(checkpoint)
    model_path = checkpoint / MODEL_FILE
    try:
        with safe_open(str(model_path), framework="pt") as f:
            meta = f.metadata() or {}
    except FileNotFoundError:
        raise CheckpointError(f"{model_path}: missing") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{model_path}: not a readable safetensors file ({e})") from None
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{model_path}: format {meta.get('format')!r}, this version reads {FORMAT_VERSION!r}")
    try:
        config = Config.from_dict(json.loads(meta["config"]))
    except (KeyError, json.JSONDecodeError, ConfigError) as e:
        raise CheckpointError(f"{model_path}: config in the metadata is unusable ({e})") from None
    return CheckpointInfo(checkpoint, config, meta.get("vocab_sha256", ""), int(meta.get("step", -1)))


def vocab_dir_of(checkpoint: str | Path) -> Path:
    """The vocabulary directory of a checkpoint: ``CKPT/vocab``, else the run's ``RUN_DIR/vocab``."""
    checkpoint = Path(checkpoint)
    for candidate in (checkpoint / VOCAB_DIR, checkpoint.parent.parent / VOCAB_DIR):
        if candidate.is_dir():
            return candidate
    raise CheckpointError(f"{checkpoint}: no vocabulary ({checkpoint / VOCAB_DIR} nor the run's {VOCAB_DIR}/)")


def check_vocab(info: CheckpointInfo, vocab_dir: str | Path) -> None:
    """Raise :class:`CheckpointError` when ``vocab_dir`` is not the vocabulary the checkpoint was trained with."""
    actual = vocab_sha256(vocab_dir)
    if info.vocab_sha256 and actual != info.vocab_sha256:
        raise CheckpointError(
            f"{info.path / MODEL_FILE}: vocabulary mismatch: trained with vocabulary sha256 {info.vocab_sha256[:12]}, "
            f"but {vocab_dir} has {actual[:12]}"
        )


def model_config_diff(a: Config, b: Config) -> list[str]:
    """``model.KEY: A != B`` for every model field that differs (empty when the shapes agree)."""
    da, db = a.model.to_dict(), b.model.to_dict()
    return [f"model.{k}: {da[k]!r} != {db[k]!r}" for k in da if da[k] != db.get(k)]


# ----------------------------------------------------------------------------------------------------------------------
# loading


def load_weights(model: torch.nn.Module, checkpoint: str | Path, *, device: str | torch.device = "cpu") -> None:
    """Load a checkpoint's weights into ``model`` (strict), naming any tensor whose name or shape differs."""
    checkpoint = Path(checkpoint)
    model_path = checkpoint / MODEL_FILE
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    try:
        with safe_open(str(model_path), framework="pt") as f:
            stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{model_path}: not a readable safetensors file ({e})") from None
    diffs = [
        f"{k}: checkpoint {shape}, model {expected[k]}"
        for k, shape in stored.items()
        if k in expected and expected[k] != shape
    ]
    unknown = [k for k in stored if k not in expected]
    if diffs or unknown:
        parts = diffs + ([f"unexpected tensors {unknown[:5]}"] if unknown else [])
        raise CheckpointError(f"{model_path}: model shape mismatch: {'; '.join(parts[:8])}")
    try:
        missing, _ = _st_load_model(model, str(model_path), strict=False, device=str(device))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{model_path}: cannot load weights ({e})") from None
    # safetensors stores tied tensors once; the aliases it skipped share storage with a loaded tensor
    params = dict(model.state_dict())
    loaded_ptrs = {params[k].data_ptr() for k in stored}
    really_missing = [k for k in missing if params[k].data_ptr() not in loaded_ptrs]
    if really_missing:
        raise CheckpointError(f"{model_path}: tensors missing from the checkpoint: {really_missing[:8]}")


def load_model(
    path: str | Path, device: str | torch.device = "cpu", *, checksums: bool = True
) -> tuple[Transformer, Config, Path]:
    """Load a model for inference.

    Args:
        path: a run directory (its best checkpoint, else the last), a checkpoint directory (a training step, an
            averaged or a standalone one), or a ``model.safetensors`` inside one.
        device: where the model goes.
        checksums: verify the files' sha256 against the manifest (sizes are always checked).
    Returns:
        ``(model, config, vocab_dir)``: the model in eval mode, the config it was trained with, and the
        directory to pass to :func:`transduce.text.vocab.load_vocabulary`.
    Raises:
        CheckpointError: a missing, truncated or corrupt file, a vocabulary that does not match, a classifier
            (:meth:`transduce.Classifier.load` loads those) or a masked language model
            (:func:`transduce.transfer.mlm.load_masked_lm`).
    """
    checkpoint = resolve(path)
    verify(checkpoint, checksums=checksums)
    info = read_info(checkpoint)
    if info.config.data.task == "classify":  # (translate, serve, export, average, attention and init_from load here)
        raise CheckpointError(f"{path} is a classifier (data.task: classify): use transduce classify (in Python: "
                              "transduce.Classifier.load); this command takes a translation model")  # fmt: skip
    if info.config.data.task == "mlm":
        raise CheckpointError(f"{path} is a masked language model (data.task: mlm), which has no decoder: use "
                              "transduce.load_masked_lm, or train.init_from of a classifier; this command takes a "
                              "translation model")  # fmt: skip
    vocab_dir = vocab_dir_of(checkpoint)
    check_vocab(info, vocab_dir)
    model = Transformer(info.config.model)
    load_weights(model, checkpoint)
    model.to(device).eval()
    log.info("loaded %s (step %d, %s parameters)", checkpoint, info.step, f"{model.num_parameters():,}")
    return model, info.config, vocab_dir


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """A training checkpoint's trainer state, read with ``torch.load(weights_only=True)``: no arbitrary pickles."""
    p = Path(checkpoint) / TRAINER_FILE
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{p}: missing (an inference-only checkpoint cannot be resumed)") from None
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for bad files
        raise CheckpointError(f"{p}: unreadable trainer state ({type(e).__name__}: {e})") from None


# ----------------------------------------------------------------------------------------------------------------------
# averaging (paper §6.1: the last 5 checkpoints for base, 20 for big)


def average_checkpoints(checkpoints: list[str | Path]) -> tuple[Transformer, Config, Path]:
    """The element-wise mean of the weights of ``checkpoints`` (accumulated in float64).

    Returns:
        ``(model, config, vocab_dir)`` like :func:`load_model`; the config is the newest checkpoint's.
    Raises:
        CheckpointError: when the checkpoints differ in model shape or vocabulary.
    """
    if not checkpoints:
        raise CheckpointError("no checkpoints to average")
    paths = [resolve(p) for p in checkpoints]
    first = read_info(paths[-1])
    total: dict[str, torch.Tensor] = {}
    model = None
    for p in paths:
        model, config, _ = load_model(p)
        diff = model_config_diff(config, first.config)
        if diff:
            raise CheckpointError(f"{p}: cannot average with {paths[-1]}: {'; '.join(diff)}")
        if read_info(p).vocab_sha256 != first.vocab_sha256:
            raise CheckpointError(f"{p}: cannot average with {paths[-1]}: the vocabularies differ")
        for k, v in model.state_dict().items():
            total[k] = total[k] + v.double() if k in total else v.double().clone()
    assert model is not None
    with torch.no_grad():
        model.load_state_dict({k: (v / len(paths)).to(torch.float32) for k, v in total.items()})
    return model, first.config, vocab_dir_of(paths[-1])
