"""Contextual word vectors (CoVe) from the encoder: ``Translator.embed`` gives the encoder's own output for each
sentence, whatever else is in its batch and in input order; ``transduce embed`` writes exactly those vectors in
each format as docs/cli.md describes it (read back here with numpy and safetensors, not with transduce's reader);
bad input is one error line and writes nothing."""

from __future__ import annotations

import io
import json
import logging
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from decodekit import one_thread
from transduce.cli import main
from transduce.config import ConfigError, DecodeConfig, ModelConfig
from transduce.model import Transformer
from transduce.search.ensemble import Ensemble
from transduce.search.translator import Translator
from transduce.transfer.embed import FORMATS, read_embeddings

TEXTS = ["a man rides the bike.", "the dog.", "", "ein Mann fährt das Rad und der Hund", "café café a man", "dog"]
INVALID_HINT = "use --replace-invalid to embed it with U+FFFD in place"


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


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("embed") / "source.txt"
    path.write_text("".join(text + "\n" for text in TEXTS), encoding="utf-8")
    return path


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
    with caplog.at_level(logging.WARNING, logger="transduce.transfer.embed"):
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


# ----------------------------------------------------------------------------------------------------------------------
# the command line, read back as docs/cli.md says


def read_file(path: Path, fmt: str) -> dict:
    """``vectors``, ``offsets``, ``pieces`` (one flat list), ``pooled`` and ``meta`` of an output, read with numpy and
    safetensors only (``pooled_only`` outputs: ``pooled`` and ``meta``)."""
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as z:
            out = {name: z[name] for name in z.files}
        out["meta"] = json.loads(str(out["meta"]))
        if "pieces" in out:
            out["pieces"] = out["pieces"].tolist()
        return out
    if fmt == "safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            out = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
            header = f.metadata()
        out["meta"] = json.loads(header["meta"])
        if "pieces" in header:
            out["pieces"] = json.loads(header["pieces"])
        return out
    pooled = path.with_name(path.stem + ".pooled.npy")
    sidecar = path.with_name(path.stem + ".pieces.json")
    if not sidecar.exists():
        return {"pooled": np.load(path, allow_pickle=False)}
    side = json.loads(sidecar.read_text(encoding="utf-8"))
    return {"vectors": np.load(path, allow_pickle=False), "pooled": np.load(pooled, allow_pickle=False),
            "offsets": np.array(side["offsets"]), "pieces": [p for s in side["pieces"] for p in s],
            "meta": side["meta"], "nested": side["pieces"]}  # fmt: skip


def embed_cli(checkpoint: Path, *args) -> int:
    return main(["embed", "--model", str(checkpoint), *map(str, args)])


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_writes_the_apis_vectors(fmt, translator, checkpoint, source, tmp_path):
    out = tmp_path / f"v.{fmt}"
    assert embed_cli(checkpoint, "-i", source, "-o", out) == 0
    got = read_file(out, fmt)
    api = translator.embed(TEXTS)
    lengths = [len(v.pieces) for v in api]
    assert got["offsets"].tolist() == [0, *np.cumsum(lengths).tolist()]
    assert got["pieces"] == [p for v in api for p in v.pieces]
    assert got["vectors"].dtype == got["pooled"].dtype == np.float32
    assert got["vectors"].shape == (sum(lengths), translator.model.config.d_model)
    assert got["pooled"].shape == (len(TEXTS), translator.model.config.d_model)
    for i, v in enumerate(api):
        rows = got["vectors"][got["offsets"][i] : got["offsets"][i + 1]]
        np.testing.assert_array_equal(rows, v.states)
        np.testing.assert_array_equal(got["pooled"][i], v.pooled)
        if len(rows):
            np.testing.assert_allclose(got["pooled"][i], rows.mean(axis=0), rtol=1e-6, atol=1e-6)
    assert got["meta"]["layout"] == "transduce-embed/1" and got["meta"]["with_embeddings"] is False
    if fmt == "npy":
        assert got["nested"] == [v.pieces for v in api]
    written = sorted(p.name for p in tmp_path.iterdir())  # no temporary file left
    assert written == (["v.npy", "v.pieces.json", "v.pooled.npy"] if fmt == "npy" else [out.name])
    again = read_embeddings(out)
    np.testing.assert_array_equal(again.vectors, got["vectors"])
    assert again.pieces == got["pieces"] and again.offsets.tolist() == got["offsets"].tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_pooled_only_writes_the_sentence_vectors_alone(fmt, translator, checkpoint, source, tmp_path):
    out = tmp_path / f"p.{fmt}"
    assert embed_cli(checkpoint, "-i", source, "-o", out, "--pooled-only") == 0
    got = read_file(out, fmt)
    assert set(got) <= {"pooled", "meta"} and [p.name for p in tmp_path.iterdir()] == [out.name]
    expected = np.stack([v.pooled for v in translator.embed(TEXTS, pooled_only=True)])
    np.testing.assert_array_equal(got["pooled"], expected)


