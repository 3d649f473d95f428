"""transduce's int8 product for quantised layers (csrc/int8.cpp, transduce.model.quantize.int8_function): the
weight layout, exact sums on inputs that quantise exactly, the error bound of per-row quantisation, rows that do not
depend on each other, the fallback to PyTorch's operation, and the checks' messages."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from decodekit import copy_sentences, one_thread
from transduce import fastpaths
from transduce.model import kernels, packed, quantize, step
from transduce.model.quantize import amx_applies, int8_function, pack_weight, quantize_int8
from transduce.search.translator import Translator

DynamicLinear = torch.ao.nn.quantized.dynamic.Linear


def _has_vnni_kernel() -> bool:
    if not fastpaths.settings.kernels:
        return False
    return hasattr(kernels.compiled(), "int8_linear")


needs_vnni = pytest.mark.skipif(
    not _has_vnni_kernel(), reason="the int8 kernel is built only for CPUs with AVX512-VNNI (and kernels on)"
)


# the two routes of int8_function's products: transduce's VNNI kernel, and the same product in AMX tiles
ROUTES = {"vnni": dict(int8_amx=False), "amx": dict(int8_amx=True)}


def _has_amx_int8_kernel() -> bool:
    return _has_vnni_kernel() and hasattr(kernels.compiled(), "int8_amx_linear") and kernels.compiled().amx_available()


@pytest.fixture(params=sorted(ROUTES))
def route(request):
    if request.param == "amx" and not _has_amx_int8_kernel():
        pytest.skip("the AMX int8 product is built only for CPUs with AMX-INT8 (and kernels on)")
    with fastpaths.override(**ROUTES[request.param]):
        yield request.param


def test_the_int8_kernel_is_built_where_the_cpu_has_vnni():
    """Where PyTorch reports AVX512-VNNI (and AVX-512), the kernels must be built with the int8 product."""
    vnni = getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
    avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
    if not fastpaths.settings.kernels or not (vnni and avx512 and bf16):
        pytest.skip("no AVX512-VNNI with AVX512-BF16 here (or kernels off): the int8 kernel is not built")
    assert _has_vnni_kernel()


def test_pack_weight_puts_each_vpdpbusd_operand_together():
    """Block j, group g, byte 4c + i holds w[16j + c, 4g + i]; padding rows and inputs are 0."""
    n, k = 19, 6
    w = torch.arange(n * k, dtype=torch.int16).remainder(251).sub(125).to(torch.int8).view(n, k)
    scales = torch.linspace(0.1, 1.0, n)
    p = pack_weight(w, scales, bias=torch.ones(n))
    assert p.weight.shape == (2, 2, 64) and p.weight.dtype == torch.int8 and p.outputs == n
    for j in range(2):
        for g in range(2):
            for c in range(16):
                for i in range(4):
                    row, col = 16 * j + c, 4 * g + i
                    expected = int(w[row, col]) if row < n and col < k else 0
                    assert int(p.weight[j, g, 4 * c + i]) == expected
    assert torch.equal(p.scales[:n], scales) and not p.scales[n:].any()
    assert p.sums.dtype == torch.int32 and torch.equal(p.sums[:n], w.sum(1, dtype=torch.int32))
    assert not p.sums[n:].any()


def _exact_rows(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows of whole multiples of 2^j (j from -3 to 2, by row) each spanning exactly 255 * 2^j (its minimum lo <= 0
    and lo + 255 * 2^j in it): each row's scale is 2^j and its zero point -lo / 2^j, so the quantisation is exact."""
    g = torch.Generator().manual_seed(seed)
    lo = -torch.randint(0, 256, (m, 1), generator=g)
    x = lo + torch.randint(0, 256, (m, k), generator=g)
    x[:, 0], x[:, -1] = lo[:, 0], lo[:, 0] + 255
    step = 2.0 ** (torch.arange(m) % 6 - 3)
    return x.float() * step[:, None]


