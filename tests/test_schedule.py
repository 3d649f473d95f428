"""The learning-rate schedule against the paper's formula, and the optimizer's hyper-parameters."""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from transduce.config import ConfigError, TrainConfig
from transduce.training.optim import build_optimizer, describe_schedule, learning_rate


@pytest.mark.parametrize("step", [1, 2, 100, 3999, 4000, 4001, 10_000, 100_000])
def test_noam_equals_the_paper_formula(step):
    cfg = TrainConfig()
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert learning_rate(step, cfg, 512) == pytest.approx(expected, rel=1e-12)


def test_noam_peaks_at_warmup_and_scales():
    cfg = TrainConfig(warmup_steps=100, lr_scale=2.0)
    lrs = [learning_rate(s, cfg, 256) for s in range(1, 400)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 100
    assert lrs[99] == pytest.approx(2.0 * 256**-0.5 * 100**-0.5)


def test_inverse_sqrt_peak_form():
    cfg = TrainConfig(schedule="inverse_sqrt", peak_lr=5e-3, warmup_steps=2000)
    assert learning_rate(2000, cfg, 128) == pytest.approx(5e-3)
    assert learning_rate(1000, cfg, 128) == pytest.approx(2.5e-3)
    assert learning_rate(8000, cfg, 128) == pytest.approx(5e-3 * math.sqrt(2000 / 8000))
    assert learning_rate(5, TrainConfig(schedule="constant", peak_lr=1e-4), 128) == 1e-4


def test_cosine_warms_up_then_decays_to_min_lr_at_max_steps():
    cfg = TrainConfig(schedule="cosine", peak_lr=4e-3, min_lr=1e-4, warmup_steps=100, max_steps=1100)
    assert learning_rate(50, cfg, 128) == pytest.approx(2e-3)
    assert learning_rate(100, cfg, 128) == pytest.approx(4e-3)
    assert learning_rate(600, cfg, 128) == pytest.approx(1e-4 + 3.9e-3 / 2)  # halfway: cos(pi/2) = 0
    assert learning_rate(350, cfg, 128) == pytest.approx(1e-4 + 3.9e-3 * (1 + math.sqrt(0.5)) / 2)
    assert learning_rate(1100, cfg, 128) == pytest.approx(1e-4)
    assert learning_rate(5000, cfg, 128) == pytest.approx(1e-4)  # past max_steps (a resumed, extended run)
    lrs = [learning_rate(s, cfg, 128) for s in range(100, 1101)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_cosine_needs_room_to_decay():
    with pytest.raises(ConfigError, match=r"max_steps: the cosine .* must exceed warmup_steps \(4000\), got 4000"):
        TrainConfig(schedule="cosine", max_steps=4000)
    with pytest.raises(ConfigError, match=r"min_lr: must not exceed peak_lr \(0.0005\), got 0.001"):
        TrainConfig(schedule="cosine", min_lr=1e-3)


def test_optimizer_is_the_papers_adam_and_adamw_spares_biases():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, TrainConfig())
    assert type(opt) is torch.optim.Adam
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    opt = build_optimizer(model, TrainConfig(weight_decay=0.01))
    assert type(opt) is torch.optim.AdamW
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(model[0].weight)}
    assert opt.defaults["fused"] is True  # one operator call for all tensors on the CPU


