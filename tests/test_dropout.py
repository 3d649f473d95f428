"""The CPU dropout (transduce.model.fused.dropout): distribution, scaling, gradient, seeding, fallbacks."""

import pytest
import torch
import torch.nn.functional as F

import transduce.model.fused as fused
from transduce.model import kernels
from transduce.model.fused import Dropout, dropout

needs_kernels = pytest.mark.skipif(kernels.compiled() is None, reason="transduce's CPU kernels could not be built")


@pytest.fixture(params=["kernel", "pytorch"])
def path(request, monkeypatch):
    """Run a test through the compiled kernel and through the PyTorch fallback (the same masks)."""
    if request.param == "kernel":
        if kernels.compiled() is None:
            pytest.skip("transduce's CPU kernels could not be built")
    else:
        monkeypatch.setattr(kernels, "compiled", lambda: None)
    return request.param


def test_drop_rate_scale_and_zeros_on_every_16_bit_lane(path):
    """Each 32-bit word feeds two elements, 8 apart in a block of 16: every one of the 16 positions of a block must
    drop at the rate p (a position fed by a biased part of the word would drop all or nothing)."""
    torch.manual_seed(0)
    p, n = 0.3, 400_000
    out = dropout(torch.ones(n), p, True)
    levels = round((1 - p) * 65536)  # 45,875 of 65,536 draws keep an element
    kept = out != 0
    assert torch.equal(out[kept], torch.full_like(out[kept], 65536 / levels))  # 1 / P(keep), exactly
    sigma = (p * (1 - p) / (n / 16)) ** 0.5
    for lane in range(16):
        rate = 1.0 - kept[lane::16].double().mean().item()
        assert abs(rate - p) < 5 * sigma, (lane, rate)
    assert abs(out.double().mean().item() - 1.0) < 0.01  # the expectation is preserved


def test_half_rate_lanes_and_pairs_are_unbiased_and_independent(path):
    """Rates per position, and the joint rate of elements that share a word (i, i + 8), neighbours (i, i + 1) and
    the same position of consecutive blocks (i, i + 16): 1/4 each if independent."""
    torch.manual_seed(1)
    kept = (dropout(torch.ones(320_000), 0.5, True) != 0).view(-1, 16).double()
    for lane in range(16):
        assert abs(kept[:, lane].mean().item() - 0.5) < 0.015
    pairs = [(kept[:, :8], kept[:, 8:]), (kept[:, :-1], kept[:, 1:]), (kept[:-1], kept[1:])]
    for a, b in pairs:
        assert abs((a * b).mean().item() - 0.25) < 0.005


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_masks_equal_the_pytorch_reference(dtype):
    """The compiled kernel against :func:`fused.dropout_draws` written with PyTorch's operations: the same kept
    elements and values, for sizes around the 16-element blocks and across the kernel's parallel chunks."""
    module = kernels.compiled()
    g = torch.Generator().manual_seed(2)
    for n in (1, 15, 16, 17, 31, 1000, 70_001):
        x = torch.randn(n, generator=g).to(dtype)
        for seed, levels in ((3, 1), (-(2**63), 32768), (2**63 - 1, 45875), (123456789123, 65535)):
            scale = 65536 / levels
            expected = torch.where(fused.dropout_draws(n, seed) < levels, x * scale, torch.zeros((), dtype=dtype))
            assert torch.equal(module.dropout_apply(x, seed, levels, scale), expected), (n, seed, levels)


def test_exactly_levels_of_the_65536_draws_keep(monkeypatch):
    """Every 16-bit value once: the threshold keeps exactly round((1 - p) * 2^16) of them (an off-by-one in the
    comparison would keep one more or one fewer, far below what a sampled rate could show). The kernel compares
    the same way (test_kernel_masks_equal_the_pytorch_reference)."""
    every_value = torch.arange(2**16, dtype=torch.int64)
    monkeypatch.setattr(kernels, "compiled", lambda: None)
    monkeypatch.setattr(fused, "dropout_draws", lambda n, seed, device: every_value[:n])
    for p in (0.1, 0.3, 0.5, 0.9, 1e-6):
        kept = int(dropout(torch.ones(2**16), p, True).ne(0).sum())
        assert kept == round((1 - p) * 65536), p


