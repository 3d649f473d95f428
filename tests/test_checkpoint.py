"""Checkpoints: round trip, run-directory resolution, atomic writes, clear errors, averaging."""

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from transduce.config import Config, ModelConfig
from transduce.errors import CheckpointError
from transduce.model import Transformer
from transduce.training import checkpoint as ckpt


def _config(**model):
    return Config(model=ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=40, **model))


@pytest.fixture
def vocab(tmp_path):
    d = tmp_path / "prepared"
    d.mkdir()
    (d / "spm.model").write_bytes(b"a sentencepiece model")
    (d / "spm.vocab").write_text("<pad>\t0\n")
    (d / "tokenizer.json").write_text('{"joint": true}')
    return d


def _run_checkpoint(run_dir, model, config, step, vocab_dir):
    ckpt.copy_vocab(vocab_dir, run_dir / "vocab")
    path = ckpt.write_checkpoint(
        run_dir / "checkpoints" / f"step_{step:08d}", model, config, vocab_sha=ckpt.vocab_sha256(vocab_dir),
        step=step, trainer_state={"step": step, "t": torch.arange(3)},
    )  # fmt: skip
    ckpt.set_pointer(run_dir, ckpt.LAST, path)
    return path


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_save_model_round_trip_keeps_tied_weights_and_config(tmp_path, vocab):
    config = _config()
    model = Transformer(config.model)
    out = ckpt.save_model(tmp_path / "model", model, config, vocab)
    loaded, cfg2, vocab_dir = ckpt.load_model(out)
    assert _same(model, loaded) and cfg2 == config
    assert vocab_dir == out / "vocab" and (vocab_dir / "spm.model").read_bytes() == b"a sentencepiece model"
    assert loaded.output.weight is loaded.src_embed.weight  # tying survives the deduplicated storage
    assert not loaded.training
    assert ckpt.load_model(out / "model.safetensors")[1] == config  # the weights file itself is accepted too


def test_run_directory_resolves_to_best_then_last(tmp_path, vocab):
    config = _config()
    run = tmp_path / "run"
    models = [Transformer(config.model) for _ in range(3)]
    paths = [_run_checkpoint(run, m, config, (i + 1) * 10, vocab) for i, m in enumerate(models)]
    model, _, vocab_dir = ckpt.load_model(run)
    assert _same(model, models[2]) and vocab_dir == run / "vocab"  # no best: the last
    ckpt.set_pointer(run, ckpt.BEST, paths[0])
    assert _same(ckpt.load_model(run)[0], models[0])
    assert ckpt.resolve(run, prefer=ckpt.LAST) == paths[2]
    (run / "checkpoints" / "last").unlink()
    (run / "checkpoints" / "best").unlink()
    assert ckpt.resolve(run) == paths[2]  # no pointers: the newest complete checkpoint
    state = ckpt.load_trainer_state(paths[1])  # weights_only=True under the hood
    assert state["step"] == 20 and torch.equal(state["t"], torch.arange(3))


def test_crash_while_writing_leaves_the_previous_checkpoint_loadable(tmp_path, vocab, monkeypatch):
    config = _config()
    run = tmp_path / "run"
    first = Transformer(config.model)
    _run_checkpoint(run, first, config, 10, vocab)

    def crash(*args, **kwargs):
        raise OSError("disk gone (simulated crash after the weights were written)")

    monkeypatch.setattr(ckpt.torch, "save", crash)
    with pytest.raises(OSError, match="simulated"):
        _run_checkpoint(run, Transformer(config.model), config, 20, vocab)
    monkeypatch.undo()
    assert not (run / "checkpoints" / "step_00000020").exists()
    assert [p.name for p in (run / "checkpoints").glob(".tmp-*")]  # the half-written directory is hidden
    assert ckpt.list_checkpoints(run) == [run / "checkpoints" / "step_00000010"]
    assert _same(ckpt.load_model(run)[0], first)
    _run_checkpoint(run, first, config, 30, vocab)  # the next write sweeps the debris
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_a_write_in_progress_in_another_thread_survives_a_second_writer(tmp_path, vocab, monkeypatch):
    """Two writers into one checkpoints/ directory: the second's sweep of debris must leave the first's temporary
    directory, still being written, alone."""
    config = _config()
    run = tmp_path / "run"
    saving, resume = threading.Event(), threading.Event()
    real_save = torch.save

    def slow_save(obj, f, *args, **kwargs):  # the first writer pauses between its weights and its trainer state
        if threading.current_thread().name == "first":
            saving.set()
            assert resume.wait(30)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", slow_save)
    errors = []

    def first():
        try:
            _run_checkpoint(run, Transformer(config.model), config, 10, vocab)
        except Exception as e:  # (reported by the assertion below)
            errors.append(e)

    thread = threading.Thread(target=first, name="first")
    thread.start()
    assert saving.wait(30)
    _run_checkpoint(run, Transformer(config.model), config, 20, vocab)
    resume.set()
    thread.join(30)
    assert errors == []
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_00000010", "step_00000020"]
    ckpt.verify(run / "checkpoints" / "step_00000010")
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_only_stale_temporary_directories_are_swept(tmp_path, vocab):
    """A temporary directory is another writer's work in progress while its owner process is alive and it is
    younger than STALE_TEMPORARY_S; a dead owner's, an old one's and one of an unreadable name are debris."""
    config = _config()
    run = tmp_path / "run"
    checkpoints = run / "checkpoints"
    host = socket.gethostname()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)  # fmt: skip
    dead = int(finished.stdout)
    live = os.getppid()  # the process that started the tests: alive, and not this one
    names = {
        "live": f".tmp-step_00000005-{live}@{host}",
        "live_elsewhere": f".tmp-step_00000005-{live}@another-host.example",
        "dead": f".tmp-step_00000006-{dead}@{host}",
        "old": f".tmp-step_00000007-{live}@{host}",
        "old_elsewhere": f".tmp-step_00000008-{live}@another-host.example",
        "unnamed": ".tmp-something",
    }
    for name in names.values():
        (checkpoints / name).mkdir(parents=True)
        (checkpoints / name / "model.safetensors").write_bytes(b"partial")
    long_ago = time.time() - ckpt.STALE_TEMPORARY_S - 60
    for key in ("old", "old_elsewhere", "unnamed"):
        for path in (checkpoints / names[key], checkpoints / names[key] / "model.safetensors"):
            os.utime(path, (long_ago, long_ago))
    _run_checkpoint(run, Transformer(config.model), config, 10, vocab)
    left = sorted(p.name for p in checkpoints.glob(".tmp-*"))
    assert left == sorted([names["live"], names["live_elsewhere"]])
    assert (checkpoints / names["live"] / "model.safetensors").read_bytes() == b"partial"