def test_fused_adam_matches_the_papers_update_by_hand():
    """Two updates of the fused Adam against Adam written out (Kingma & Ba, with bias correction)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    cfg = TrainConfig()
    opt = build_optimizer(model, cfg)
    assert opt.defaults["fused"] is True
    w = model.weight.detach().clone().double()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    b1, b2, eps, lr = 0.9, 0.98, 1e-9, 1e-2
    for t in (1, 2):
        grad = torch.randn(2, 3)
        model.weight.grad, model.bias.grad = grad.clone(), torch.zeros(2)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        m = b1 * m + (1 - b1) * grad.double()
        v = b2 * v + (1 - b2) * grad.double() ** 2
        w = w - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        torch.testing.assert_close(model.weight.detach().double(), w, rtol=1e-6, atol=1e-7)


def test_cosine_decay_by_time_decays_over_the_updates_the_pace_fits_into_the_budget():
    cfg = TrainConfig(schedule="cosine", peak_lr=4e-3, warmup_steps=100, max_steps=10_000, max_minutes=60,
                      decay_by="time")  # fmt: skip
    # 599 updates took half the budget: the pace fits 1,198 into it, so update 600 is (600-100)/(1198-100) along
    assert learning_rate(600, cfg, 128, time_share=0.5) == pytest.approx(2e-3 * (1 + math.cos(math.pi * 500 / 1098)))
    assert learning_rate(100, cfg, 128, time_share=0.5) == pytest.approx(4e-3)  # warmup is counted in updates
    assert learning_rate(1199, cfg, 128, time_share=1.0) == 0.0  # the budget is spent: min_lr
    assert learning_rate(600, cfg, 128, time_share=0.01) == learning_rate(600, replace(cfg, decay_by="steps"), 128)
    assert learning_rate(600, cfg, 128) == learning_rate(600, replace(cfg, decay_by="steps"), 128)  # no time yet


def test_decay_by_time_needs_a_cosine_within_a_time_budget():
    with pytest.raises(ConfigError, match=r"decay_by: time decays the cosine schedule within train.max_minutes, so it "
                                          r"needs schedule: cosine and max_minutes > 0 \(got schedule 'cosine', "
                                          r"max_minutes 0\)"):  # fmt: skip
        TrainConfig(schedule="cosine", max_steps=5000, decay_by="time")
    with pytest.raises(ConfigError, match=r"got schedule 'noam', max_minutes 80\)"):
        TrainConfig(max_minutes=80, decay_by="time")
    with pytest.raises(ConfigError, match=r"decay_by: 'wall' is not one of 'steps', 'time'"):
        TrainConfig(decay_by="wall")


# ----------------------------------------------------------------------------------------------------------------------
# optimizer state loaded from another run or a resumed one: the moments travel, the hyper-parameters do not


def _trainer(**train):
    from transduce.config import Config, ModelConfig
    from transduce.model import Transformer
    from transduce.training.trainer import Trainer

    torch.manual_seed(0)
    config = Config(model=ModelConfig.preset("test", src_vocab_size=30, tgt_vocab_size=30),
                    train=TrainConfig(precision="fp32", warmup_steps=1, **train))  # fmt: skip
    return Trainer(config, Transformer(config.model), torch.device("cpu"))


def _stepped(**train):
    """A trainer after two updates, so that Adam's moments are not zero."""
    from transduce.data import collate

    trainer = _trainer(**train)
    batch = collate([([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])])
    for _ in range(2):
        trainer.train_step([batch])
    return trainer


@pytest.mark.parametrize(("saved", "now"), [
    ({"weight_decay": 0.01}, {"adam_beta2": 0.999, "adam_eps": 1e-6, "weight_decay": 0.1}),  # AdamW -> AdamW
    ({}, {"adam_beta2": 0.999, "adam_eps": 1e-6, "weight_decay": 0.1}),  # Adam -> AdamW: one group, then two
    ({"weight_decay": 0.01}, {"adam_beta1": 0.8}),  # AdamW -> Adam: two groups, then one
])  # fmt: skip
def test_loaded_optimizer_state_brings_the_moments_and_keeps_this_run_s_hyper_parameters(saved, now, caplog):
    before = _stepped(**saved)
    after = _trainer(**now)
    caplog.clear()  # (what building the trainers logged)
    with caplog.at_level("INFO", logger="transduce.training.trainer"):
        after.load_state_dict(before.state_dict(), source="runs/pretrained/checkpoints/step_00000002")
    cfg, old = after.cfg, before.cfg
    for group in after.optimizer.param_groups:
        assert tuple(group["betas"]) == (cfg.adam_beta1, cfg.adam_beta2) and group["eps"] == cfg.adam_eps
        assert group["fused"] is True
    decay = {id(p): group["weight_decay"] for group in after.optimizer.param_groups for p in group["params"]}
    assert {decay[id(p)] for p in after.params if p.dim() >= 2} == {cfg.weight_decay}
    assert {decay[id(p)] for p in after.params if p.dim() < 2} == {0.0}
    assert len(after.params) == len(before.params)
    for p_after, p_before in zip(after.params, before.params, strict=True):  # the same parameter in both models
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(after.optimizer.state[p_after][key], before.optimizer.state[p_before][key]), key
    assert caplog.messages == [
        f"optimizer: Adam's moments of {len(after.params)} tensors from runs/pretrained/checkpoints/step_00000002; "
        f"betas ({cfg.adam_beta1}, {cfg.adam_beta2}), eps {cfg.adam_eps:g}, weight decay {cfg.weight_decay:g} from "
        f"the config (the saved state had ({old.adam_beta1}, {old.adam_beta2}), eps {old.adam_eps:g}, weight decay "
        f"{old.weight_decay:g}); the learning rate from the schedule"
    ]
    batch_step = after.step
    from transduce.data import collate

    after.train_step([collate([([5, 6], [7, 8])])])  # the loaded state steps
    assert after.step == batch_step + 1


