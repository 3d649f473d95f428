"""The pre-softmax projection computed with the loss (training/loss.py: output_loss_sums): by blocks of rows (the fast
path, fastpaths.settings.output_loss_rows) it gives the loss, NLL and gradients of the projection over all rows
followed by the fused loss (its fallback), in float32 and under bf16 autocast, and the trainer's updates agree."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transduce import fastpaths
from transduce.model import kernels
from transduce.training import loss as loss_module
from transduce.training.loss import output_loss_sums

needs_kernels = pytest.mark.skipif(kernels.compiled() is None, reason="transduce's CPU kernels could not be built")
PAD = 0


def _inputs(n_rows: int = 53, d: int = 24, vocab: int = 301, bias: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    output = nn.Linear(d, vocab, bias=bias)
    with torch.no_grad():
        output.weight.copy_(torch.randn(vocab, d, generator=g) * 0.3)
        if bias:
            output.bias.copy_(torch.randn(vocab, generator=g))
    states = torch.randn(3, n_rows // 3 + 1, d, generator=g)[:, : n_rows // 3]  # not contiguous rows: a slice
    target = torch.randint(1, vocab, states.shape[:2], generator=g)
    target[:, -2:] = PAD  # padded positions
    target[0, 0] = PAD
    return output, states, target


def _run(output, states, target, eps, rows, bf16, grad_weight=True):
    """Loss, NLL and the gradients of (states, weight, bias) for ``loss_sum / 7``, with ``output_loss_rows`` rows."""
    output.zero_grad(set_to_none=True)
    output.weight.requires_grad_(grad_weight)
    x = states.detach().clone().requires_grad_()
    with fastpaths.override(output_loss_rows=rows), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        blocked = loss_module.blocked_output_applies(output, x, target, None)
        loss, nll = output_loss_sums(output, x, target, eps, PAD)
    (loss / 7).backward()
    bias = None if output.bias is None else output.bias.grad
    return blocked, loss.detach(), nll, x.grad, output.weight.grad, bias


@needs_kernels
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_blocks_of_rows_give_the_loss_and_gradients_of_the_whole_projection(eps, bf16, bias):
    output, states, target = _inputs(bias=bias)
    ref = _run(output, states, target, eps, rows=0, bf16=bf16)
    assert ref[0] is False  # rows=0: the fallback, the projection over all rows then the fused loss
    for rows in (1, 8, 17, 64, 1000):  # a block of one row, blocks that do not divide the 51 rows, one block
        got = _run(output, states, target, eps, rows=rows, bf16=bf16)
        assert got[0] is True
        tol = dict(rtol=1e-5, atol=1e-6) if not bf16 else dict(rtol=2e-2, atol=2e-3)
        torch.testing.assert_close(got[1], ref[1], rtol=1e-6 if not bf16 else 1e-3, atol=0)
        torch.testing.assert_close(got[2], ref[2], rtol=1e-6 if not bf16 else 1e-3, atol=0)
        for a, b in zip(got[3:], ref[3:], strict=True):
            if b is None:
                assert a is None
                continue
            assert a.dtype == b.dtype == torch.float32
            torch.testing.assert_close(a, b, **tol)
        assert got[3][:, -2:].abs().max() == 0 and got[3][0, 0].abs().max() == 0  # padded positions: no gradient


@needs_kernels
def test_a_frozen_projection_gets_no_gradient_and_the_states_still_do():
    output, states, target = _inputs()
    ref = _run(output, states, target, 0.1, rows=0, bf16=False, grad_weight=False)
    got = _run(output, states, target, 0.1, rows=16, bf16=False, grad_weight=False)
    assert got[0] is True and got[4] is None and ref[4] is None
    torch.testing.assert_close(got[3], ref[3], rtol=1e-5, atol=1e-6)


def test_the_blocked_path_is_for_training_on_the_cpu_only(monkeypatch):
    output, states, target = _inputs()
    x = states.clone().requires_grad_()
    with fastpaths.override(output_loss_rows=16):
        with torch.no_grad():  # validation: nothing to differentiate
            assert not loss_module.blocked_output_applies(output, x, target, None)
        output.weight.requires_grad_(False)
        assert not loss_module.blocked_output_applies(output, states, target, None)  # nothing asks for a gradient
        assert loss_module.blocked_output_applies(output, x, target, None)  # the states do
        output.weight.requires_grad_(True)
        assert not loss_module.blocked_output_applies(output, x, target.int(), None)  # not int64 targets
        assert not loss_module.blocked_output_applies(output, x, target, torch.float16)
        with fastpaths.override(kernels=False):
            assert not loss_module.blocked_output_applies(output, x, target, None)
            loss, nll = output_loss_sums(output, x, target, 0.1, PAD)  # the fallback, still right
        logits = output(x)
        expected = loss_module.smoothed_nll_sums(logits, target, 0.1, PAD)
        torch.testing.assert_close(loss, expected[0])
        torch.testing.assert_close(nll, expected[1])
    with fastpaths.override(output_loss_rows=0):
        assert not loss_module.blocked_output_applies(output, x, target, None)


def test_the_models_states_project_to_its_logits():
    from transduce.config import ModelConfig
    from transduce.model import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=40)).eval()
    src, tgt = torch.randint(4, 40, (2, 7)), torch.randint(4, 40, (2, 5))
    with torch.no_grad():
        states = model(src, tgt, project_output=False)
        assert states.shape == (2, 5, model.config.d_model)
        torch.testing.assert_close(model.output(states), model(src, tgt))


@needs_kernels
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trainer_updates_agree_with_and_without_blocks(precision):
    """Three updates of a dropout-free model through Trainer.train_step, the projection and loss by blocks of 8 rows
    against over all rows: the same losses and weights (to the products' rounding)."""
    from transduce.config import Config, ModelConfig, TrainConfig
    from transduce.data import collate
    from transduce.model import Transformer
    from transduce.training.trainer import Trainer

    if precision == "bf16" and not torch.cpu._is_avx512_bf16_supported():
        pytest.skip("bf16 autocast is emulated on this CPU (slow, and not what the fast path is for)")
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        ids = lambda k: torch.randint(4, 50, (k,), generator=g).tolist()  # noqa: E731
        pairs = [(ids(k), ids(k + 2)) for k in (3, 6, 9, 4)]
        batches.append(collate(pairs))
    config = Config(
        model=ModelConfig.preset("test", src_vocab_size=50, tgt_vocab_size=50, dropout=0.0),
        train=TrainConfig(warmup_steps=2, precision=precision, label_smoothing=0.1),
    )
    results = []
    for rows in (0, 8):
        torch.manual_seed(0)
        trainer = Trainer(config, Transformer(config.model), torch.device("cpu"))
        assert trainer.output_with_loss
        with fastpaths.override(output_loss_rows=rows):
            losses = [trainer.train_step([b]).loss for b in batches]
        results.append((losses, [p.detach().clone() for p in trainer.model.parameters()]))
    (loss_a, params_a), (loss_b, params_b) = results
    tol = dict(rtol=1e-5, atol=1e-6) if precision == "fp32" else dict(rtol=2e-2, atol=2e-3)
    assert loss_a == pytest.approx(loss_b, rel=1e-5 if precision == "fp32" else 5e-3)
    for a, b in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(a, b, **tol)
