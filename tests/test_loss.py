"""Label-smoothed cross-entropy: a hand-computed value, padding ignored, eps = 0 is plain cross-entropy."""

import math

import pytest
import torch
import torch.nn.functional as F

from transduce import fastpaths
from transduce.model import kernels
from transduce.training.loss import label_smoothed_nll

needs_kernels = pytest.mark.skipif(kernels.compiled() is None, reason="transduce's CPU kernels could not be built")

PAD = 0


def test_smoothed_loss_equals_hand_computed_value():
    # one position, vocabulary of 5: probabilities from these logits, reference 2, eps 0.1
    logits = torch.tensor([[[0.5, 1.0, 2.0, -1.0, 0.0]]])
    target = torch.tensor([[2]])
    p = [math.exp(x) for x in (0.5, 1.0, 2.0, -1.0, 0.0)]
    z = sum(p)
    logp = [math.log(x / z) for x in p]
    # 0.9 on the reference, 0.1 / (5 - 2) on each of tokens 1, 3, 4 (neither reference nor pad)
    expected = -(0.9 * logp[2] + 0.1 / 3 * (logp[1] + logp[3] + logp[4]))
    loss, nll, n = label_smoothed_nll(logits, target, 0.1, PAD)
    assert n == 1
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert nll.item() == pytest.approx(-logp[2], rel=1e-6)


def test_padding_positions_contribute_nothing():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    target = torch.tensor([[3, 4, 2, PAD], [5, 2, PAD, PAD]])
    loss, nll, n = label_smoothed_nll(logits, target, 0.1, PAD)
    garbage = logits.clone()
    garbage[0, 3] = 1e4  # whatever the model predicts at padded positions
    garbage[1, 2:] = -1e4
    loss2, nll2, n2 = label_smoothed_nll(garbage, target, 0.1, PAD)
    assert n == n2 == 5
    assert torch.allclose(loss, loss2) and torch.allclose(nll, nll2)
    only_real = label_smoothed_nll(logits[0:1, :3], target[0:1, :3], 0.1, PAD)[0]
    only_real = only_real + label_smoothed_nll(logits[1:2, :2], target[1:2, :2], 0.1, PAD)[0]
    assert torch.allclose(loss, only_real)


def test_zero_smoothing_is_cross_entropy_and_gradients_flow():
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    target = torch.randint(1, 11, (3, 5))
    target[2, 3:] = PAD
    loss, nll, _ = label_smoothed_nll(logits, target, 0.0, PAD)
    ref = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD, reduction="sum")
    assert torch.allclose(loss, ref) and torch.allclose(nll, ref.detach())
    loss.backward()
    assert logits.grad is not None and logits.grad[2, 3:].abs().sum() == 0


def test_smoothing_raises_loss_above_nll_for_a_confident_model():
    logits = torch.tensor([[[0.0, -5.0, 10.0, -5.0, -5.0]]])
    loss, nll, _ = label_smoothed_nll(logits, torch.tensor([[2]]), 0.1, PAD)
    assert loss.item() > nll.item()


