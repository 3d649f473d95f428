"""Training: loss falls, accumulation equals one big batch, non-finite losses and gradients, early stopping,
wall-time checkpoints and limits, kill-and-resume, signals, the plain log line."""

import io
import logging
import math
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import transduce.training.train as train_module
from trainkit import toy_config
from transduce.config import Config, ModelConfig, TrainConfig
from transduce.data import collate
from transduce.model import Transformer
from transduce.training import checkpoint as ckpt
from transduce.training.runlog import read_metrics
from transduce.training.train import TrainingError, train
from transduce.training.trainer import Trainer
from transduce.training.validate import ValidResult


def _cfg(data, run_dir, **train):
    corpus, prepared = data
    return toy_config(corpus, run_dir, prepared, valid_bleu=False, **train)


def _losses(run_dir):
    return [(e["step"], e["loss"]) for e in read_metrics(run_dir / "metrics.jsonl", "train")]


def _weights(path):
    return ckpt.load_model(path)[0].state_dict()


# ----------------------------------------------------------------------------------------------------------------------


def test_loss_falls_on_a_copy_task_and_the_run_directory_is_complete(data, tmp_path):
    run = tmp_path / "run"
    outcome = train(_cfg(data, run, max_steps=60, valid_every=30))
    assert outcome.exit_code == 0 and outcome.reason == "max_steps" and outcome.step == 60
    losses = [loss for _, loss in _losses(run)]
    assert len(losses) == 60
    assert sum(losses[-5:]) / 5 < 0.7 * losses[0]
    valid = read_metrics(run / "metrics.jsonl", "valid")
    assert [v["step"] for v in valid] == [30, 60] and valid[1]["loss"] < valid[0]["loss"]
    assert math.isclose(valid[1]["ppl"], math.exp(valid[1]["nll"]))
    assert (run / "config.yaml").exists() and (run / "train.log").exists() and (run / "vocab" / "spm.model").exists()
    assert Config.load(run / "config.yaml").model.src_vocab_size == 320  # the tokenizer's size, not the default
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_00000030", "step_00000060"]
    assert ckpt.read_pointer(run, ckpt.BEST).name == "step_00000060"
    with pytest.raises(TrainingError, match="already holds checkpoints"):
        train(_cfg(data, run, max_steps=60))


def test_keep_last_prunes_old_checkpoints_but_not_the_best(data, tmp_path):
    run = tmp_path / "run"
    # a learning rate so high that validation loss gets worse after the first validation
    train(_cfg(data, run, max_steps=40, valid_every=5, keep_last=2, best_metric="loss"))
    names = [p.name for p in ckpt.list_checkpoints(run)]
    best = ckpt.read_pointer(run, ckpt.BEST).name
    assert names[-2:] == ["step_00000035", "step_00000040"]
    assert set(names) == {best, "step_00000035", "step_00000040"}


def test_accumulating_k_batches_equals_one_big_batch():
    config = Config(
        model=ModelConfig.preset("test", src_vocab_size=30, tgt_vocab_size=30, dropout=0.0),
        train=TrainConfig(label_smoothing=0.1, warmup_steps=10, precision="fp32"),
    )
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(4, 30, (n,), generator=g).tolist(), torch.randint(4, 30, (n + 2,), generator=g).tolist())
             for n in (3, 9, 5, 2, 7, 4)]  # fmt: skip
    grads, results = [], []
    for batches in ([collate(pairs[:2]), collate(pairs[2:3]), collate(pairs[3:])], [collate(pairs)]):
        torch.manual_seed(0)
        trainer = Trainer(config, Transformer(config.model), torch.device("cpu"))
        captured = []
        params = trainer.params
        trainer.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, captured=captured, params=params: captured.append(
                [p.grad.clone() for p in params]
            )
        )
        versions = [p._version for p in params]
        results.append(trainer.train_step(batches))
        grads.append(captured[0])
        # the fused Adam leaves the counters alone; the trainer moves them, so that caches keyed on them refresh
        assert all(p._version > v for p, v in zip(params, versions, strict=True))
    assert results[0].tokens == results[1].tokens == sum(len(t) + 1 for _, t in pairs)
    assert results[0].loss == pytest.approx(results[1].loss, rel=1e-6)
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_nonfinite_losses_are_skipped_then_stop_training(data, tmp_path, monkeypatch):
    import transduce.training.trainer as trainer_module

    real = trainer_module.smoothed_nll_sums
    calls = {"n": 0, "bad": set()}

    def poisoned(*args, **kwargs):
        loss, nll = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] in calls["bad"]:
            loss = loss * float("nan")
        return loss, nll

    monkeypatch.setattr(trainer_module, "smoothed_nll_sums", poisoned)
    calls["bad"] = {5, 6}
    run = tmp_path / "run"
    outcome = train(_cfg(data, run, max_steps=30, valid_every=10, max_nonfinite=3))
    assert outcome.step == 30 and calls["n"] == 32  # two batches spent on skipped updates
    events = read_metrics(run / "metrics.jsonl", "nonfinite")
    assert [(e["step"], e["in_row"]) for e in events] == [(4, 1), (4, 2)]
    assert read_metrics(run / "metrics.jsonl", "train")[-1]["skipped_total"] == 2

    calls["n"], calls["bad"] = 0, set(range(25, 10_000))
    run2 = tmp_path / "run2"
    with pytest.raises(TrainingError, match=r"3 non-finite losses or gradients in a row after step 24.*step_00000020"):
        train(_cfg(data, run2, max_steps=40, valid_every=10, max_nonfinite=3))


