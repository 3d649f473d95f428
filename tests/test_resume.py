"""Resuming a run: everything is checked before anything is written, so a refused resume leaves the run as it was."""

import pytest

from test_train import _cfg
from transduce.cli import main
from transduce.training import checkpoint as ckpt
from transduce.training.train import TrainingError, train


def _files(run):
    """Every file of a run directory and its bytes."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_refused_resume_override_changes_nothing_and_a_plain_resume_still_works(data, tmp_path):
    run = tmp_path / "run"
    train(_cfg(data, run, max_steps=5, valid_every=5))
    before = _files(run)
    with pytest.raises(ckpt.CheckpointError, match=r"model differs from the config: model.d_ff: 64 != 128$"):
        train(resume=run, overrides=["model.d_ff=128", "train.max_steps=10"])
    assert _files(run) == before  # config.yaml still says d_ff 64
    assert train(resume=run, overrides=["train.max_steps=7"]).step == 7
    assert "max_steps: 7" in (run / "config.yaml").read_text()  # an accepted override is saved


def test_resume_with_max_steps_below_the_run_s_step_is_refused_in_one_line(data, tmp_path, capsys):
    run = tmp_path / "run"
    train(_cfg(data, run, max_steps=6, valid_every=3))
    before = _files(run)
    message = (
        f"{run}: train.max_steps=4 is below the run's step 6; nothing changed (give train.max_steps above 6 to go on)"
    )
    with pytest.raises(TrainingError) as err:
        train(resume=run, overrides=["train.max_steps=4"])
    assert str(err.value) == message
    assert main(["train", "--resume", str(run), "train.max_steps=4"]) == 2
    assert capsys.readouterr().err == f"transduce train: error: {message}\n"
    assert _files(run) == before