def test_an_optimizer_state_of_another_model_is_refused():
    before = _stepped()
    after = _trainer()
    state = before.state_dict()
    state["optimizer"]["param_groups"][0]["params"] = state["optimizer"]["param_groups"][0]["params"][:-1]
    with pytest.raises(ValueError, match=rf"^the saved optimizer state holds {len(after.params) - 1} parameters, "
                                         rf"this run trains {len(after.params)}$"):  # fmt: skip
        after.load_state_dict(state)


def test_adam_s_hyper_parameters_given_when_resuming_take_effect(data, tmp_path):
    from trainkit import toy_config
    from transduce.training.checkpoint import load_trainer_state, resolve
    from transduce.training.train import train

    corpus, prepared = data
    run = tmp_path / "run"
    train(toy_config(corpus, run, prepared, max_steps=2, valid_every=0, valid_bleu=False, weight_decay=0.01))
    train(resume=run, overrides=["train.max_steps=3", "train.adam_beta2=0.999", "train.adam_eps=1e-6",
                                 "train.weight_decay=0.1"])  # fmt: skip
    groups = load_trainer_state(resolve(run, prefer="last"))["trainer"]["optimizer"]["param_groups"]
    assert [(tuple(g["betas"]), g["eps"], g["weight_decay"]) for g in groups] == [
        ((0.9, 0.999), 1e-6, 0.1),
        ((0.9, 0.999), 1e-6, 0.0),
    ]


# ----------------------------------------------------------------------------------------------------------------------
# settings the schedule ignores, a warmup longer than the run, the fine-tuning default


def test_the_default_schedule_is_noam_and_inverse_sqrt_when_fine_tuning():
    from transduce.config import Config

    assert TrainConfig().schedule == "noam"
    assert TrainConfig(init_from="runs/base").schedule == "inverse_sqrt"  # its peak is peak_lr
    assert TrainConfig(init_from="runs/base", schedule="noam").schedule == "noam"  # a schedule asked for is kept
    fine_tune = Config.resolve({"train": {"peak_lr": 1e-4, "warmup_steps": 5}}, ["train.init_from=runs/base"])
    assert fine_tune.train.schedule == "inverse_sqrt"
    assert Config.from_dict(fine_tune.to_dict()) == fine_tune  # the resolved schedule is what config.yaml keeps
    with pytest.raises(ConfigError, match=r"^schedule: 'linear' is not one of 'auto', 'noam', 'inverse_sqrt'"):
        TrainConfig(schedule="linear")


def test_settings_the_schedule_ignores_are_named_one_line_each():
    from transduce.training.optim import ignored_settings

    assert ignored_settings(TrainConfig()) == []
    assert ignored_settings(TrainConfig(schedule="cosine", peak_lr=1e-3, min_lr=1e-5, max_steps=5000)) == []
    assert ignored_settings(TrainConfig(peak_lr=1e-4, min_lr=1e-5)) == [
        "train.peak_lr=0.0001 has no effect under train.schedule=noam, whose rate is lr_scale * d_model^-0.5 * "
        "min(step^-0.5, step * warmup_steps^-1.5): set train.schedule to inverse_sqrt, cosine or constant to train "
        "with it, or leave it out",
        "train.min_lr=1e-05 has no effect under train.schedule=noam: only cosine decays to it; leave it out",
    ]
    assert ignored_settings(TrainConfig(schedule="constant", lr_scale=2.0, warmup_steps=100)) == [
        "train.lr_scale=2 has no effect under train.schedule=constant: it scales the noam schedule only; set "
        "train.peak_lr instead, or leave it out",
        "train.warmup_steps=100 has no effect under train.schedule=constant, which has no warmup; leave it out",
    ]