@pytest.mark.parametrize(("clip_norm", "bad"), [(0.0, math.nan), (0.0, math.inf), (1.0, math.inf)])
def test_a_nonfinite_gradient_with_a_finite_loss_skips_the_update(clip_norm, bad):
    config = Config(
        model=ModelConfig.preset("test", src_vocab_size=30, tgt_vocab_size=30, dropout=0.0),
        train=TrainConfig(warmup_steps=10, clip_norm=clip_norm, precision="fp32"),
    )
    torch.manual_seed(0)
    trainer = Trainer(config, Transformer(config.model), torch.device("cpu"))
    batch = collate([([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])])
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    def poison(grad):
        grad = grad.clone()
        grad.view(-1)[0] = bad  # one entry of one parameter's gradient
        return grad

    hook = trainer.params[-1].register_hook(poison)
    result = trainer.train_step([batch])
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert result.skipped and result.lr == 0.0
    assert (trainer.step, trainer.nonfinite_in_row, trainer.nonfinite_total) == (0, 1, 1)
    assert math.isfinite(result.loss) and not math.isfinite(result.grad_norm)
    assert all(p.grad is None for p in trainer.params)  # the poisoned gradient is not carried into the next update

    hook.remove()  # the same batch without the poison is applied: the test above is not vacuous
    result = trainer.train_step([batch])
    assert not result.skipped and math.isfinite(result.grad_norm) and result.grad_norm > 0
    assert (trainer.step, trainer.nonfinite_in_row, trainer.nonfinite_total) == (1, 0, 1)
    after = trainer.model.state_dict()
    assert not all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())


def test_patience_stops_after_validations_without_improvement(data, tmp_path, monkeypatch):
    losses = iter([3.0, 2.0, 2.5, 2.0, 1.0])  # best at the 2nd validation; the 3rd and 4th do not improve on it

    def fake_validate(*args, **kwargs):
        loss = next(losses)
        return ValidResult(loss=loss, nll=loss, ppl=math.exp(loss), tokens=100)

    monkeypatch.setattr(train_module, "validate", fake_validate)
    run = tmp_path / "run"
    outcome = train(_cfg(data, run, max_steps=40, valid_every=5, best_metric="loss", patience=2, keep_last=0))
    assert (outcome.exit_code, outcome.reason, outcome.step) == (0, "patience", 20)
    assert outcome.last_valid.loss == 2.0
    assert [(v["step"], v["best_step"]) for v in read_metrics(run / "metrics.jsonl", "valid")] == [
        (5, 5), (10, 10), (15, 10), (20, 10)
    ]  # fmt: skip
    assert [p.name for p in ckpt.list_checkpoints(run)][-1] == "step_00000020"  # no second save at the end
    assert ckpt.read_pointer(run, ckpt.BEST).name == "step_00000010"
    assert "finished (patience) at step 20" in (run / "train.log").read_text()


