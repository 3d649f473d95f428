"""CPU-feature detection and the choices it drives (patched CPU reports: AVX2 only, AVX-512, AVX512-BF16, AMX), and
bf16 decoding (transduce.model.bf16): oneDNN's product against its fallback, bf16 against fp32 translations of a
trained model, and ``precision="auto"``."""

from __future__ import annotations

import logging
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn

from decodekit import copy_sentences, one_thread
from transduce import fastpaths
from transduce.config import DecodeConfig
from transduce.model import bf16, kernels
from transduce.model.quantize import quantize_int8
from transduce.search import candidates as search_candidates
from transduce.search.translator import Translator

INTEL, AMD = "GenuineIntel", "AuthenticAMD"
# (vendor, PyTorch's capability, VNNI, AVX512-BF16, AMX-BF16/INT8): CPU kinds as PyTorch and /proc/cpuinfo report them
AVX2_INTEL = fastpaths.CpuFeatures(INTEL, "AVX2", False, False, False, False)  # e.g. a desktop Core, Haswell Xeon
AVX2_AMD = fastpaths.CpuFeatures(AMD, "AVX2", False, False, False, False)  # e.g. EPYC Zen 2/3
AVX512_INTEL = fastpaths.CpuFeatures(INTEL, "AVX512", True, False, False, False)  # Cascade Lake
BF16_AMD = fastpaths.CpuFeatures(AMD, "AVX512", True, True, False, False)  # Zen 4 / Zen 5
AMX_INTEL = fastpaths.CpuFeatures(INTEL, "AVX512", True, True, True, True)  # Sapphire Rapids on


@pytest.mark.parametrize(
    "cpu, kind, onednn_layers, transposed, int8_min_weights, precision, by_position",
    [(AVX2_INTEL, "AVX2", False, False, 1 << 16, "fp32", 400),
     (AVX2_AMD, "AVX2", False, False, 1 << 16, "fp32", 400),
     (AVX512_INTEL, "AVX512", False, True, 0, "fp32", 100),
     (BF16_AMD, "AVX512-BF16", True, False, 0, "fp32", 400),
     (AMX_INTEL, "AMX", False, True, 0, "bf16", 100)],
)  # fmt: skip
def test_the_cpu_kind_drives_the_fast_paths_and_the_decoding_precision(
    monkeypatch, cpu, kind, onednn_layers, transposed, int8_min_weights, precision, by_position
):  # (and transduce's AMX kernel for bf16 products only where the CPU has AMX-BF16)
    """oneDNN for every fp32 layer only on AMD with AVX-512 (MKL stops at AVX2 there); transposed weight copies
    (MKL's plain product) instead of oneDNN's packed output layer on Intel with AVX-512; int8 for every layer where
    there is VNNI; bf16 decoding under ``auto`` only with AMX (and oneDNN); the self-attention cache stored by
    position from 100 source tokens on Intel with AVX-512, from 400 elsewhere."""
    monkeypatch.setattr(fastpaths, "cpu_features", lambda: cpu)
    assert cpu.kind == kind
    paths = fastpaths.FastPaths()
    assert paths.onednn_layers is (onednn_layers and fastpaths.onednn_available())
    assert paths.transposed_weights is transposed
    assert paths.onednn is (not transposed and fastpaths.onednn_available())
    assert paths.int8_min_weights == int8_min_weights
    assert paths.by_position_min_source == by_position == fastpaths.by_position_threshold(cpu)
    assert paths.bf16_amx is (kind == "AMX")
    assert fastpaths.decode_precision()[0] == (precision if fastpaths.onednn_available() else "fp32")
    assert fastpaths.decode_precision(cpu) == fastpaths.decode_precision()