def _reference(logits, target, eps, pad_id):
    """The loss written with autograd-visible operations only: log_softmax, row selection, gather."""
    vocab = logits.shape[-1]
    lprobs = F.log_softmax(logits.float(), dim=-1).reshape(-1, vocab)
    target = target.reshape(-1)
    keep = target != pad_id
    lprobs, target = lprobs[keep], target[keep]
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)
    others = -(lprobs.sum(dim=1) - lprobs[:, pad_id]) - nll
    return ((1.0 - eps) * nll + eps / (vocab - 2) * others).sum(), nll.sum()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_closed_form_gradient_equals_autograd_of_the_formula(eps):
    torch.manual_seed(2)
    logits = (3 * torch.randn(4, 6, 13)).requires_grad_()
    target = torch.randint(1, 13, (4, 6))
    target[1, 3:] = PAD
    target[3, 0] = PAD
    ref_loss, ref_nll = _reference(logits, target, eps, PAD)
    (ref_grad,) = torch.autograd.grad(2.5 * ref_loss, logits)
    loss, nll, n = label_smoothed_nll(logits, target, eps, PAD)
    (grad,) = torch.autograd.grad(2.5 * loss, logits)
    assert n == int(target.ne(PAD).sum())
    torch.testing.assert_close(loss, ref_loss.detach(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(nll, ref_nll.detach(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-5)


def test_non_finite_logits_at_padded_positions_change_nothing():
    torch.manual_seed(3)
    logits = torch.randn(2, 3, 9)
    target = torch.tensor([[4, 5, PAD], [6, PAD, PAD]])
    bad = logits.clone()
    bad[0, 2] = float("nan")
    bad[1, 1:] = float("inf")
    x, y = logits.clone().requires_grad_(), bad.clone().requires_grad_()
    a, b = label_smoothed_nll(x, target, 0.1, PAD)[0], label_smoothed_nll(y, target, 0.1, PAD)[0]
    a.backward()
    b.backward()
    assert torch.equal(a, b) and torch.isfinite(b)
    assert torch.equal(x.grad, y.grad) and y.grad[0, 2].abs().sum() == 0


def test_a_second_backward_through_the_same_loss_is_refused(monkeypatch):
    """PyTorch's path turns the saved log-probabilities into the gradient in place: running it twice must fail
    loudly (autograd's version check), not return a gradient computed from overwritten values."""
    monkeypatch.setattr(fastpaths.settings, "kernels", False)
    logits = torch.randn(2, 3, 9, requires_grad=True)
    loss = label_smoothed_nll(logits, torch.tensor([[4, 5, 6], [7, 8, PAD]]), 0.1, PAD)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _both_paths(logits, target, eps, monkeypatch):
    out = []
    for fused in (True, False):
        monkeypatch.setattr(fastpaths.settings, "kernels", fused)
        x = logits.clone().requires_grad_()
        loss, nll, n = label_smoothed_nll(x, target, eps, PAD)
        (1.5 * loss).backward()
        out.append((loss.detach(), nll, n, x.grad))
    return out


@needs_kernels
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernel_equals_pytorchs_path(eps, dtype, monkeypatch):
    """The compiled loss against :class:`_SmoothedNLL` (PyTorch's operations) on a vocabulary that is not a multiple
    of the kernel's 8-wide vectors, with padded positions and -inf logits (zero probabilities): the same loss and
    NLL to float32 rounding, and the gradient in the logits' dtype (bfloat16 values equal but for a rare rounding
    tie of the last bit)."""
    torch.manual_seed(4)
    logits = (4 * torch.randn(37, 1003)).to(dtype)
    # -inf: a zero probability (with smoothing, the loss of such a row is +inf: mass on an impossible token)
    logits[5, 17] = logits[9, 1:40] = float("-inf") if eps == 0 else -1e4
    target = torch.randint(1, 1003, (37,))
    target[::6] = PAD
    (fl, fn, fc, fg), (rl, rn, rc, rg) = _both_paths(logits, target, eps, monkeypatch)
    assert fc == rc == 30 and fg.dtype == rg.dtype == dtype
    torch.testing.assert_close(fl, rl, atol=0, rtol=2e-6)
    torch.testing.assert_close(fn, rn, atol=0, rtol=2e-6)
    if dtype == torch.float32:
        torch.testing.assert_close(fg, rg, atol=1e-7, rtol=1e-5)
    else:
        assert (fg != rg).float().mean() < 1e-3 and torch.allclose(fg.float(), rg.float(), atol=1e-3, rtol=1e-2)
    assert fg[::6].abs().max() == 0  # padded positions


@needs_kernels
def test_fused_kernel_gives_nan_for_a_nan_or_inf_row_and_ignores_padded_ones(monkeypatch):
    torch.manual_seed(5)
    logits = torch.randn(4, 50)
    logits[0, 3] = float("nan")
    logits[1, 7] = float("inf")
    logits[2] = float("nan")  # padded below: contributes nothing
    target = torch.tensor([4, 5, PAD, 6])
    monkeypatch.setattr(fastpaths.settings, "kernels", True)
    x = logits.clone().requires_grad_()
    loss, nll, n = label_smoothed_nll(x, target, 0.1, PAD)
    loss.backward()
    assert n == 3 and loss.isnan() and nll.isnan()
    assert x.grad[:2].isnan().all() and x.grad[2].abs().max() == 0 and torch.isfinite(x.grad[3]).all()
    ref = x.grad[3].clone()
    y = logits[3:].clone().requires_grad_()
    label_smoothed_nll(y, target[3:], 0.1, PAD)[0].backward()
    assert torch.equal(ref, y.grad[0])  # the NaN rows do not leak into the others


@needs_kernels
def test_fused_kernel_refuses_a_target_outside_the_vocabulary(monkeypatch):
    monkeypatch.setattr(fastpaths.settings, "kernels", True)
    with pytest.raises(RuntimeError, match="target 50 at position 1 is outside the vocabulary of 50"):
        label_smoothed_nll(torch.randn(2, 50), torch.tensor([3, 50]), 0.1, PAD)


@needs_kernels
def test_fused_kernel_takes_bfloat16_logits_without_a_float32_copy(monkeypatch):
    """Under bf16 autocast the gradient reaches the logits in bfloat16 straight from the kernel (PyTorch's path makes
    a float32 copy and casts its gradient back)."""
    monkeypatch.setattr(fastpaths.settings, "kernels", True)
    x = torch.randn(6, 40, dtype=torch.bfloat16, requires_grad=True)
    loss = label_smoothed_nll(x, torch.tensor([4, 5, 6, 7, 8, PAD]), 0.1, PAD)[0]
    node, names = loss.grad_fn, []
    while not hasattr(node, "variable"):  # down to x's AccumulateGrad
        names.append(type(node).__name__)
        node = node.next_functions[0][0]
    assert node.variable is x and "_FusedSmoothedNLLBackward" in names and "ToCopyBackward0" not in names, names