def test_truncated_corrupt_and_incomplete_checkpoints_name_the_file(tmp_path, vocab):
    config = _config()
    model = Transformer(config.model)
    out = ckpt.save_model(tmp_path / "m", model, config, vocab)
    weights = out / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=re.escape(str(weights)) + ".*truncated"):
        ckpt.load_model(out)
    weights.write_bytes(data[:-100] + bytes(100))
    with pytest.raises(CheckpointError, match=re.escape(str(weights)) + ".*corrupt"):
        ckpt.load_model(out)
    weights.write_bytes(data)
    (out / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest.json.*incomplete"):
        ckpt.load_model(out)
    trainer = tmp_path / "t" / "trainer.pt"
    trainer.parent.mkdir()
    trainer.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="trainer.pt: unreadable"):
        ckpt.load_trainer_state(trainer.parent)


def test_mismatched_vocabulary_and_shape_say_what_differs(tmp_path, vocab):
    config = _config()
    out = ckpt.save_model(tmp_path / "m", Transformer(config.model), config, vocab)
    (out / "vocab" / "spm.model").write_bytes(b"another vocabulary")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"].pop("vocab/spm.model")
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="vocabulary mismatch"):
        ckpt.load_model(out)
    bigger = Config(model=ModelConfig.preset("test", src_vocab_size=48, tgt_vocab_size=48))
    with pytest.raises(
        CheckpointError, match=r"model shape mismatch: output.weight: checkpoint \(40, 32\), model \(48"
    ):
        ckpt.load_weights(Transformer(bigger.model), out)
    diff = ckpt.model_config_diff(config, _config(d_model=64))
    assert diff == ["model.d_model: 32 != 64"]


def test_average_is_the_elementwise_mean(tmp_path, vocab):
    config = _config()
    run = tmp_path / "run"
    models = []
    for i in range(3):
        torch.manual_seed(i)
        models.append(Transformer(config.model))
        _run_checkpoint(run, models[-1], config, (i + 1) * 10, vocab)
    avg, cfg, vocab_dir = ckpt.average_checkpoints(ckpt.list_checkpoints(run)[-2:])
    for name, value in avg.state_dict().items():
        expected = (models[1].state_dict()[name] + models[2].state_dict()[name]) / 2
        assert torch.allclose(value, expected, atol=1e-7), name
    assert cfg == config and vocab_dir == run / "vocab"
    other = _config(d_model=64, d_ff=64)
    _run_checkpoint(tmp_path / "other", Transformer(other.model), other, 10, vocab)
    with pytest.raises(CheckpointError, match="cannot average"):
        ckpt.average_checkpoints([run, tmp_path / "other"])


def test_average_command_writes_a_loadable_checkpoint(tmp_path, vocab):
    from transduce.cli import main

    config = _config()
    run = tmp_path / "run"
    models = [Transformer(config.model) for _ in range(3)]
    for i, m in enumerate(models):
        _run_checkpoint(run, m, config, i + 1, vocab)
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    avg, _, vocab_dir = ckpt.load_model(run / "average_last2")
    expected = (models[1].output.weight + models[2].output.weight) / 2
    assert torch.allclose(avg.output.weight, expected, atol=1e-7)
    assert vocab_dir == run / "average_last2" / "vocab"


def test_average_last_n_with_fewer_checkpoints_is_refused_and_writes_nothing(tmp_path, vocab, capsys):
    from transduce.cli import main

    config = _config()
    run = tmp_path / "run"
    for step in (1, 2):
        _run_checkpoint(run, Transformer(config.model), config, step, vocab)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert main(["average", "--model", str(run), "--last", "5"]) == 2
    err = capsys.readouterr().err
    assert err == (f"transduce average: error: {run} has 2 checkpoints (step_00000001, step_00000002), fewer than "
                   "--last 5; nothing written (--last 2 averages them all)\n")  # fmt: skip
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert main(["average", "--model", str(run), "--last", "2"]) == 0
    assert (run / "average_last2" / "manifest.json").is_file()


def test_manifest_checksums_are_the_sha256_of_each_file(tmp_path, vocab):
    config = _config()
    out = ckpt.save_model(tmp_path / "m", Transformer(config.model), config, vocab)
    manifest = ckpt.verify(out)
    assert manifest["files"]
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    assert not hasattr(ckpt, "_sha256_file")  # one file hash in the package: transduce.text.textio.sha256_file