@pytest.mark.parametrize(
    "capability, flags, expected",
    [("AVX512", "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", (True, True, True)),
     ("AVX512", "fpu avx2 avx512f avx512_bf16", (True, False, False)),
     ("AVX512", "fpu avx2 avx512f", (False, False, False)),
     ("AVX2", "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_int8", (False, False, False)),  # PyTorch without AVX-512
     ("DEFAULT", "", (False, False, False))],
)  # fmt: skip
def test_cpu_features_reads_the_flags_and_counts_them_only_with_avx512(monkeypatch, capability, flags, expected):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(fastpaths, "_cpuinfo", lambda name: {"flags": flags, "vendor_id": INTEL}.get(name, ""))
    cpu = fastpaths.cpu_features()
    assert (cpu.avx512_bf16, cpu.amx_bf16, cpu.amx_int8) == expected
    assert cpu.vendor == INTEL and cpu.capability == capability


def test_this_machines_features_agree_with_proc_cpuinfo():
    cpu = fastpaths.cpu_features()
    try:
        flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
                    .split(":", 1)[1].split())  # fmt: skip
    except (OSError, StopIteration):
        flags = set()
    avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    assert cpu.amx_bf16 == (avx512 and "amx_bf16" in flags)
    assert cpu.avx512_bf16 == (avx512 and "avx512_bf16" in flags)