def test_a_warmup_longer_than_the_run_is_named_with_the_rate_it_ends_at():
    from transduce.training.optim import warmup_beyond_run

    assert warmup_beyond_run(TrainConfig(max_steps=4000), 512) is None
    assert warmup_beyond_run(TrainConfig(schedule="constant", max_steps=30), 512) is None
    # noam, d_model 512: 512^-0.5 * 30 * 4000^-1.5 = 5.24e-06 at update 30; 512^-0.5 * 4000^-0.5 = 6.99e-04 at 4000
    assert warmup_beyond_run(TrainConfig(max_steps=30), 512) == (
        "train.warmup_steps=4000 is longer than the run (train.max_steps=30): the learning rate only rises, to "
        "5.2e-06 at the last update, 0.8% of the 7.0e-04 it would reach at update 4000; lower train.warmup_steps "
        "(e.g. 3, a tenth of max_steps)"
    )
    inverse_sqrt = TrainConfig(schedule="inverse_sqrt", peak_lr=1e-3, warmup_steps=100, max_steps=20)
    assert warmup_beyond_run(inverse_sqrt, 512).startswith(
        "train.warmup_steps=100 is longer than the run (train.max_steps=20): the learning rate only rises, to "
        "2.0e-04 at the last update, 20.0% of the 1.0e-03"
    )


def test_a_run_with_a_setting_its_schedule_ignores_is_refused_before_anything_is_written(data, tmp_path, capsys):
    from transduce.cli import main

    corpus, prepared = data
    run = tmp_path / "run"
    args = ["train", "configs/toy.yaml", f"data.train={corpus / 'train'}", f"data.valid={corpus / 'valid'}",
            f"data.prepared={prepared}", f"train.run_dir={run}", "train.schedule=noam",
            "train.peak_lr=1e-4"]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err == (
        "transduce train: error: train.peak_lr=0.0001 has no effect under train.schedule=noam, whose rate is "
        "lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5): set train.schedule to inverse_sqrt, "
        "cosine or constant to train with it, or leave it out\n"
    )
    assert not run.exists()


def test_fine_tuning_peaks_at_peak_lr_and_a_short_run_warns_of_its_warmup(data, tmp_path):
    """A fine-tuning config in the form an HF or fairseq user writes it (peak_lr, warmup_steps, no schedule)."""
    from trainkit import toy_config
    from transduce.config import Config
    from transduce.training.runlog import read_metrics
    from transduce.training.train import train

    corpus, prepared = data
    base = tmp_path / "base"
    train(toy_config(corpus, base, prepared, max_steps=2, valid_every=0, valid_bleu=False))
    tuned = tmp_path / "tuned"
    config = toy_config(corpus, tuned, max_steps=6, valid_every=0, valid_bleu=False, log_every=1).to_dict()
    del config["train"]["schedule"], config["data"]["prepared"]
    config["train"].update(peak_lr=1e-4, warmup_steps=5, init_from=str(base))
    train(Config.from_dict(config))
    lrs = {e["step"]: e["lr"] for e in read_metrics(tuned / "metrics.jsonl", "train")}
    assert lrs[5] == pytest.approx(1e-4) and lrs[6] == pytest.approx(1e-4 * math.sqrt(5 / 6))
    log = (tuned / "train.log").read_text()
    assert ("learning rate: inverse_sqrt (the default when fine-tuning from train.init_from): rising to "
            "train.peak_lr=0.0001 at update 5, then falling as 1/sqrt(update)") in log  # fmt: skip
    short = tmp_path / "short"
    train(toy_config(corpus, short, prepared, max_steps=3, valid_every=0, valid_bleu=False))  # toy: warmup 10
    assert "train.warmup_steps=10 is longer than the run (train.max_steps=3)" in (short / "train.log").read_text()


