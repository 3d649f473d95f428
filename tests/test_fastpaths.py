"""transduce.fastpaths: the one place for the fast paths; checked settings, override, the CPU-dependent defaults,
the environment variable, and the same results with every fast path on or off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decodekit import copy_sentences, one_thread
from transduce import ModelConfig, Transformer, fastpaths
from transduce.model import kernels
from transduce.search.translator import Translator
from transduce.training.loss import label_smoothed_nll

# every fast path off: PyTorch's operations, the decoder's modules, SDPA, MKL, fbgemm, the collector running
ALL_OFF = dict(
    kernels=False, step_function=False, attention_kernel_max_keys=0, explicit_attention_max_keys=0, onednn=False,
    onednn_layers=False, int8_kernel=False, pause_gc=False,
)  # fmt: skip


def test_override_sets_and_restores_even_after_an_error():
    before = fastpaths.settings.describe()
    with pytest.raises(RuntimeError, match="inside"), fastpaths.override(kernels=False, by_position_min_source=0) as p:
        assert p is fastpaths.settings
        assert not fastpaths.settings.kernels and fastpaths.settings.by_position_min_source == 0
        assert kernels.compiled() is None and not kernels.applies(torch.zeros(1))
        with fastpaths.override(kernels=True):
            assert fastpaths.settings.kernels
        assert not fastpaths.settings.kernels
        raise RuntimeError("inside")
    assert fastpaths.settings.describe() == before


@pytest.mark.parametrize(
    "changes, error, message",
    [({"kernel": False}, TypeError, "fastpaths: no setting 'kernel' (did you mean 'kernels'?)"),
     ({"kernels": 1}, TypeError, "fastpaths: kernels takes a bool, got 1"),
     ({"onednn_min_macs": 2.5}, TypeError, "fastpaths: onednn_min_macs takes an int, got 2.5"),
     ({"by_position_min_source": -1}, ValueError, "fastpaths: by_position_min_source must be >= 0, got -1"),
     ({"pause_gc_limit_s": True}, TypeError, "fastpaths: pause_gc_limit_s takes a float, got True")],
)  # fmt: skip
def test_settings_are_checked_and_a_bad_change_changes_nothing(changes, error, message):
    before = fastpaths.settings.describe()
    with pytest.raises(error) as info, fastpaths.override(step_function=False, **changes):
        pass
    assert str(info.value) == message
    with pytest.raises(error):
        fastpaths.settings.update(step_function=False, **changes)
    with pytest.raises(error):
        setattr(fastpaths.settings, *next(iter(changes.items())))
    assert fastpaths.settings.describe() == before


def test_describe_names_every_setting():
    line = fastpaths.settings.describe()
    for name in ("kernels", "step_function", "onednn_layers", "int8_kernel", "pause_gc_limit_s"):
        assert f"{name}={getattr(fastpaths.settings, name)}" in line
    assert line.count("=") == len(fastpaths.FastPaths.__dataclass_fields__)


@pytest.mark.parametrize(
    "capability, vendor, on",
    [("AVX512", "AuthenticAMD", True), ("AVX2", "AuthenticAMD", False), ("AVX512", "GenuineIntel", False),
     ("AVX512", "", False)],
)  # fmt: skip
def test_onednn_for_every_layer_only_where_avx512_meets_an_amd_cpu(monkeypatch, capability, vendor, on):
    """oneDNN's fp32 products beat MKL's where they use wider vectors: AVX-512 on AMD, where MKL stops at AVX2."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(fastpaths, "cpu_vendor", lambda: vendor)
    assert fastpaths.onednn_beats_mkl() is on
    assert fastpaths.FastPaths().onednn_layers is (on and fastpaths.onednn_available())


@pytest.mark.parametrize("vnni", [True, False])
def test_int8_for_every_layer_by_default_only_where_the_cpu_has_vnni(monkeypatch, vnni):
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: vnni, raising=False)
    assert fastpaths.FastPaths().int8_min_weights == (0 if vnni else 1 << 16)


def test_the_cpu_vendor_is_read_from_proc_cpuinfo():
    vendor = fastpaths.cpu_vendor()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        assert vendor == ""
        return
    assert (f"vendor_id\t: {vendor}" in text) if vendor else "vendor_id" not in text