# ----------------------------------------------------------------------------------------------------------------------
# the bf16 product


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [True, False])
def test_onednn_and_the_fallback_give_the_same_bf16_products(bias, relu):
    """The fast path (oneDNN, packed weight) and the fallback (F.linear on bf16) round at the same places: the
    same results up to bf16 rounding of a different order of summation; both near the float32 product."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=bias)
    layer = bf16.BF16Linear(linear)
    x, residual = torch.randn(2, 7, 96), torch.randn(2, 7, 40)
    activation = "relu" if relu else None
    with torch.inference_mode():
        results = []
        for on in (True, False):
            with fastpaths.override(bf16_onednn=on):
                results.append(bf16.project(layer, x, activation, residual))
        fast, slow = results
        exact = linear(x).relu() if relu else linear(x)
    assert fast.dtype == torch.float32 and fast.shape == (2, 7, 40)
    torch.testing.assert_close(fast, slow, atol=0.05, rtol=0.02)
    torch.testing.assert_close(fast, exact + residual, atol=0.1, rtol=0.03)
    step = bf16.bf16_function(layer, relu)
    torch.testing.assert_close(step(x.view(14, 96)), fast.view(14, 40) - residual.view(14, 40), atol=0.02, rtol=0.02)


AMX = bf16.amx_kernel()
needs_amx = pytest.mark.skipif(AMX is None, reason="transduce's AMX kernel needs a CPU with AMX-BF16 (and the kernels)")


@needs_amx
@pytest.mark.parametrize("rows, inputs, outputs", [(1, 8, 3), (5, 40, 17), (16, 32, 16), (17, 100, 50),
                                                   (33, 128, 384), (70, 256, 130)])  # fmt: skip
def test_the_amx_kernel_is_the_float32_sum_of_bf16_rounded_products(rows, inputs, outputs):
    """Every shape (rows, inputs and outputs not multiples of the tiles' 16 and 32): the product of the input
    rounded to bf16 and the bf16 weight, summed in float32, with the bias, the ReLU and a residual read through its
    row stride; up to the order of summation the float64 value of the same rounded numbers."""
    torch.manual_seed(rows)
    x = torch.randn(rows, 2 * inputs)[:, ::2]  # (the kernel takes dense rows: a copy is made for this one below)
    x, weight = x.contiguous(), torch.randn(outputs, inputs).bfloat16()
    bias, residual = torch.randn(outputs), torch.randn(rows, outputs + 5)[:, 2 : outputs + 2]
    packed = AMX.amx_bf16_pack(weight)
    exact = x.bfloat16().double() @ weight.double().T
    for b, r, relu in [(None, None, False), (bias, None, True), (bias, residual, False), (None, residual, True)]:
        y = AMX.amx_bf16_linear(x, packed, b, r, relu, outputs)
        expected = exact + (0 if b is None else b.double())
        expected = expected.relu() if relu else expected
        expected = expected + (0 if r is None else r.double())
        assert y.dtype == torch.float32 and y.shape == (rows, outputs)
        torch.testing.assert_close(y.double(), expected, atol=1e-4 * inputs**0.5, rtol=1e-5)
    assert AMX.amx_bf16_linear(torch.zeros(0, inputs), packed, bias, None, False, outputs).shape == (0, outputs)


@needs_amx
def test_the_amx_kernel_refuses_a_weight_of_another_shape_in_one_line():
    packed = AMX.amx_bf16_pack(torch.randn(20, 40).bfloat16())
    with pytest.raises(RuntimeError, match=r"amx_bf16_linear: x has 100 inputs, the weight 64 \(padded to 32\)"):
        AMX.amx_bf16_linear(torch.randn(3, 100), packed, None, None, False, 20)
    with pytest.raises(RuntimeError, match=r"amx_bf16_linear: 40 outputs, the weight holds 32 \(padded to 16\)"):
        AMX.amx_bf16_linear(torch.randn(3, 40), packed, None, None, False, 40)


@needs_amx
@pytest.mark.parametrize("relu", [True, False])
def test_a_bf16_layer_through_the_amx_kernel_matches_onednn_and_reads_strided_rows(relu):
    """A decoding step hands the layer views (the last position of each row, a residual sliced out of a wider
    tensor): the AMX route reads them through their strides and gives what oneDNN's route gives, up to the bf16
    rounding of oneDNN's output (the AMX route keeps the float32 sums)."""
    torch.manual_seed(1)
    layer = bf16.BF16Linear(nn.Linear(256, 96))
    x, residual = torch.randn(8, 3, 256)[:, -1, :], torch.randn(8, 3, 96)[:, 1, :]
    activation = "relu" if relu else None
    with torch.inference_mode():
        tiles = bf16.project(layer, x, activation, residual)
        with fastpaths.override(bf16_amx=False):
            onednn = bf16.project(layer, x, activation, residual)
        exact = x.bfloat16().float() @ layer.weight.float().T + layer.bias.float()
        exact = (exact.relu() if relu else exact) + residual
    torch.testing.assert_close(tiles, exact, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(tiles, onednn, atol=0.05, rtol=0.01)
    assert (tiles - exact).abs().max() < (onednn - exact).abs().max()


@needs_amx
@pytest.mark.parametrize("relu", [True, False])
def test_the_step_functions_amx_route_is_resolved_once_and_gives_projects_values(relu):
    """bf16_function binds the AMX kernel and the packed weight when a search starts: its calls give project()'s
    values bit for bit (strided rows and residuals included), and inputs the kernel does not take (rows with
    gradients, three dimensions) go through project() instead."""
    torch.manual_seed(2)
    layer = bf16.BF16Linear(nn.Linear(128, 80))
    x, residual = torch.randn(6, 2, 128)[:, 1, :], torch.randn(6, 3, 80)[:, 2, :]
    activation = "relu" if relu else None
    step = bf16.bf16_function(layer, relu)
    with torch.inference_mode():
        expected = bf16.project(layer, x, activation, residual)
        assert torch.equal(step(x, residual), expected)
        assert torch.equal(step(x), bf16.project(layer, x, activation))
        assert torch.equal(step(x.reshape(2, 3, 128)), bf16.project(layer, x, activation).view(2, 3, 80))
    with torch.no_grad():  # (outside inference mode, as a training's validation decodes)
        assert torch.equal(step(x, residual), expected)
    with fastpaths.override(bf16_amx=False):  # set when a search starts: the next search's functions take oneDNN
        onednn = bf16.bf16_function(layer, relu)
        with torch.inference_mode():
            assert not torch.equal(onednn(x, residual), expected)
            torch.testing.assert_close(onednn(x, residual), expected, atol=0.05, rtol=0.01)


@needs_amx
@pytest.mark.parametrize("rows, inputs, outputs, k", [(1, 8, 3, 3), (17, 100, 1001, 8), (128, 128, 8000, 8),
                                                      (40, 64, 520, 520), (33, 40, 300, 1)])  # fmt: skip
def test_the_fused_candidates_are_row_candidates_of_the_amx_kernels_logits(rows, inputs, outputs, k):
    """amx_bf16_candidates gives what row_candidates gives for amx_bf16_linear's logits: the same values and ids
    (the same float32 sums, ties to the smaller id), the normalisers up to the order of summation; excluded ids
    (at the edges of its 256-output chunks too) are left out of the top k but counted in the normaliser."""
    torch.manual_seed(outputs)
    x, weight, bias = torch.randn(rows, inputs), torch.randn(outputs, inputs).bfloat16(), torch.randn(outputs)
    packed = AMX.amx_bf16_pack(weight)
    excluded = torch.tensor(sorted(i for i in {0, 2, 255, 256, 511, outputs - 1} if i < outputs))
    for b in (bias, None):
        logits = AMX.amx_bf16_linear(x, packed, b, None, False, outputs)
        normalisers, values, indices = AMX.amx_bf16_candidates(x, packed, b, outputs, k, excluded)
        expected = kernels.row_candidates(logits.clone(), k, excluded)
        assert torch.equal(values, expected[1]) and torch.equal(indices, expected[2])
        torch.testing.assert_close(normalisers, torch.logsumexp(logits, dim=1), atol=1e-5, rtol=1e-6)
        if k <= outputs - excluded.numel():  # (else the top k holds excluded ids, at -inf)
            assert not torch.isin(indices, excluded).any()


@needs_amx
def test_the_fused_candidates_refuse_bad_arguments_in_one_line():
    packed = AMX.amx_bf16_pack(torch.randn(40, 32).bfloat16())
    x = torch.randn(3, 32)
    with pytest.raises(RuntimeError, match=r"amx_bf16_candidates: need 1 <= k <= outputs, got k=41, outputs=40"):
        AMX.amx_bf16_candidates(x, packed, None, 40, 41, torch.tensor([], dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"amx_bf16_candidates: excluded id 40 is out of range for 40"):
        AMX.amx_bf16_candidates(x, packed, None, 40, 4, torch.tensor([40]))
    with pytest.raises(RuntimeError, match=r"amx_bf16_candidates: x has 64 inputs, the weight 32"):
        AMX.amx_bf16_candidates(torch.randn(3, 64), packed, None, 40, 4, torch.tensor([], dtype=torch.long))


@needs_amx
def test_beam_search_with_the_fused_candidates_finds_what_it_finds_from_written_logits(copy_checkpoint: Path):
    """The bf16 model's beam search with the projection and the candidates in one pass (the logits never written)
    gives the n-best lists of the search that writes the logits, with the same scores up to the normalisers'
    order of summation; with a minimum length (the masked ids change at min_len) and output limits that some
    sentences reach (their steps mask rows differently and take the written logits)."""
    from transduce.search import generate
    from transduce.search.common import pad_sequences

    with fastpaths.override(bf16_min_weights=0):
        half = Translator.load(copy_checkpoint, precision="bf16")
    model, c = half.model, half.model.config
    ids = half.tokenizer.encode_src_batch(copy_sentences(20, seed=7))
    src = pad_sequences([[*row, c.eos_id] for row in ids], c.pad_id)
    used = []
    real = search_candidates.RowCandidates.step

    def spy(self, *args, **kwargs):
        found = real(self, *args, **kwargs)
        used.append(found is not None)
        return found

    results = []
    with one_thread(), mock.patch.object(search_candidates.RowCandidates, "step", spy):
        for fused in (True, False):
            for decode in (DecodeConfig(beam=4, nbest=4, min_len=3), DecodeConfig(beam=4, max_len_a=0.5, max_len_b=2)):
                with fastpaths.override(fused_candidates=fused):
                    results.append(generate(model, src, decode))
    assert any(used) and not all(used)  # the fused pass at most steps, the written logits at the limits
    for got, expected in zip(results[:2], results[2:]):
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]
        assert [h.score for hyps in got for h in hyps] == pytest.approx(
            [h.score for hyps in expected for h in hyps], abs=1e-4
        )


@needs_amx
def test_with_the_amx_kernel_every_layer_gets_bf16_products():
    from transduce import ModelConfig, Transformer

    model = Transformer(ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=40)).eval()
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert sum(type(m) is bf16.BF16Linear for m in bf16.bf16_products(model).modules()) == linears
    with fastpaths.override(bf16_amx=False):  # oneDNN's route: only the layers of at least bf16_min_weights
        assert not any(type(m) is bf16.BF16Linear for m in bf16.bf16_products(model).modules())


def test_bf16_products_copies_the_model_and_leaves_the_rest_float32():
    torch.manual_seed(0)
    from transduce import ModelConfig, Transformer

    model = Transformer(ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=40)).eval()
    fast = bf16.bf16_products(model, min_weights=0)
    linears = [m for m in fast.modules() if type(m) is bf16.BF16Linear]
    assert linears and not any(type(m) is nn.Linear for m in fast.modules())
    assert all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the original untouched
    assert fast.tgt_embed.weight.dtype == torch.float32  # the tied embedding stays float32
    import copy

    again = copy.deepcopy(fast)  # (packed oneDNN copies are not copied: made again on first use)
    src = torch.randint(4, 40, (2, 5))
    with torch.inference_mode():
        torch.testing.assert_close(again.encode(src).states, fast.encode(src).states)


