"""Contextual word vectors (CoVe) from the encoder: ``Translator.embed`` gives the encoder's own output for each
sentence, whatever else is in its batch and in input order."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from decodekit import one_thread
from transduce.config import ConfigError, DecodeConfig, ModelConfig
from transduce.ensemble import Ensemble
from transduce.model import Transformer
from transduce.translate import Translator

TEXTS = ["a man rides the bike.", "the dog.", "", "ein Mann fährt das Rad und der Hund", "café café a man", "dog"]


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def translator(checkpoint: Path) -> Translator:
    return Translator.load(checkpoint)


@pytest.fixture(scope="module")
def pre_norm(translator: Translator) -> Translator:
    """A random pre-norm model with learned positions (its encoder ends with a LayerNorm) and the same vocabulary."""
    torch.manual_seed(1)
    tok = translator.tokenizer
    cfg = ModelConfig.preset("test", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                             norm="pre", positions="learned", max_positions=64)  # fmt: skip
    return Translator(Transformer(cfg), tok)


@torch.inference_mode()
def encoded(translator: Translator, ids: list[int]) -> np.ndarray:
    """``model.encode`` of one sentence's ids (EOS appended), no batch around it: (len(ids) + 1, d_model)."""
    src = torch.tensor([[*ids, translator.model.config.eos_id]])
    return translator.model.encode(src).states[0].float().numpy()


# ----------------------------------------------------------------------------------------------------------------------
# the API


@pytest.mark.parametrize("which", ["post-norm", "pre-norm-learned-positions"])
def test_vectors_are_the_encoders_output_for_each_sentence(which, translator, pre_norm):
    t = translator if which == "post-norm" else pre_norm
    with_eos = t.embed(TEXTS, include_eos=True)
    without = t.embed(TEXTS)
    for text, a, b in zip(TEXTS, with_eos, without):
        ids = t.tokenizer.encode_src(text)
        states = encoded(t, ids)
        assert a.pieces == t.tokenizer.src_pieces([*ids, t.model.config.eos_id]) and a.pieces[-1] == "</s>"
        assert a.states.dtype == np.float32 and a.states.shape == (len(ids) + 1, t.model.config.d_model)
        np.testing.assert_allclose(a.states, states, rtol=1e-5, atol=1e-5)  # batched with the others
        assert b.pieces == a.pieces[:-1]
        np.testing.assert_allclose(b.states, states[:-1], rtol=1e-5, atol=1e-5)
        [alone] = t.embed([text], include_eos=True)
        np.testing.assert_array_equal(alone.states, states)  # the same computation, the same numbers


