"""The learning-rate schedule against the paper's formula, and the optimizer's hyper-parameters."""

import itertools
import math
from dataclasses import replace

import pytest
import torch

from transduce.config import ConfigError, TrainConfig
from transduce.optim import build_optimizer, learning_rate


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
    from transduce.trainer import Trainer

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
    with caplog.at_level("INFO", logger="transduce.trainer"):
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
    from transduce.checkpoint import load_trainer_state, resolve
    from transduce.train import train

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