def test_cosine_warmup_by_time_ends_at_the_same_share_of_the_budget_on_a_slower_machine():
    cfg = TrainConfig(schedule="cosine", peak_lr=5e-3, warmup_steps=2000, max_steps=7000, max_minutes=80,
                      decay_by="time", warmup_by="time")  # fmt: skip
    by_steps = replace(cfg, warmup_by="steps")
    # a quarter of the budget at update 500: the time's fraction of the warmup share (0.25 / (2000/7000) = 0.875)
    assert learning_rate(500, cfg, 256, time_share=0.25) == pytest.approx(5e-3 * 0.875)
    assert learning_rate(500, by_steps, 256, time_share=0.25) == pytest.approx(5e-3 * 0.25)
    # 1,000 updates in 30% of the budget: the pace fits 3,333.3, whose 2/7 (952.4) is where the decay starts
    fit = 1000 / 0.3
    start = 2000 * fit / 7000
    expected = 2.5e-3 * (1 + math.cos(math.pi * (1001 - start) / (fit - start)))
    assert learning_rate(1001, cfg, 256, time_share=0.3) == pytest.approx(expected)
    assert learning_rate(1001, by_steps, 256, time_share=0.3) == pytest.approx(5e-3 * 1001 / 2000)
    assert learning_rate(3334, cfg, 256, time_share=1.0) == 0.0  # the budget is spent: min_lr
    # a machine that fits all 7,000 updates: the schedule counted in updates, as with warmup_by steps
    for step, share in ((1001, 0.1), (2000, 0.2), (4000, 0.5)):
        assert learning_rate(step, cfg, 256, time_share=share) == learning_rate(step, by_steps, 256, time_share=share)
    assert learning_rate(1, cfg, 256) == pytest.approx(5e-3 / 2000)  # no time measured yet: by updates
    # the rate rises steadily to the peak however the pace varies from one update to the next (a slow first update,
    # then updates of 0.1 to 3 time units: time only grows)
    seconds = np.cumsum(np.r_[200.0, np.random.default_rng(0).uniform(0.1, 3.0, 3000)])
    shares = seconds / (seconds[-1] * 1.2)
    rates = [learning_rate(s, cfg, 256, time_share=shares[s - 2]) for s in range(2, 3000)]
    top = int(np.argmax(rates))
    assert 100 < top < 2000 and rates[top] > 0.999 * 5e-3
    assert all(b >= a for a, b in itertools.pairwise(rates[: top + 1]))
    assert all(b <= a * 1.0001 for a, b in itertools.pairwise(rates[top:]))  # then it decays


def test_warmup_by_time_needs_decay_by_time():
    message = r"^warmup_by: time scales the warmup with the updates that fit into max_minutes, so it needs decay_by: "
    with pytest.raises(ConfigError, match=message + r"time \(got decay_by 'steps'\)$"):
        TrainConfig(schedule="cosine", max_steps=5000, warmup_steps=100, max_minutes=60, warmup_by="time")
    with pytest.raises(ConfigError, match=r"warmup_by: 'wall' is not one of 'steps', 'time'"):
        TrainConfig(warmup_by="wall")


def test_the_log_says_where_a_time_budgeted_cosine_peaks_and_ends():
    cfg = TrainConfig(schedule="cosine", peak_lr=5e-3, warmup_steps=2000, max_steps=7000, max_minutes=80,
                      decay_by="time")  # fmt: skip
    assert describe_schedule(cfg, 256) == (
        "cosine: rising to train.peak_lr=0.005 at update 2000, then half a cosine "
        "down to train.min_lr=0 at update 7000 or when train.max_minutes ends"
    )
    assert describe_schedule(replace(cfg, warmup_by="time"), 256) == (
        "cosine: rising to train.peak_lr=0.005 at update 2000 or after 22.86 of the 80 minutes (the first to come), "
        "then half a cosine down to train.min_lr=0 at update 7000 or when train.max_minutes ends"
    )