class _Clock:
    """``time`` as ``transduce.training.train`` sees it, with a ``monotonic`` that advances only when the test says
    so."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def __getattr__(self, name):
        import time

        return getattr(time, name)


def test_save_every_minutes_and_max_minutes_follow_wall_time(data, tmp_path, monkeypatch):
    clock = _Clock()
    real = Trainer.train_step

    def slow_step(self, batches, *rest):  # every update takes 30 s of the fake clock
        clock.now += 30.0
        return real(self, batches, *rest)

    monkeypatch.setattr(train_module, "time", clock)
    monkeypatch.setattr(Trainer, "train_step", slow_step)
    run = tmp_path / "run"
    config = _cfg(data, run, max_steps=40, valid_every=10, save_every_minutes=2, max_minutes=8, keep_last=0)
    outcome = train(config)
    # 2 min = 4 updates since the last save (by time or by validation, which restarts the count); 8 min = 16 updates
    assert (outcome.exit_code, outcome.reason, outcome.step) == (0, "max_minutes", 16)
    assert [p.name for p in ckpt.list_checkpoints(run)] == [f"step_{s:08d}" for s in (4, 8, 10, 14, 16)]
    assert [v["step"] for v in read_metrics(run / "metrics.jsonl", "valid")] == [10, 16]  # timed saves: no validation
    assert ckpt.load_trainer_state(ckpt.resolve(run, prefer=ckpt.LAST))["run"]["elapsed_s"] == 16 * 30.0
    assert "finished (max_minutes) at step 16 in 8.0 min" in (run / "train.log").read_text()


def test_a_run_that_the_time_limit_ends_logs_its_steps_against_that_limit(data, tmp_path, monkeypatch):
    """max_steps 100,000 (the default) and max_minutes 8 at 30 s an update: the lines say how much of the 8 minutes
    has passed, not "step 4/100000"; where max_steps comes first the line counts steps as before."""
    clock = _Clock()
    real = Trainer.train_step

    def slow_step(self, batches, *rest):
        clock.now += 30.0
        return real(self, batches, *rest)

    monkeypatch.setattr(train_module, "time", clock)
    monkeypatch.setattr(Trainer, "train_step", slow_step)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: plain lines
    run = tmp_path / "run"
    outcome = train(_cfg(data, run, max_steps=100_000, max_minutes=8, log_every=4, valid_every=0, keep_last=0))
    assert (outcome.reason, outcome.step) == ("max_minutes", 16)
    lines = [ln for ln in (run / "train.log").read_text().splitlines() if " tok/s " in ln]
    assert len(lines) == 4 and not any("/100000" in ln for ln in lines)
    for step, line in zip((4, 8, 12, 16), lines, strict=True):
        elapsed, left = step * 30, 480 - step * 30
        clock_text = f"time 0:{elapsed // 60:02d}:{elapsed % 60:02d}/0:08:00 ETA 0:{left // 60:02d}:{left % 60:02d}"
        assert re.search(rf"step {step} epoch \d+ loss [\d.]+ lr [\d.e+-]+ [\d,]+ tok/s {clock_text}$", line), line

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())  # a terminal: the bar counts steps, its total is not 100,000
    train(_cfg(data, tmp_path / "bar", max_steps=100_000, max_minutes=8, log_every=4, valid_every=0, keep_last=0))
    bar = sys.stderr.getvalue()
    assert "time 0:08:00/0:08:00 ETA 0:00:00" in bar and "100000" not in bar
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    steps_first = tmp_path / "steps_first"
    train(_cfg(data, steps_first, max_steps=8, max_minutes=8, log_every=4, valid_every=0, keep_last=0))
    lines = [ln for ln in (steps_first / "train.log").read_text().splitlines() if " tok/s " in ln]
    assert [re.search(r"step (\S+) ", ln).group(1) for ln in lines] == ["4/8", "8/8"] and "time " not in lines[0]


_DRIVER = textwrap.dedent(
    """
    import os, sys
    import transduce.training.trainer as T
    from transduce.config import Config
    from transduce.training.train import train

    config, at, signum = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    real = T.Trainer.train_step

    def step(self, batches, *rest):
        if self.step == at - 1:  # during update `at`: SIGKILL dies here; SIGTERM sets the flag the step carries
            os.kill(os.getpid(), signum)
        return real(self, batches, *rest)

    T.Trainer.train_step = step
    sys.exit(train(Config.load(config)).exit_code)
    """
)


def _drive(tmp_path, config, at, signum):
    (tmp_path / "driver.py").write_text(_DRIVER)
    config.save(tmp_path / "killed.yaml")
    cmd = [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "killed.yaml"), str(at), str(int(signum))]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "0"})


def test_sigkill_then_resume_equals_an_uninterrupted_run(data, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    train(_cfg(data, whole, max_steps=40, valid_every=10))
    proc = _drive(tmp_path, _cfg(data, killed, max_steps=40, valid_every=10), 27, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert ckpt.read_pointer(killed, ckpt.LAST).name == "step_00000020"
    assert max(step for step, _ in _losses(killed)) == 26  # killed inside update 27, after logging 26
    outcome = train(resume=killed)
    assert outcome.exit_code == 0 and outcome.step == 40
    a, b = _weights(whole / "checkpoints" / "step_00000040"), _weights(killed / "checkpoints" / "step_00000040")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(killed) == _losses(whole)  # the same loss curve, each step once
    valid = [[(e["step"], e["loss"]) for e in read_metrics(r / "metrics.jsonl", "valid")] for r in (whole, killed)]
    assert valid[0] == valid[1]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sigint_and_sigterm_save_a_checkpoint_and_exit_128_plus_the_signal(data, tmp_path, signum, code):
    run = tmp_path / "run"
    proc = _drive(tmp_path, _cfg(data, run, max_steps=40, valid_every=10), 13, signum)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert ckpt.read_pointer(run, ckpt.LAST).name == "step_00000013"
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_00000010", "step_00000013"]
    ckpt.verify(run / "checkpoints" / "step_00000013")
    log_text = (run / "train.log").read_text()
    assert f"stopped by {signum.name} at step 13; resume with: transduce train --resume" in log_text
    assert train(resume=run, overrides=["train.max_steps=15"]).step == 15


def test_resume_with_a_different_model_is_refused(data, tmp_path):
    run = tmp_path / "run"
    train(_cfg(data, run, max_steps=5, valid_every=5))
    with pytest.raises(ckpt.CheckpointError, match=r"model differs from the config: model.d_ff: 64 != 128"):
        train(resume=run, overrides=["model.d_ff=128", "train.max_steps=10"])


def test_cli_train_and_resume(data, tmp_path):
    from transduce.cli import main

    corpus, prepared = data
    run = tmp_path / "run"
    args = ["train", "configs/toy.yaml", f"data.train={corpus / 'train'}", f"data.valid={corpus / 'valid'}",
            f"data.prepared={prepared}",
            f"train.run_dir={run}", "train.max_steps=6", "train.valid_every=3", "train.valid_bleu=false"]  # fmt: skip
    assert main(args) == 0
    assert main(["train", "--resume", str(run), "train.max_steps=9"]) == 0
    assert ckpt.read_pointer(run, ckpt.LAST).name == "step_00000009"
    assert main(["train", "configs/toy.yaml", "train.max_stpes=3"]) == 2  # unknown key: one-line error


def test_example_config_loads_and_documents_every_key():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "configs" / "example.yaml").read_text()
    config = Config.load(Path(__file__).resolve().parents[1] / "configs" / "example.yaml")
    for section, values in config.to_dict().items():
        for key in values:
            line = next((ln for ln in text.splitlines() if ln.startswith(f"  {key}:")), None)
            assert line is not None and "#" in line, f"{section}.{key} is not documented in configs/example.yaml"


def test_bf16_accumulation_and_validation_bleu_with_signature(data, tmp_path):
    corpus, prepared = data
    run = tmp_path / "run"
    config = toy_config(corpus, run, prepared, precision="bf16", accumulate=2, clip_norm=1.0, max_steps=30,
                        valid_every=15, valid_beam=2)  # fmt: skip
    outcome = train(config)
    losses = [loss for _, loss in _losses(run)]
    assert outcome.step == 30 and sum(losses[-5:]) / 5 < 0.8 * losses[0]
    valid = read_metrics(run / "metrics.jsonl", "valid")[-1]
    assert valid["references"] == "raw" and valid["sentences"] == 20
    assert 0.0 <= valid["bleu"] <= 100.0 and valid["bleu_signature"].startswith("nrefs:1")
    assert "chrf_signature" in valid
    assert read_metrics(run / "metrics.jsonl", "train")[-1]["grad_norm"] is not None


def test_plain_log_line_every_log_interval(data, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: plain lines instead of a progress bar
    run = tmp_path / "run"
    train(_cfg(data, run, max_steps=12, log_every=5, valid_every=12))
    events = read_metrics(run / "metrics.jsonl", "train")
    assert [e["step"] for e in events] == [5, 10, 12]  # every log_every updates and the last one
    lines = [ln for ln in (run / "train.log").read_text().splitlines() if " tok/s ETA " in ln]
    assert len(lines) == len(events)
    for line, e in zip(lines, events, strict=True):
        head = f"step {e['step']}/12 epoch {e['epoch']} loss {e['loss']:.4f} lr {e['lr']:.3e} "
        assert re.search(re.escape(head) + r"[\d,]+ tok/s ETA \d+:\d\d:\d\d$", line), line
    assert lines[-1].endswith("ETA 0:00:00")


def test_resuming_a_checkpoint_of_an_unfused_adam_keeps_the_fused_one():
    """Optimizer.load_state_dict takes the group options from the checkpoint: a run saved before the trainer used
    fused Adam must not come back on the per-tensor loop."""
    model = ModelConfig.preset("test", src_vocab_size=30, tgt_vocab_size=30)
    config = Config(model=model, train=TrainConfig(precision="fp32"))
    trainer = Trainer(config, Transformer(config.model), torch.device("cpu"))
    old = torch.optim.Adam(trainer.params, lr=0.0, betas=(0.9, 0.98), eps=1e-9)  # torch's default: not fused
    state = {**trainer.state_dict(), "optimizer": old.state_dict()}
    assert state["optimizer"]["param_groups"][0]["fused"] is None
    trainer.load_state_dict(state)
    assert all(group["fused"] is True for group in trainer.optimizer.param_groups)


def test_decay_by_time_reaches_min_lr_when_the_time_budget_ends_and_resumes_on_the_same_curve(data, tmp_path,
                                                                                             monkeypatch):  # fmt: skip
    clock = _Clock()
    real = Trainer.train_step

    def slow_step(self, batches, *rest):  # every update takes 30 s of the fake clock: 16 fit into 8 minutes
        clock.now += 30.0
        return real(self, batches, *rest)

    monkeypatch.setattr(train_module, "time", clock)
    monkeypatch.setattr(Trainer, "train_step", slow_step)
    schedule = dict(schedule="cosine", peak_lr=1e-3, warmup_steps=2, max_minutes=8, decay_by="time", log_every=1,
                    valid_every=0, keep_last=0)  # fmt: skip
    run = tmp_path / "run"
    outcome = train(_cfg(data, run, max_steps=1000, **schedule))
    assert (outcome.reason, outcome.step) == ("max_minutes", 16)
    lrs = {e["step"]: e["lr"] for e in read_metrics(run / "metrics.jsonl", "train")}
    # warmup by updates; then the pace (16 updates in 8 minutes) sets the end of the cosine at update 16, not 1000
    expected = {1: 5e-4, 2: 1e-3} | {s: 5e-4 * (1 + math.cos(math.pi * (s - 2) / 14)) for s in range(3, 17)}
    assert lrs == pytest.approx(expected, abs=1e-12)
    assert lrs[16] == pytest.approx(0.0, abs=1e-12)

    # stopped after 8 updates (4 minutes), resumed: the time share comes back with the checkpoint
    half = tmp_path / "half"
    assert train(_cfg(data, half, max_steps=8, **schedule)).step == 8
    assert train(resume=half, overrides=["train.max_steps=1000"]).step == 16
    resumed = {e["step"]: e["lr"] for e in read_metrics(half / "metrics.jsonl", "train")}
    assert {s: resumed[s] for s in range(9, 17)} == pytest.approx({s: expected[s] for s in range(9, 17)}, abs=1e-12)


def test_a_warmup_longer_than_the_time_budget_is_named_and_warmup_by_time_ends_it(data, tmp_path, monkeypatch, caplog):
    clock = _Clock()
    real = Trainer.train_step

    def slow_step(self, batches, *rest):  # 30 s an update: 16 fit into 8 minutes, fewer than the 20 of the warmup
        clock.now += 30.0
        return real(self, batches, *rest)

    monkeypatch.setattr(train_module, "time", clock)
    monkeypatch.setattr(Trainer, "train_step", slow_step)
    schedule = dict(schedule="cosine", peak_lr=1e-3, warmup_steps=20, max_minutes=8, decay_by="time", log_every=4,
                    valid_every=0, keep_last=0, max_steps=40)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="transduce.training.train"):
        assert train(_cfg(data, tmp_path / "steps", **schedule)).step == 16
    warned = [r.getMessage() for r in caplog.records if "warmup_steps" in r.getMessage()]
    assert warned == [
        "at this pace (4 updates in 2.0 minutes) the 8 minutes of train.max_minutes fit about 16 updates, fewer than "
        "train.warmup_steps=20: the learning rate would still be rising when the time runs out (train.warmup_by=time "
        "ends the warmup at its share of the time as well)"
    ]
    lrs = [e["lr"] for e in read_metrics(tmp_path / "steps" / "metrics.jsonl", "train")]
    assert lrs[-1] == pytest.approx(1e-3 * 16 / 20)  # still rising at the end
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="transduce.training.train"):
        assert train(_cfg(data, tmp_path / "time", warmup_by="time", **schedule)).step == 16
    assert not [r for r in caplog.records if "warmup_steps" in r.getMessage()]
    lrs = [e["lr"] for e in read_metrics(tmp_path / "time" / "metrics.jsonl", "train")]
    # the warmup's share of the time (20 of 40 updates: half of it) ends it after 8 updates; the pace fits 16, so
    # the cosine runs from update 8 to 16 (logged every 4 updates)
    assert lrs == pytest.approx([0.375e-3, 0.875e-3, 5e-4, 0.0], abs=1e-12)
