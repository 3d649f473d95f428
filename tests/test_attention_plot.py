"""Attention pictures: the maps of one sentence pair and the PNG grid drawn from them."""

from __future__ import annotations

import pytest
import torch

from decodekit import CharTokenizer, one_thread
from transduce.config import DecodeConfig, ModelConfig
from transduce.model import Transformer
from transduce.search.plot import plot_attention, plot_attention_maps
from transduce.search.translator import Translator


@pytest.fixture
def translator() -> Translator:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("test", src_vocab_size=12, tgt_vocab_size=12))
    return Translator(model, CharTokenizer(), DecodeConfig(max_len_b=4))


def test_attention_maps_shapes_and_labels(translator):
    with one_thread():
        maps = translator.attention("abc", "hg")
    assert maps.src_pieces == ["a", "b", "c", "</s>"]
    assert maps.tgt_in_pieces == ["<s>", "h", "g"] and maps.tgt_out_pieces == ["h", "g", "</s>"]
    assert (
        maps.cross.shape == (2, 4, 3, 4) and maps.decoder.shape == (2, 4, 3, 3) and maps.encoder.shape == (2, 4, 4, 4)
    )
    torch.testing.assert_close(maps.cross.sum(-1), torch.ones(2, 4, 3))
    assert maps.decoder[..., 0, 1:].abs().max() == 0  # causal: the first position sees only BOS
    own = translator.attention("abc")  # the model's own translation
    assert own.tgt_out_pieces[-1] == "</s>" and own.cross.shape[2] == len(own.tgt_out_pieces)


def test_png_files_are_written(translator, tmp_path):
    maps = translator.attention("abcd", "dcba")
    written = plot_attention_maps(maps, tmp_path / "att.png", self_attention=True)
    assert [p.name for p in written] == ["att.png", "att.encoder.png", "att.decoder.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_plot_attention_rejects_mismatched_labels(tmp_path):
    with pytest.raises(ValueError, match="labels"):
        plot_attention(torch.rand(1, 2, 3, 4), ["a"] * 3, ["b"] * 3, tmp_path / "x.png")