@needs_vnni
@pytest.mark.parametrize("m, k, n", [(1, 4, 16), (9, 130, 77), (37, 128, 384), (8, 3, 50), (17, 256, 128)])
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_sums_exactly_when_the_rows_quantise_exactly(m, k, n, bias):
    """Tails of rows (tiles of 8), outputs (blocks of 48 and vectors of 16) and inputs (groups of 4), rows of
    different scales: the integer sums are exact, so the result is scale * sum + bias to float rounding."""
    g = torch.Generator().manual_seed(m * n + k)
    w = torch.randint(-128, 128, (n, k), generator=g).to(torch.int8)
    scales = torch.rand(n, generator=g) * 0.01 + 0.001
    b = torch.randn(n, generator=g) if bias else None
    x = _exact_rows(m, k, seed=k)
    p = pack_weight(w, scales, b)
    y = kernels.compiled().int8_linear(x, p.weight, p.scales, p.sums, p.bias, None, False, n)
    expected = (x.double() @ w.double().t()) * scales.double()
    expected = expected if b is None else expected + b.double()
    torch.testing.assert_close(y.double(), expected, rtol=1e-6, atol=1e-5)


def _quantised_linear(k: int, n: int, seed: int) -> tuple[nn.Linear, DynamicLinear]:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize_int8(nn.Sequential(lin), min_weights=0)[0]
    return lin, q


def _dequantised(q: DynamicLinear) -> torch.Tensor:
    return q.weight().dequantize()


@needs_vnni
@pytest.mark.parametrize("m, k, n", [(128, 128, 384), (5, 33, 20), (64, 256, 128)])
def test_error_is_within_half_a_step_of_each_rows_quantisation(m, k, n, route):
    """Against x W^T + b with the dequantised weight: each input is off by at most half its row's step s, so each
    output by at most s/2 * sum_k |W[n, k]| (plus float rounding)."""
    _, q = _quantised_linear(k, n, seed=k + n)
    x = torch.randn(m, k) * torch.rand(m, 1) * 4  # rows of different sizes
    x[0] = x[0].abs()  # a row of positive values (a ReLU's output): its range still holds 0
    w = _dequantised(q)
    y = int8_function(q)(x)
    exact = x.double() @ w.double().t() + q.bias().double()
    lo, hi = x.min(1).values.clamp(max=0), x.max(1).values.clamp(min=0)
    step = (hi - lo) / 255
    bound = step.double()[:, None] / 2 * w.abs().sum(1).double()[None, :] + 1e-5
    assert ((y.double() - exact).abs() <= bound).all()
    # and it is closer than fbgemm's (one scale for the whole input) on rows of different sizes
    fbgemm = torch.ops.quantized.linear_dynamic(x, q._packed_params._packed_params, reduce_range=True)
    assert (y.double() - exact).abs().mean() < (fbgemm.double() - exact).abs().mean()


@needs_vnni
def test_rows_do_not_depend_on_each_other(route):
    """Each row is quantised on its own: a row's output is the same alone or among others (bit for bit)."""
    _, q = _quantised_linear(128, 200, seed=3)
    x = torch.randn(21, 128)
    x[7] *= 100  # a row with large values would set fbgemm's one scale for all
    f = int8_function(q)
    together = f(x)
    for i in (0, 7, 8, 20):
        assert torch.equal(f(x[i : i + 1]), together[i : i + 1])


@needs_vnni
def test_relu_residual_bias_and_zero_rows(route):
    """The ReLU applies before the residual is added; a row of zeros gives the bias exactly."""
    _, q = _quantised_linear(64, 40, seed=5)
    x = torch.randn(10, 64)
    x[3] = 0
    residual = torch.randn(10, 40)
    f, relu = int8_function(q), int8_function(q, relu=True)
    y = f(x)
    assert torch.equal(y[3], q.bias())
    assert torch.equal(relu(x), y.clamp(min=0))
    torch.testing.assert_close(relu(x, residual), y.clamp(min=0) + residual, rtol=0, atol=1e-6)
    # rows read with their strides (the kernel's own path): x and the residual as columns of wider tensors
    wide_x, wide_residual = torch.randn(10, 100), torch.randn(10, 80)
    wide_x[:, 5:69] = x
    strided_x, strided_residual = wide_x[:, 5:69], wide_residual[:, :40]
    assert strided_x.stride(0) == 100 and strided_residual.stride(0) == 80
    assert torch.equal(f(strided_x, strided_residual), f(x, strided_residual.contiguous()))
    # 3-D inputs (reshaped to rows), and residuals that broadcast or are of another dtype (added after, as the
    # layer's own operation would)
    torch.testing.assert_close(f(x.view(2, 5, 64), residual.view(2, 5, 40)), (y + residual).view(2, 5, 40))
    assert torch.equal(f(x, residual[0]), y + residual[0])
    torch.testing.assert_close(f(x, residual.double()), y + residual, rtol=0, atol=1e-6)