def test_cli_with_embeddings_and_eos_to_standard_output(translator, checkpoint, source, capsysbinary):
    assert embed_cli(checkpoint, "-i", source, "--with-embeddings", "--include-eos") == 0
    got = read_file(io.BytesIO(capsysbinary.readouterr().out), "npz")  # npz when no format is named
    api = translator.embed(TEXTS, with_embeddings=True, include_eos=True)
    np.testing.assert_array_equal(got["vectors"], np.concatenate([v.states for v in api]))
    assert got["pieces"] == [p for v in api for p in v.pieces] and got["pieces"].count("</s>") == len(TEXTS)
    assert got["meta"]["with_embeddings"] is True and got["meta"]["dim"] == 2 * translator.model.config.d_model


def test_invalid_utf8_at_a_line_is_one_error_line_and_writes_nothing(checkpoint, tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a man\nthe dog\nthe \xff bike\n")
    for fmt in FORMATS:
        assert embed_cli(checkpoint, "-i", bad, "-o", tmp_path / f"v.{fmt}") == 2
        expected = f"transduce embed: error: {bad}, line 3: not valid UTF-8 (byte 0xff at column 5); {INVALID_HINT}"
        assert capsys.readouterr().err.splitlines() == [expected]
    assert [p.name for p in tmp_path.iterdir()] == ["bad.txt"]
    # standard input is read as it comes: the bad line is found after the model is loaded, and the old file stays
    old = tmp_path / "v.npz"
    old.write_bytes(b"old vectors")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a man\n\xfe dog\n")))
    assert embed_cli(checkpoint, "-o", old) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"transduce embed: error: -, line 2: not valid UTF-8 (byte 0xfe at column 1); {INVALID_HINT}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "v.npz"] and old.read_bytes() == b"old vectors"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "{tmp}/v.csv"], "-o/--output {tmp}/v.csv: unknown format '.csv'; give a name ending in .npz, .npy or "
         ".safetensors, or --format"),
        (["-o", "{tmp}/v"], "-o/--output {tmp}/v: no suffix to tell the format; give a name ending in .npz, .npy or "
         ".safetensors, or --format"),
        (["-o", "{tmp}/v.safetensors", "--format", "npz"],
         "-o/--output {tmp}/v.safetensors is named as safetensors but --format is npz"),
        (["--format", "npy"], "--format npy writes three files (vectors, pooled vectors, pieces), not standard output: "
         "give -o FILE.npy, or --format npz or safetensors"),
    ],
    ids=["unknown-suffix", "no-suffix", "contradiction", "npy-to-stdout"],
)  # fmt: skip
def test_formats_it_cannot_tell_or_write_are_one_error_line(args, message, checkpoint, source, tmp_path, capsys):
    args = [a.format(tmp=tmp_path) for a in args]
    assert embed_cli(checkpoint, "-i", source, *args) == 2
    assert capsys.readouterr().err.splitlines() == [f"transduce embed: error: {message.format(tmp=tmp_path)}"]
    assert list(tmp_path.iterdir()) == []


def test_binary_output_is_never_written_to_a_terminal(checkpoint, source, monkeypatch, capsys):
    monkeypatch.setattr("transduce.commands.embed._is_terminal", lambda stream: True)
    assert embed_cli(checkpoint, "-i", source) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == ["transduce embed: error: standard output is a terminal and the vectors "
                                              "are binary: give -o FILE.npz (or .npy, .safetensors), or redirect "
                                              "standard output"]  # fmt: skip