def test_a_sentences_vectors_do_not_depend_on_its_batch_and_order_is_kept(translator):
    one_batch = translator.embed(TEXTS, include_eos=True, max_tokens=100_000)  # padded to the longest
    one_by_one = [translator.embed([text], include_eos=True)[0] for text in TEXTS]
    backwards = translator.embed(TEXTS[::-1], include_eos=True)[::-1]
    each_alone = translator.embed(TEXTS, include_eos=True, max_tokens=1)  # a batch per sentence
    for a, b, c, d in zip(one_batch, one_by_one, backwards, each_alone):
        assert a.pieces == b.pieces == c.pieces == d.pieces
        for other in (a, c):
            np.testing.assert_allclose(other.states, b.states, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(other.pooled, b.pooled, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(d.states, b.states)
    lengths = {len(v.pieces) for v in one_batch}
    assert len(lengths) > 2  # the batch really was padded


def test_with_embeddings_each_row_is_the_scaled_source_embedding_then_the_state(translator):
    model = translator.model
    d = model.config.d_model
    plain = translator.embed(TEXTS, include_eos=True)
    both = translator.embed(TEXTS, include_eos=True, with_embeddings=True)
    for text, p, b in zip(TEXTS, plain, both):
        ids = torch.tensor([*translator.tokenizer.encode_src(text), model.config.eos_id])
        assert b.pieces == p.pieces and b.states.shape == (len(ids), 2 * d)
        np.testing.assert_array_equal(b.states[:, :d], (model.src_embed.weight[ids] * math.sqrt(d)).detach().numpy())
        np.testing.assert_array_equal(b.states[:, d:], p.states)
        np.testing.assert_allclose(b.pooled, b.states.mean(axis=0), rtol=1e-6, atol=1e-6)
    # "the vector the encoder adds the positional encoding to"
    src = torch.tensor([translator.tokenizer.encode_src(TEXTS[0])])
    with torch.inference_mode():
        expected = model.source_embeddings(src) + model.src_positions(0, src.shape[1])
        torch.testing.assert_close(model._embed(src, model.src_embed, model.src_positions, 0), expected)


def test_pooled_is_the_mean_of_the_rows_and_an_empty_line_has_no_rows(translator):
    d = translator.model.config.d_model
    for include_eos in (False, True):
        full = translator.embed(TEXTS, include_eos=include_eos)
        pooled = translator.embed(TEXTS, include_eos=include_eos, pooled_only=True)
        for f, p in zip(full, pooled):
            if len(f.states):
                np.testing.assert_allclose(f.pooled, f.states.mean(axis=0), rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(p.pooled, f.pooled)
            assert p.states is None and p.pieces == [] and p.pooled.dtype == np.float32
    [empty] = translator.embed([""])
    assert empty.pieces == [] and empty.states.shape == (0, d) and not empty.pooled.any()
    [eos_only] = translator.embed([""], include_eos=True)
    assert eos_only.pieces == ["</s>"]
    np.testing.assert_array_equal(eos_only.pooled, eos_only.states[0])


def test_the_source_is_cased_as_translate_cases_it(translator):
    normalizing = Translator(translator.model, translator.tokenizer, DecodeConfig(input_case="normalize"))
    [shouted] = normalizing.embed(["A MAN RIDES THE BIKE."])
    [lower] = translator.embed(["a man rides the bike."])
    assert shouted.pieces == lower.pieces
    np.testing.assert_array_equal(shouted.states, lower.states)
    [kept] = normalizing.embed(["A MAN RIDES THE BIKE."], input_case="keep")
    assert kept.pieces != lower.pieces
    [normalized] = translator.embed(["A MAN RIDES THE BIKE."], input_case="normalize")
    assert normalized.pieces == lower.pieces


def test_a_line_over_max_input_tokens_is_encoded_in_parts_with_a_warning(checkpoint, caplog):
    t = Translator.load(checkpoint, max_input_tokens=4)
    text = "a man rides the bike. the dog rides the bike"
    ids = t.tokenizer.encode_src(text)
    parts = t._split(ids)
    assert len(parts) > 1
    with caplog.at_level(logging.WARNING, logger="transduce.embed"):
        [v] = t.embed([text])
    assert f"line 1: {len(ids)} source tokens exceed max_input_tokens=4; encoded in {len(parts)} parts" in caplog.text
    assert v.pieces == t.tokenizer.src_pieces(ids)
    expected = np.concatenate([encoded(t, part)[:-1] for part in parts])
    np.testing.assert_allclose(v.states, expected, rtol=1e-5, atol=1e-5)


def test_what_embed_refuses(translator):
    with pytest.raises(TypeError, match=r"Translator.embed\(\) takes a list of sentences"):
        translator.embed("a man")
    with pytest.raises(ConfigError, match="input_case: 'upper' is not one of"):
        translator.embed(["a man"], input_case="upper")
    with pytest.raises(ConfigError, match="max_tokens must be >= 1"):
        translator.embed(["a man"], max_tokens=0)
    ensemble = Translator(Ensemble([translator.model, translator.model]), translator.tokenizer)
    with pytest.raises(ConfigError, match="embed reads one model's encoder; this translator is an ensemble of 2"):
        ensemble.embed(["a man"])


def test_a_marian_model_embeds_as_its_own_encoder_computes(tmp_path):
    transformers = pytest.importorskip("transformers")
    from test_interop import make_marian_dir
    from transduce.interop.marian import import_hf, residual_permutation

    directory = make_marian_dir(tmp_path / "marian", share=True)
    tok = transformers.MarianTokenizer.from_pretrained(str(directory))
    hf = transformers.MarianMTModel.from_pretrained(str(directory)).eval()
    texts = ["a man rides the red bike.", "two girls play on grass", "the dog."]
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        theirs = hf.get_encoder()(**batch).last_hidden_state
    direct = Translator.load(directory).embed(texts, include_eos=True)  # a Marian directory as it is
    imported = Translator.load(import_hf(directory, tmp_path / "ckpt")).embed(texts, include_eos=True)
    for i, (a, b) in enumerate(zip(direct, imported)):
        n = int(batch["attention_mask"][i].sum())
        assert a.pieces == b.pieces == tok.convert_ids_to_tokens(batch["input_ids"][i, :n].tolist())
        # the import keeps our interleaved sinusoid layout: Marian's coordinates are ours in another order
        marian_order = a.states[:, residual_permutation(a.states.shape[1]).numpy()]
        np.testing.assert_allclose(marian_order, theirs[i, :n].numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(b.states, a.states)