@needs_vnni
def test_layers_without_bias_and_with_per_tensor_weights(route):
    torch.manual_seed(0)
    lin = nn.Linear(32, 24, bias=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_tensor = torch.ao.quantization.quantize_dynamic(
            nn.Sequential(lin), {nn.Linear: torch.ao.quantization.default_dynamic_qconfig}, dtype=torch.qint8
        )[0]
    assert per_tensor.weight().qscheme() == torch.per_tensor_affine
    x = torch.randn(6, 32)
    y = int8_function(per_tensor)(x)
    assert getattr(per_tensor, "_transduce_int8", None) is not None  # the kernel ran on it
    w = per_tensor.weight().dequantize()
    step = (x.max(1).values.clamp(min=0) - x.min(1).values.clamp(max=0)) / 255
    bound = step[:, None] / 2 * w.abs().sum(1)[None, :] + 1e-5
    assert ((y - x @ w.t()).abs() <= bound).all()


@needs_vnni
def test_weights_with_a_zero_point_or_too_many_inputs_go_to_pytorch(monkeypatch):
    """Affine weights with a nonzero zero point, and layers whose int32 sums could overflow, are not packed: the
    layer's own operation runs, bit for bit."""
    lin, q = _quantised_linear(32, 16, seed=2)
    affine = torch.quantize_per_channel(lin.weight.detach(), torch.full((16,), 0.01), torch.full((16,), 3), 0,
                                        torch.qint8)  # fmt: skip
    q.set_weight_bias(affine, lin.bias.detach())
    x = torch.randn(5, 32)
    assert torch.equal(int8_function(q)(x), q(x)) and getattr(q, "_transduce_int8", None) is None
    _, wide = _quantised_linear(32, 16, seed=4)
    monkeypatch.setattr(quantize, "MAX_INPUTS", 31)
    assert torch.equal(int8_function(wide)(x), wide(x)) and getattr(wide, "_transduce_int8", None) is None


@needs_vnni
def test_rows_with_nan_or_infinity_give_nan(route):
    """A row with a NaN or an infinity comes out NaN (a float product gives NaN or infinities there), not as finite
    values from a clamped row; the other rows are untouched. Rows of huge or tiny values stay exact to their
    quantisation."""
    _, q = _quantised_linear(64, 16, seed=6)
    f = int8_function(q)
    x = torch.randn(5, 64)
    clean = f(x)
    x[1, 10], x[2, 5], x[3, 63] = float("nan"), float("inf"), -float("inf")
    y = f(x)
    assert y[1:4].isnan().all()
    assert torch.equal(y[[0, 4]], clean[[0, 4]])
    w, b = _dequantised(q), q.bias()
    huge = torch.full((1, 64), 3e38)
    huge[0, :32] = -3e38  # max - min overflows float32
    step = 6e38 / 255
    bound = step / 2 * w.double().abs().sum(1) * 1.001  # half a step per input (the quantisation's bound)
    assert f(huge).isfinite().all()
    assert ((f(huge).double() - (huge.double() @ w.double().t() + b.double())).abs() <= bound).all()
    tiny = torch.randn(1, 64) * 1e-37  # 1 / scale would overflow: treated as zeros, off by about 1e-36
    torch.testing.assert_close(f(tiny), b[None], rtol=0, atol=1e-30)


@needs_vnni
@pytest.mark.parametrize("m, k, n", [(1, 4, 16), (9, 130, 77), (37, 128, 384), (17, 256, 128)])
def test_the_amx_route_sums_exactly_when_the_rows_quantise_exactly(m, k, n, route):
    """The same exact rows through int8_function (the fixture chooses the route), against the dequantised weight:
    the integer sums are exact, so the result is scale * sum + bias to float rounding, on either route."""
    _, q = _quantised_linear(k, n, seed=m + n)
    x = _exact_rows(m, k, seed=n)
    expected = x.double() @ _dequantised(q).double().t() + q.bias().double()
    torch.testing.assert_close(int8_function(q)(x).double(), expected, rtol=1e-6, atol=1e-4)


needs_amx_int8 = pytest.mark.skipif(
    not _has_amx_int8_kernel(), reason="the AMX int8 product is built only for CPUs with AMX-INT8 (and kernels on)"
)


@needs_amx_int8
@pytest.mark.parametrize("rows", [1, 15, 16, 17, 40, 130])
@pytest.mark.parametrize("inputs, outputs", [(64, 16), (128, 80), (192, 33), (256, 1000)])
def test_the_amx_product_gives_the_vnni_kernel_s_outputs_bit_for_bit(rows, inputs, outputs):
    """The same quantised rows and weights, the same exact int32 sums, the same formula: the same floats, with the
    bias, the ReLU and a residual read through its row stride, for rows and outputs that fill no whole tile."""
    k8 = kernels.compiled()
    _, q = _quantised_linear(inputs, outputs, seed=rows + inputs)
    pw = quantize._packed_int8(q)
    x = torch.randn(rows, inputs) * 3
    residual = torch.randn(rows, outputs + 7)[:, 3 : outputs + 3]
    for bias, res, relu in [(pw.bias, None, False), (None, residual, True), (pw.bias, residual, True)]:
        args = (pw.weight, pw.scales, pw.sums, bias, res, relu, outputs)
        assert torch.equal(k8.int8_amx_linear(x, *args), k8.int8_linear(x, *args))


@needs_amx_int8
def test_the_amx_route_takes_layers_whose_inputs_fill_whole_tiles_and_the_flag_turns_it_off(monkeypatch):
    """int8_function takes the AMX product for inputs that are a multiple of 64 (else, and with int8_amx off, the
    VNNI kernel); both give the same outputs."""
    k8 = kernels.compiled()
    calls = []
    real = k8.int8_amx_linear
    monkeypatch.setattr(k8, "int8_amx_linear", lambda *a: calls.append(a[0].shape) or real(*a), raising=False)
    _, q = _quantised_linear(128, 80, seed=12)
    _, odd = _quantised_linear(96, 80, seed=13)
    x, residual = torch.randn(40, 128), torch.randn(40, 80)
    with fastpaths.override(int8_amx=False):
        kernel = int8_function(q, relu=True)(x, residual)
        assert not amx_applies(k8, quantize._packed_int8(q))
    assert calls == []
    with fastpaths.override(int8_amx=True):
        assert amx_applies(k8, quantize._packed_int8(q)) and not amx_applies(k8, quantize._packed_int8(odd))
        assert torch.equal(int8_function(q, relu=True)(x, residual), kernel)
        assert calls == [(40, 128)]
        int8_function(odd)(torch.randn(3, 96))
    assert calls == [(40, 128)]


@pytest.mark.parametrize("flags, amx", [("avx512f avx512_vnni amx_bf16 amx_tile amx_int8", True),
                                        ("avx512f avx512_vnni avx512_bf16", False)])  # fmt: skip
def test_the_amx_route_is_on_by_default_only_where_the_cpu_has_amx_int8(monkeypatch, flags, amx):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(fastpaths, "cpu_flags", lambda: set(flags.split()))
    assert fastpaths.FastPaths().int8_amx is amx


@needs_amx_int8
def test_the_amx_product_refuses_a_weight_it_cannot_take_in_one_line():
    k8 = kernels.compiled()
    _, q = _quantised_linear(96, 16, seed=1)  # 96 inputs: not a whole number of tiles
    p = quantize._packed_int8(q)
    with pytest.raises(RuntimeError, match=r"int8_amx_linear: the weight's inputs must be a multiple of 64, got 96"):
        k8.int8_amx_linear(torch.ones(2, 96), p.weight, p.scales, p.sums, None, None, False, 16)
    with pytest.raises(RuntimeError, match=r"int8_amx_linear: x must be a 2-D Float CPU tensor, got 1-D Float"):
        k8.int8_amx_linear(torch.ones(3), p.weight, p.scales, p.sums, None, None, False, 16)


@needs_vnni
def test_the_kernel_is_used_by_project_and_the_flag_turns_it_off(monkeypatch):
    """packed.project (the encoder's layers) and the decoding step's linear layers both reach the kernel; with
    fastpaths.settings.int8_kernel off, the layer's own forward (fbgemm) runs, bit for bit."""
    _, q = _quantised_linear(128, 64, seed=9)
    x = torch.randn(3, 7, 128)
    with torch.no_grad():
        kernel = packed.project(q, x)
        assert getattr(q, "_transduce_int8", None) is not None  # packed: the kernel ran
        assert not torch.equal(kernel, q(x))  # (per-row scales: not fbgemm's results)
        assert torch.equal(kernel, int8_function(q)(x))
        step_linear = step._int8_linear(q, relu=True)
        assert torch.equal(step_linear(x.view(21, 128)), kernel.view(21, 64).relu())
        with pytest.raises(KeyError, match="no fused activation 'gelu' for a quantised layer"):
            packed.project(q, x, "gelu")
        monkeypatch.setattr(fastpaths.settings, "int8_kernel", False)
        assert torch.equal(packed.project(q, x), q(x))
        assert torch.equal(packed.project(q, x, "relu"), q(x).relu())
        assert torch.equal(step._int8_linear(q, relu=True)(x.view(21, 128)), q(x).view(21, 64).relu())


@needs_vnni
def test_a_layer_given_new_weights_is_packed_again():
    lin, q = _quantised_linear(16, 16, seed=11)
    x = torch.randn(4, 16)
    before = int8_function(q)(x)
    zeros = torch.zeros(16, dtype=torch.long)
    negated = torch.quantize_per_channel(-lin.weight.detach(), torch.full((16,), 0.01), zeros, 0, torch.qint8)
    q.set_weight_bias(negated, None)
    after = int8_function(q)(x)
    torch.testing.assert_close(after, x @ negated.dequantize().t(), atol=0.05, rtol=0)
    assert not torch.allclose(before, after, atol=0.05)


@needs_vnni
def test_kernel_checks_name_the_argument():
    p = pack_weight(torch.ones(16, 8, dtype=torch.int8), torch.ones(16))
    k8 = kernels.compiled()
    with pytest.raises(RuntimeError, match=r"int8_linear: x has 12 inputs, the weight 8 \(padded to 4\)"):
        k8.int8_linear(torch.ones(2, 12), p.weight, p.scales, p.sums, None, None, False, 16)
    with pytest.raises(RuntimeError, match=r"int8_linear: 40 outputs, the weight holds 16 \(padded to 16\)"):
        k8.int8_linear(torch.ones(2, 8), p.weight, p.scales, p.sums, None, None, False, 40)
    with pytest.raises(RuntimeError, match=r"int8_linear: residual must be \(2, 16\) with dense rows"):
        k8.int8_linear(torch.ones(2, 8), p.weight, p.scales, p.sums, None, torch.ones(3, 16), False, 16)
    with pytest.raises(RuntimeError, match=r"int8_linear: x must be a 2-D Float CPU tensor, got 2-D Double"):
        k8.int8_linear(torch.ones(2, 8, dtype=torch.float64), p.weight, p.scales, p.sums, None, None, False, 16)
    with pytest.raises(RuntimeError, match=r"int8_linear: sums must be a 1-D Int CPU tensor, got 1-D Float"):
        k8.int8_linear(torch.ones(2, 8), p.weight, p.scales, p.sums.float(), None, None, False, 16)
    big = pack_weight(torch.ones(16, 65796, dtype=torch.int8), torch.ones(16))
    with pytest.raises(RuntimeError, match=r"int8_linear: at most 65792 inputs \(the int32 sums could overflow\), "
                                           r"got 65796"):  # fmt: skip
        k8.int8_linear(torch.ones(1, 65796), big.weight, big.scales, big.sums, None, None, False, 16)
    assert quantize.MAX_INPUTS == 65792


@needs_vnni
def test_an_int8_sentence_translates_the_same_alone_or_in_a_batch(copy_checkpoint: Path, monkeypatch):
    """Per-row scales: a sentence's int8 translation does not depend on its batch-mates, and its score only by the
    float32 attention's rounding over padded keys (about 1e-7). With fbgemm's one scale per call it did: scores
    here 0.4% apart, and 53 of the first 64 Multi30k test sentences came out the same alone as in one batch."""
    monkeypatch.setattr(fastpaths.settings, "int8_min_weights", 0)  # (the test model's layers are small)
    tr = Translator.load(copy_checkpoint, quantize="int8")
    sentences = copy_sentences(24, seed=3)
    with one_thread():
        batched = tr.translate_nbest(sentences, nbest=1)
        alone = [tr.translate_nbest([s], nbest=1)[0] for s in sentences]
    assert [b[0].text for b in batched] == [a[0].text for a in alone]
    torch.testing.assert_close([b[0].score for b in batched], [a[0].score for a in alone], rtol=1e-4, atol=1e-6)


@needs_amx_int8
@pytest.mark.parametrize("rows, inputs, outputs, k", [(1, 64, 3, 3), (17, 128, 1001, 8), (130, 128, 8000, 8),
                                                      (40, 192, 520, 520)])  # fmt: skip
def test_the_int8_fused_candidates_are_row_candidates_of_the_amx_products_logits(rows, inputs, outputs, k):
    """int8_amx_candidates gives what row_candidates gives for int8_amx_linear's logits: the same values and ids,
    the normalisers up to the order of summation; the excluded ids (at the edges of its 256-output chunks too) are
    left out of the top k."""
    k8 = kernels.compiled()
    _, q = _quantised_linear(inputs, outputs, seed=outputs)
    pw = quantize._packed_int8(q)
    x = torch.randn(rows, inputs) * 3
    excluded = torch.tensor(sorted(i for i in {0, 2, 255, 256, 511, outputs - 1} if i < outputs))
    for bias in (pw.bias, None):
        logits = k8.int8_amx_linear(x, pw.weight, pw.scales, pw.sums, bias, None, False, outputs)
        normalisers, values, indices = k8.int8_amx_candidates(
            x, pw.weight, pw.scales, pw.sums, bias, outputs, k, excluded
        )
        expected = kernels.row_candidates(logits.clone(), k, excluded)
        assert torch.equal(values, expected[1]) and torch.equal(indices, expected[2])
        torch.testing.assert_close(normalisers, torch.logsumexp(logits, dim=1), atol=1e-5, rtol=1e-6)
    with pytest.raises(RuntimeError, match=rf"int8_amx_candidates: need 1 <= k <= outputs, got k={outputs + 1}, "):
        k8.int8_amx_candidates(x, pw.weight, pw.scales, pw.sums, None, outputs, outputs + 1, excluded[:0])
    with pytest.raises(RuntimeError, match=rf"int8_amx_candidates: excluded id {outputs} is out of range"):
        k8.int8_amx_candidates(x, pw.weight, pw.scales, pw.sums, None, outputs, 1, torch.tensor([outputs]))


@needs_amx_int8
def test_an_int8_beam_search_finds_with_the_fused_candidates_what_it_finds_from_written_logits():
    """A quantised `tiny`-shaped model (its layers' inputs whole AMX tiles): the search that reduces the logits as
    the AMX product makes them gives the n-best lists of the search that writes them, the scores up to the
    normalisers' order of summation; with a minimum length and output limits that the sentences reach (the steps
    at the limit take the written logits)."""
    from transduce import ModelConfig, Transformer
    from transduce.config import DecodeConfig
    from transduce.search import candidates as search_candidates
    from transduce.search import generate

    torch.manual_seed(3)
    model = quantize_int8(Transformer(ModelConfig.preset("tiny", src_vocab_size=300, tgt_vocab_size=300)).eval())
    with torch.inference_mode():  # (as a search runs)
        assert search_candidates._fused_output(model) is not None
    src = torch.randint(4, 300, (6, 9))
    src[:, -1] = model.config.eos_id
    results = []
    with one_thread():
        for fused in (True, False):
            for decode in (DecodeConfig(beam=4, nbest=4, min_len=3, max_len_b=12), DecodeConfig(beam=4, max_len_b=4)):
                with fastpaths.override(fused_candidates=fused):
                    results.append(generate(model, src, decode))
    for got, expected in zip(results[:2], results[2:], strict=True):
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]
        assert [h.score for hyps in got for h in hyps] == pytest.approx(
            [h.score for hyps in expected for h in hyps], abs=1e-4
        )