def test_bf16_products_leave_layers_below_the_size_in_float32():
    """Layers with fewer than ``min_weights`` weights stay ``nn.Linear`` in float32 (the setting's default applies
    when none is given and the products go through oneDNN); the mixed model decodes as the all-bf16 and the
    float32 ones do, to bf16 rounding."""
    torch.manual_seed(0)
    from transduce import ModelConfig, Transformer

    config = ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=300, share_vocab=False, tie_output=False)
    model = Transformer(config).eval()
    sizes = sorted({m.weight.numel() for m in model.modules() if type(m) is nn.Linear})
    bound = sizes[-1]  # only the largest layers (the pre-softmax projection) get bf16 products
    mixed = bf16.bf16_products(model, min_weights=bound)
    with fastpaths.override(bf16_min_weights=bound, bf16_amx=False):  # (the AMX kernel takes every layer)
        assert [type(m) for m in bf16.bf16_products(model).modules()] == [type(m) for m in mixed.modules()]
    for name, m in mixed.named_modules():
        if type(m) in (nn.Linear, bf16.BF16Linear):
            assert (type(m) is bf16.BF16Linear) == (m.weight.numel() >= bound), name
    assert type(mixed.output) is bf16.BF16Linear
    assert all(m.weight.dtype == torch.float32 for m in mixed.modules() if type(m) is nn.Linear)
    src, tgt = torch.randint(4, 40, (2, 5)), torch.randint(4, 300, (2, 6))
    with torch.inference_mode():
        exact, some = model(src, tgt), mixed(src, tgt)
        torch.testing.assert_close(some, exact, atol=0.05, rtol=0.05)
        every = bf16.bf16_products(model, min_weights=0)(src, tgt)
    assert (some - exact).abs().max() < (every - exact).abs().max()  # fewer layers rounded: closer to float32