def test_the_draws_follow_the_documented_hash():
    """Hand-computed words of the documented hash, mix32(mix32(lo32(j) ^ lo32(seed)) ^ (hi32(j) + hi32(seed))),
    against dropout_draws' 16-bit halves (elements 0 and 8 share word 0; element 17 takes word 9's low half)."""

    def mix32(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    seed = 0x0123456789ABCDEF
    word = [mix32(mix32(j ^ 0x89ABCDEF) ^ 0x01234567) for j in range(10)]
    draws = fused.dropout_draws(18, seed).tolist()
    assert draws[0] == word[0] & 0xFFFF and draws[8] == word[0] >> 16 and draws[17] == word[9] & 0xFFFF
    assert draws[:8] == [w & 0xFFFF for w in word[:8]] and draws[8:16] == [w >> 16 for w in word[:8]]


def test_low_precision_input_is_scaled_by_the_unrounded_factor(path):
    """In bfloat16 the factor 1 / 0.9 = 1.11112 itself would round to 1.109375, 0.16% low on every kept element; the
    product x * factor rounded once per element is unbiased on average."""
    torch.manual_seed(6)
    x = (1 + torch.rand(200_000)).to(torch.bfloat16).requires_grad_()
    out = dropout(x, 0.1, True)
    assert out.dtype == torch.bfloat16
    kept = out.detach() != 0
    scale = 65536 / round(0.9 * 65536)
    ratio = out.detach()[kept].double().sum() / x.detach()[kept].double().sum()
    assert abs(ratio.item() / scale - 1) < 2e-4
    out.backward(torch.ones_like(out))
    assert not x.grad[~kept].any() and x.grad[kept].unique().tolist() == [1.109375]  # bfloat16(scale)


def test_probability_outside_zero_one_is_refused():
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"dropout probability has to be between 0 and 1, but got {p}"):
            dropout(torch.ones(3), p, True)


def test_gradient_is_the_same_mask(path):
    torch.manual_seed(2)
    x = torch.randn(64, 48, requires_grad=True)
    out = dropout(x, 0.25, True)
    assert out.grad_fn.saved_tensors == ()  # no mask kept: the backward pass recomputes it from the seed
    upstream = torch.randn(64, 48)
    out.backward(upstream)
    kept = out.detach() != 0
    mask = kept * torch.tensor(65536 / round(0.75 * 65536), dtype=torch.float32)
    assert torch.equal(out.detach(), x.detach() * mask)
    assert torch.equal(x.grad, upstream * mask)
    torch.autograd.gradcheck(lambda t: (torch.manual_seed(3), dropout(t, 0.4, True))[1], torch.randn(5, 7).double()
                             .requires_grad_())  # fmt: skip


def test_seeded_and_fresh_masks(path):
    x = torch.randn(1000)
    torch.manual_seed(7)
    a = dropout(x, 0.3, True)
    b = dropout(x, 0.3, True)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.3, True), a)
    assert not torch.equal(a, b)


def test_identity_in_eval_and_at_zero_and_all_dropped_at_one():
    x = torch.randn(10, 3)
    assert dropout(x, 0.3, False) is x and dropout(x, 0.0, True) is x
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))


def test_odd_sizes_and_non_contiguous_input(path):
    torch.manual_seed(4)
    x = torch.randn(7, 5, 3).transpose(0, 2)  # 105 elements: not a multiple of four, and not contiguous
    out = dropout(x, 0.5, True)
    assert out.shape == x.shape
    kept = out != 0
    torch.testing.assert_close(out[kept], x[kept] * 2.0)


def test_module_and_pytorchs_dropout_where_no_draw_keeps(monkeypatch):
    """The module is the function; a drop probability within 2^-17 of 1, where no 16-bit draw would keep an element,
    goes to PyTorch's dropout (which keeps a few)."""
    module = Dropout(0.3)
    assert isinstance(module, torch.nn.Dropout) and module.p == 0.3
    x = torch.randn(50, 20)
    module.eval()
    assert module(x) is x
    module.train()
    torch.manual_seed(5)
    expected = dropout(x, 0.3, True)
    torch.manual_seed(5)
    assert torch.equal(module(x), expected)
    p = 1.0 - 2.0**-18
    assert fused._keep_levels(p) == 0
    torch.manual_seed(6)
    expected = F.dropout(x, p, True)
    torch.manual_seed(6)
    assert torch.equal(dropout(x, p, True), expected)


def test_model_uses_it():
    from transduce import ModelConfig, Transformer

    model = Transformer(ModelConfig.preset("test", src_vocab_size=20, tgt_vocab_size=20, activation_dropout=0.1))
    kinds = {type(m) for m in model.modules() if isinstance(m, torch.nn.Dropout)}
    assert kinds == {Dropout}


def test_a_second_order_gradient_through_dropout_is_refused(path):
    """The backward pass is not itself differentiable: asking for it must fail loudly, not silently drop the
    dropout branch of a second-order gradient."""
    torch.manual_seed(6)
    x = torch.randn(40, requires_grad=True)
    (g,) = torch.autograd.grad(dropout(x, 0.5, True).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()
