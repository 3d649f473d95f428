"""Fixtures shared by several test files."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodekit import make_checkpoint, train_copy_checkpoint


@pytest.fixture(scope="session")
def copy_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A standalone checkpoint of a small post-norm model trained to copy word sentences, with a real SentencePiece
    vocabulary (see :func:`decodekit.train_copy_checkpoint`); trained once per test session. Do not modify it."""
    return train_copy_checkpoint(tmp_path_factory.mktemp("copy_model"))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy-task corpus (:func:`trainkit.write_corpus`) and its prepared directory, made once per test module."""
    from trainkit import toy_config, write_corpus
    from transduce.data import prepare

    root = tmp_path_factory.mktemp("toy")
    corpus = write_corpus(root / "corpus")
    prepared = root / "prepared"
    prepare(toy_config(corpus, root / "unused").data, prepared)
    return corpus, prepared


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A standalone checkpoint of a random ``test``-preset model with a real vocabulary (see
    :func:`decodekit.make_checkpoint`), made once per test module."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(autouse=True)
def _default_ctrl_c():
    """Every test starts with Python's own Ctrl-C handler (KeyboardInterrupt), whatever an earlier test in the same
    worker process left behind: the interruption tests, and the subprocesses they start (which inherit an ignored
    SIGINT), depend on it."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