def test_transduce_kernels_0_in_the_environment_turns_the_kernels_off():
    code = (
        "from transduce import fastpaths\n"
        "from transduce.model import kernels\n"
        "print(fastpaths.settings.kernels, kernels.compiled())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "TRANSDUCE_KERNELS": "0"},
    )  # fmt: skip
    assert out.stdout.split() == ["False", "None"]


def test_translations_are_the_same_with_every_fast_path_off(copy_checkpoint: Path):
    """The trained copy model translates a batch the same (beam 4 and greedy, the same scores to float rounding)
    with every fast path on (the cache stored by position and oneDNN for every layer included) and every one off."""
    tr = Translator.load(copy_checkpoint)
    sentences = copy_sentences(16, seed=4)
    on = dict(by_position_min_source=0, onednn_layers=fastpaths.onednn_available(), onednn_min_macs=0)
    results = []
    for changes in (on, ALL_OFF):
        with fastpaths.override(**changes), one_thread():
            results.append([tr.translate_nbest(sentences, nbest=2, beam=4), tr.translate(sentences, beam=1)])
    (fast_nbest, fast_greedy), (slow_nbest, slow_greedy) = results
    assert fast_greedy == slow_greedy and any(fast_greedy)
    assert [[h.text for h in n] for n in fast_nbest] == [[h.text for h in n] for n in slow_nbest]
    for a, b in zip(fast_nbest, slow_nbest, strict=True):
        for h, k in zip(a, b, strict=True):
            assert h.score == pytest.approx(k.score, abs=1e-4)


def test_a_training_step_is_the_same_with_every_fast_path_off():
    """A seeded post-norm training step with dropout (the fused residual, the dropout and loss kernels, the explicit
    attention) against PyTorch's operations and SDPA: the same loss and gradients."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset("test", src_vocab_size=50, tgt_vocab_size=50, dropout=0.3, norm="post")
    model = Transformer(cfg).train()
    src, tgt = torch.randint(4, 50, (6, 9)), torch.randint(4, 50, (6, 8))
    src[0, 6:] = tgt[1, 5:] = 0
    results = []
    for changes in ({}, ALL_OFF):
        with fastpaths.override(**changes):
            torch.manual_seed(1)
            model.zero_grad()
            loss, _, n = label_smoothed_nll(model(src, tgt[:, :-1]), tgt[:, 1:], 0.1, 0)
            (loss / n).backward()
            results.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "capability, bf16, vnni, amx, suffix, has, lacks",
    [("AVX512", True, True, True, "avx512bf16_vnni_amx", ["-mavx512bf16", "-mavx512vnni", "-mamx-tile", "-mamx-bf16"],
      []),
     ("AVX512", True, True, False, "avx512bf16_vnni", ["-mavx512bf16", "-mavx512vnni"], ["-mamx-tile"]),
     ("AVX512", False, True, False, "avx512_vnni", ["-mavx512vnni"], ["-mavx512bf16", "-mamx-tile"]),
     ("AVX512", False, False, False, "avx2", ["-mavx2", "-mfma"], ["-mavx512f"]),
     ("AVX2", False, False, False, "avx2", ["-mavx2", "-mfma"], ["-mavx512f", "-mamx-tile"]),
     ("DEFAULT", False, False, False, "generic", [], ["-mavx2"])],
)  # fmt: skip
def test_the_kernels_are_built_for_the_cpus_vector_extensions(
    monkeypatch, capability, bf16, vnni, amx, suffix, has, lacks
):
    """CPUs without AVX-512 (or without its bf16 and VNNI extensions, or without AMX) get a build of their own,
    which the int8 product (and the AMX bf16 product) is left out of (int8_kernel then falls back to fbgemm, bf16
    products to oneDNN) and whose name keeps it apart in the cache."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: vnni, raising=False)
    cpu = fastpaths.CpuFeatures("GenuineIntel", capability, vnni, bf16, amx, amx)
    monkeypatch.setattr(fastpaths, "cpu_features", lambda: cpu)
    name, flags = kernels._arch_flags()
    assert name == suffix
    assert all(f in flags for f in has) and not any(f in flags for f in lacks)