# ----------------------------------------------------------------------------------------------------------------------
# translations


def test_bf16_and_fp32_give_the_same_translations_of_a_trained_model(copy_checkpoint: Path):
    """The trained copy model translates the same in bf16 as in fp32 (beam 4 and greedy), with oneDNN's product and
    the conversion kernels, and with both fallbacks (``F.linear``, ``Tensor.to``: the path of a CPU without
    AVX-512 or a build without the kernels), and with transduce's AMX kernel where the CPU has AMX, and the n-best
    scores stay close."""
    sentences = copy_sentences(24, seed=5)
    fp32 = Translator.load(copy_checkpoint, precision="fp32")
    with fastpaths.override(bf16_min_weights=0):  # every layer (the copy model's are small)
        half = Translator.load(copy_checkpoint, precision="bf16")
    assert half.precision == "bf16" and any(type(m) is bf16.BF16Linear for m in half.model.modules())
    with one_thread():
        expected = fp32.translate(sentences, beam=4), fp32.translate(sentences, beam=1)
        scores = [h[0].score for h in fp32.translate_nbest(sentences, nbest=1, beam=4)]
        for amx, on in ((True, True), (False, True), (False, False)):  # the AMX kernel, oneDNN, the fallbacks
            with fastpaths.override(bf16_amx=amx, bf16_onednn=on, kernels=on):
                assert (half.translate(sentences, beam=4), half.translate(sentences, beam=1)) == expected
                got = [h[0].score for h in half.translate_nbest(sentences, nbest=1, beam=4)]
                assert got == pytest.approx(scores, abs=0.05)
    assert expected[0] == sentences  # it copies


