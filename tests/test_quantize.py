"""Dynamic int8 quantisation for CPU inference: a quantised copy, close to the float model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from decodekit import copy_sentences, one_thread
from transduce import ModelConfig, Transformer, fastpaths
from transduce.cli import main
from transduce.model.quantize import quantize_int8
from transduce.search.translator import Translator

DynamicLinear = torch.ao.nn.quantized.dynamic.Linear


@pytest.fixture
def every_layer_int8(monkeypatch):
    """The test model's layers are all below the default int8_min_weights: quantise every one of them."""
    monkeypatch.setattr(fastpaths.settings, "int8_min_weights", 0)


def test_quantize_int8_replaces_every_linear_in_a_copy(copy_checkpoint: Path, every_layer_int8):
    model = Translator.load(copy_checkpoint).model
    q = quantize_int8(model)
    assert not any(type(m) is nn.Linear for m in q.modules())
    assert sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in q.modules()) == sum(
        type(m) is nn.Linear for m in model.modules()
    )
    assert type(model.output) is nn.Linear  # the float model is untouched


def test_quantize_int8_leaves_layers_below_min_weights_in_float32(monkeypatch):
    cfg = ModelConfig.preset("tiny", src_vocab_size=1000, tgt_vocab_size=1000)  # d_model 128: 128 x 1,000 output
    model = Transformer(cfg)
    monkeypatch.setattr(fastpaths.settings, "int8_min_weights", 1 << 16)  # the default where the CPU has no VNNI
    quantised = {name for name, m in quantize_int8(model).named_modules() if isinstance(m, DynamicLinear)}
    assert quantised == {"output"}  # the only linear layer with at least 2^16 weights
    wide = {name for name, m in quantize_int8(model, min_weights=3 * 128 * 128).named_modules()
            if isinstance(m, DynamicLinear)}  # fmt: skip
    assert "output" in wide and "decoder_layers.0.self_attn.qkv" in wide  # 384 x 128: exactly the threshold
    assert (
        "decoder_layers.0.ffn.w1" not in wide and "encoder_layers.1.self_attn.out" not in wide
    )  # 256 x 128, 128 x 128
    assert len(wide) == 1 + cfg.encoder_layers + cfg.decoder_layers  # the output and every self-attention QKV
    assert {type(m) for m in quantize_int8(model, min_weights=10**9).modules()} == {type(m) for m in model.modules()}


@pytest.mark.parametrize("vnni", [True, False])
def test_every_linear_layer_is_quantised_by_default_where_the_cpu_has_vnni(monkeypatch, vnni):
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: vnni, raising=False)
    monkeypatch.setattr(fastpaths.settings, "int8_min_weights", fastpaths.FastPaths().int8_min_weights)
    model = Transformer(ModelConfig.preset("tiny", src_vocab_size=1000, tgt_vocab_size=1000))
    linears = sum(type(m) is nn.Linear for m in model.modules())
    quantised = sum(isinstance(m, DynamicLinear) for m in quantize_int8(model).modules())
    assert quantised == (linears if vnni else 1)  # without VNNI only the 128 x 1,000 output projection


def test_int8_logits_and_translations_stay_close(copy_checkpoint: Path, every_layer_int8):
    fp32 = Translator.load(copy_checkpoint)
    int8 = Translator.load(copy_checkpoint, quantize="int8")
    sentences = copy_sentences(60, seed=7)
    src = torch.tensor([[*fp32.tokenizer.encode_src(sentences[0]), 2]])
    tgt = torch.tensor([[1, *fp32.tokenizer.encode_src(sentences[0])]])
    with torch.no_grad(), one_thread():
        a, b = fp32.model(src, tgt).log_softmax(-1), int8.model(src, tgt).log_softmax(-1)
        assert (a.exp() - b.exp()).abs().max() < 0.05  # probabilities within 5 points
        same = sum(x == y for x, y in zip(fp32.translate(sentences), int8.translate(sentences)))
    assert same >= 0.9 * len(sentences)


def test_quantize_option_is_checked(copy_checkpoint: Path):
    with pytest.raises(ValueError, match="quantize: 'int4' is not one of int8"):
        Translator.load(copy_checkpoint, quantize="int4")


def test_cli_translate_int8(copy_checkpoint: Path, tmp_path: Path, every_layer_int8):
    src = tmp_path / "in.txt"
    src.write_text("a man rides the red bike.\n\ntwo girls play.\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    args = ["translate", "--model", str(copy_checkpoint), "--input", str(src), "--output", str(out), "--int8"]
    assert main(args) == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