@pytest.mark.parametrize("cpu, expected", [(AMX_INTEL, "bf16"), (BF16_AMD, "fp32"), (AVX2_INTEL, "fp32")])
def test_auto_precision_follows_the_cpu_and_says_so_once(monkeypatch, caplog, copy_checkpoint: Path, cpu, expected):
    monkeypatch.setattr(fastpaths, "cpu_features", lambda: cpu)
    monkeypatch.setattr(fastpaths.settings, "bf16_min_weights", 0)  # every layer (the copy model's are small)
    monkeypatch.setattr("transduce.search.translator._SAID", set())
    expected = expected if fastpaths.onednn_available() else "fp32"
    with caplog.at_level(logging.INFO, logger="transduce.search.translator"):
        first = Translator.load(copy_checkpoint, precision="auto")
        second = Translator.load(copy_checkpoint, precision="auto")
    assert first.precision == second.precision == expected
    assert any(type(m) is bf16.BF16Linear for m in first.model.modules()) is (expected == "bf16")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision: ")]
    assert len(lines) == 1 and lines[0].startswith(f"precision: {expected} (auto: ")


def test_auto_precision_keeps_int8_models_and_other_devices_in_fp32(monkeypatch, copy_checkpoint: Path):
    monkeypatch.setattr(fastpaths, "cpu_features", lambda: AMX_INTEL)
    assert Translator.load(copy_checkpoint, precision="auto", quantize="int8").precision == "fp32"
    int8 = quantize_int8(Translator.load(copy_checkpoint).model)
    assert Translator(int8, Translator.load(copy_checkpoint).tokenizer, precision="auto").precision == "fp32"


def test_the_conversion_kernels_round_as_pytorch_does_and_add_the_residual():
    from transduce.model import kernels

    if not kernels.applies(torch.zeros(1)):
        pytest.skip("transduce's kernels are not built here")
    k = kernels.compiled()
    x = torch.randn(37, 129) * 100
    x[0, :4] = torch.tensor([0.0, -0.0, float("inf"), float("-inf")])
    assert torch.equal(k.to_bf16(x), x.to(torch.bfloat16))
    y, residual = x.to(torch.bfloat16), torch.randn(37, 129)
    assert torch.equal(k.bf16_to_float32(y), y.float())
    assert torch.equal(k.bf16_to_float32(y, residual), y.float() + residual)
    assert k.to_bf16(torch.tensor([float("nan")])).isnan().all()
