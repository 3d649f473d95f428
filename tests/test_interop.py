"""Hugging Face Marian export and import, CTranslate2 export: the other toolkit, loading our files with its own
code, must compute the same logits and produce the same translations."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from decodekit import copy_sentences, make_checkpoint, one_thread, train_copy_checkpoint
from transduce.cli import main
from transduce.config import Config, DataConfig
from transduce.errors import InteropError
from transduce.interop.marian import export_hf, import_hf, load_hf, residual_permutation
from transduce.model import Transformer, sinusoid
from transduce.search import generate
from transduce.search.common import pad_sequences
from transduce.search.translator import Translator
from transduce.training.checkpoint import load_model, save_model

transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")
transformers.utils.logging.disable_progress_bar()

SENTENCES = copy_sentences(40, seed=123)


def test_residual_permutation_maps_our_positions_onto_marians():
    """Marian's table is [sin | cos]; permuting our interleaved table's columns must give it exactly."""
    d = 16
    ours = sinusoid(torch.arange(50), d)
    model = transformers.MarianMTModel(
        transformers.MarianConfig(
            vocab_size=10,
            d_model=d,
            encoder_layers=1,
            decoder_layers=1,
            max_position_embeddings=50,
            pad_token_id=0,
            decoder_start_token_id=0,
            eos_token_id=1,
        )
    )
    theirs = model.model.encoder.embed_positions.weight
    torch.testing.assert_close(ours[:, residual_permutation(d)], theirs, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------------------------------
# export to Hugging Face


@pytest.fixture(scope="module")
def hf_export(copy_checkpoint: Path, tmp_path_factory) -> Path:
    return export_hf(copy_checkpoint, tmp_path_factory.mktemp("hf") / "model")


def test_hf_export_writes_what_marian_expects(hf_export: Path):
    names = {p.name for p in hf_export.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json",
            "tokenizer_config.json", "README.md"} <= names  # fmt: skip
    config = json.loads((hf_export / "config.json").read_text())
    assert config["model_type"] == "marian"
    tokenizer_config = json.loads((hf_export / "tokenizer_config.json").read_text())
    assert (tokenizer_config["source_lang"], tokenizer_config["target_lang"]) == ("en", "de")  # data.*_lang
    assert (config["pad_token_id"], config["decoder_start_token_id"], config["eos_token_id"]) == (0, 1, 2)


def test_hf_export_and_load_draw_no_progress_bars_and_leave_the_setting_as_it_was(
    copy_checkpoint: Path, tmp_path: Path, capfd
):
    from transformers.utils import logging as hf_logging

    for enabled in (True, False):
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
        try:
            out = export_hf(copy_checkpoint, tmp_path / f"hf-{enabled}")
            load_hf(out)
            assert hf_logging.is_progress_bar_enabled() == enabled
        finally:
            hf_logging.enable_progress_bar()
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err and "it/s" not in err


def test_hf_export_tokenizer_and_logits_equal_ours(copy_checkpoint: Path, hf_export: Path):
    ours = Translator.load(copy_checkpoint)
    tok = transformers.MarianTokenizer.from_pretrained(str(hf_export))
    hf = transformers.MarianMTModel.from_pretrained(str(hf_export)).eval()
    batch = tok(SENTENCES[:8], text_target=SENTENCES[:8], return_tensors="pt", padding=True)
    expected = [[*ours.tokenizer.encode_src(s), 2] for s in SENTENCES[:8]]
    assert [ids[: len(e)] for ids, e in zip(batch["input_ids"].tolist(), expected)] == expected
    tgt_in = torch.cat([torch.ones(8, 1, dtype=torch.long), batch["labels"][:, :-1].clamp(min=0)], dim=1)
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=tgt_in)
        mine = ours.model(batch["input_ids"], tgt_in)
    real = batch["labels"].ne(0) | tgt_in.eq(1)
    assert (mine - theirs.logits).abs()[real].max() < 1e-4


@pytest.mark.parametrize("beam", [1, 4])
def test_hf_generate_gives_our_translations(copy_checkpoint: Path, hf_export: Path, beam: int):
    ours = Translator.load(copy_checkpoint).translate(SENTENCES, beam=beam, length_penalty=0.0)
    tok = transformers.MarianTokenizer.from_pretrained(str(hf_export))
    hf = transformers.MarianMTModel.from_pretrained(str(hf_export)).eval()
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = hf.generate(**batch, num_beams=beam, length_penalty=0.0, max_new_tokens=60, do_sample=False)
    assert tok.batch_decode(out, skip_special_tokens=True) == ours


def test_hf_export_carries_the_decoding_settings(copy_checkpoint: Path, tmp_path: Path):
    model, config, vocab_dir = load_model(copy_checkpoint)
    decode = config.decode.replace(beam=5, length_penalty=1.0, length_norm="length", early_stopping=True)
    ckpt = save_model(tmp_path / "ckpt", model, config.replace(decode=decode), vocab_dir)
    out = export_hf(ckpt, tmp_path / "hf")
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["early_stopping"]) == (5, 1.0, True)
    card = (out / "README.md").read_text()
    assert "beam 5, length_penalty 1.0. Both transduce and Hugging Face divide" in card
    default = (export_hf(copy_checkpoint, tmp_path / "default") / "README.md").read_text()
    assert "transduce's length penalty is GNMT's" in default


def test_hf_export_refuses_what_pegasus_cannot_express(copy_checkpoint: Path, tmp_path: Path):
    """Pre-norm models go to Hugging Face as Pegasus, which has one embedding for both sides."""
    _, config, vocab_dir = load_model(copy_checkpoint)
    pre = config.model.replace(norm="pre", share_vocab=False)
    ckpt = save_model(tmp_path / "pre", Transformer(pre), Config(model=pre), vocab_dir)
    with pytest.raises(InteropError) as e:
        export_hf(ckpt, tmp_path / "out")
    assert str(e.value) == (
        f"{ckpt}: cannot export to Hugging Face Pegasus: model.share_vocab is false, and Pegasus (the pre-norm "
        "architecture of Hugging Face) has one embedding for encoder and decoder: train with data.joint_vocab true "
        "(export --format ctranslate2 takes it)"
    )
    assert not (tmp_path / "out").exists()


def test_a_multilingual_pre_norm_export_loads_through_the_auto_classes_as_documented(tmp_path: Path):
    """docs/multilingual.md's example: a pre-norm multilingual model (the recipe's) exports as Pegasus, which the
    Auto classes load and MarianMTModel does not; its tokenizer names no single target language (data.tgt_lang "de"
    is not what a model writing German and French writes); greedy ``generate`` with the token in the text gives our
    translations in each language."""
    ckpt = make_checkpoint(tmp_path / "ml", lang_tokens=(">>deu<<", ">>fra<<"), norm="pre", max_len_b=8)
    out = export_hf(ckpt, tmp_path / "hf")
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert (tokenizer_config["source_lang"], tokenizer_config["target_lang"]) == ("en", None)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    assert (type(tok).__name__, type(hf).__name__) == ("MarianTokenizer", "PegasusForConditionalGeneration")
    ours = Translator.load(ckpt)
    texts = ["a man rides the bike.", "the dog.", "ein Hund fährt."]
    for code in ("deu", "fra"):
        batch = tok([f">>{code}<< {t}" for t in texts], return_tensors="pt", padding=True)
        with torch.inference_mode():
            generated = hf.generate(**batch, num_beams=1, max_new_tokens=9, do_sample=False)
        expected = ours.translate(texts, beam=1, tgt_lang=code, max_len_a=0.0, max_len_b=8)
        assert tok.batch_decode(generated, skip_special_tokens=True) == expected
    post = export_hf(make_checkpoint(tmp_path / "post", lang_tokens=(">>deu<<", ">>fra<<")), tmp_path / "hf_post")
    assert json.loads((post / "tokenizer_config.json").read_text())["target_lang"] is None  # whatever the norm
    _, config, vocab = load_hf(post)  # imported back (Marian only): the tokens, and no target_lang to take
    assert list(vocab.lang_tokens()) == [">>deu<<", ">>fra<<"] and config.data.tgt_lang == DataConfig().tgt_lang


def test_cli_export_refuses_a_non_empty_directory_unless_forced(copy_checkpoint: Path, tmp_path: Path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert main(["export", "--format", "hf", "--model", str(copy_checkpoint), "-o", str(out)]) == 2
    assert "directory exists and is not empty (use --force to replace it)" in capsys.readouterr().err
    assert main(["export", "--format", "hf", "--force", "--model", str(copy_checkpoint), "--output", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "keep.txt").exists()


# ----------------------------------------------------------------------------------------------------------------------
# import from Hugging Face


def make_marian_dir(directory: Path, *, share: bool, seed: int = 0) -> Path:
    """A random MarianMTModel with Marian's own conventions (eos 0, unk 1, pad last and decoder start = pad, swish,
    a non-zero final_logits_bias) and a SentencePiece vocabulary trained here, saved as a Hugging Face directory."""
    import sentencepiece as spm

    directory.mkdir(parents=True)
    text = copy_sentences(300, seed)
    vocabs = []
    for side in ("source", "target"):
        prefix = directory / f"{side}_spm"
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([s.upper() if side == "target" and not share else s for s in text]),
            model_prefix=str(prefix), vocab_size=36, model_type="unigram", minloglevel=2,
        )  # fmt: skip
        Path(f"{prefix}.model").rename(directory / f"{side}.spm")
        proc = spm.SentencePieceProcessor(model_file=str(directory / f"{side}.spm"))
        pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size()) if not proc.is_control(i)]
        pieces = [p for p in pieces if p not in ("<unk>", "</s>", "<s>")]
        vocabs.append({"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}})
        vocabs[-1]["<pad>"] = len(vocabs[-1])
        if share:
            break
    (directory / "vocab.json").write_text(json.dumps(vocabs[0]))
    if not share:
        (directory / "target_vocab.json").write_text(json.dumps(vocabs[1]))
    else:
        (directory / "target.spm").write_bytes((directory / "source.spm").read_bytes())
    src_v, tgt_v = len(vocabs[0]), len(vocabs[-1])
    assert src_v == tgt_v  # Marian has one pad id for both sides: the last id of both vocabularies
    config = transformers.MarianConfig(
        vocab_size=src_v, decoder_vocab_size=tgt_v, share_encoder_decoder_embeddings=share, d_model=32,
        encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish", max_position_embeddings=128,
        scale_embedding=True, pad_token_id=src_v - 1, decoder_start_token_id=tgt_v - 1, eos_token_id=0,
        forced_eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    hf = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0.0, 0.25)  # far from uniform outputs, so that translations are not near ties
        hf.final_logits_bias.normal_(0.0, 1.0)
    hf.generation_config.bad_words_ids = [[tgt_v - 1]]
    hf.save_pretrained(str(directory))
    tok = transformers.MarianTokenizer(
        source_spm=str(directory / "source.spm"), target_spm=str(directory / "target.spm"),
        vocab=str(directory / "vocab.json"),
        target_vocab_file=None if share else str(directory / "target_vocab.json"), separate_vocabs=not share,
    )  # fmt: skip
    tok.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module", params=[True, False], ids=["shared-vocab", "separate-vocabs"])
def marian_dir(request, tmp_path_factory) -> Path:
    return make_marian_dir(tmp_path_factory.mktemp("marian") / "model", share=request.param)


def test_marian_pad_conventions_are_kept(marian_dir: Path):
    model, _, vocab = load_hf(marian_dir)
    c = model.config
    assert (c.eos_id, c.unk_id, c.pad_id, c.bos_id) == (0, 1, c.src_vocab_size - 1, c.tgt_vocab_size - 1)
    assert c.output_bias and c.activation == "swish"
    assert vocab.separate == (c.share_vocab is False)


def test_imported_logits_equal_marians(marian_dir: Path):
    hf = transformers.MarianMTModel.from_pretrained(str(marian_dir)).eval()
    model, _, _ = load_hf(marian_dir)
    c = model.config
    rng = random.Random(0)
    src = pad_sequences([[rng.randrange(2, c.src_vocab_size - 1) for _ in range(n)] + [0] for n in (9, 3, 6)], c.pad_id)
    tgt = pad_sequences([[c.bos_id] + [rng.randrange(2, c.tgt_vocab_size - 1) for _ in range(n)] for n in (5, 8, 2)],
                        c.pad_id)  # fmt: skip
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src.ne(c.pad_id).long(), decoder_input_ids=tgt).logits
        ours = model(src, tgt)
    real = tgt.ne(c.pad_id)
    real[:, 0] = True
    assert (ours - theirs).abs()[real].max() < 1e-4


@pytest.mark.parametrize("beam", [1, 4])
def test_imported_translations_equal_marian_generate(marian_dir: Path, tmp_path: Path, beam: int):
    tok = transformers.MarianTokenizer.from_pretrained(str(marian_dir))
    hf = transformers.MarianMTModel.from_pretrained(str(marian_dir)).eval()
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = hf.generate(**batch, num_beams=beam, length_penalty=0.0, max_new_tokens=12, do_sample=False)
    expected = tok.batch_decode(out, skip_special_tokens=True)
    direct = Translator.load(marian_dir)  # a Marian directory loads as it is
    options = dict(beam=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=11)  # 11 tokens + forced eos
    assert direct.translate(SENTENCES, **options) == expected
    imported = Translator.load(import_hf(marian_dir, tmp_path / "ckpt"))
    assert imported.translate(SENTENCES, **options) == expected


def test_import_then_export_gives_back_the_same_marian_model(marian_dir: Path, tmp_path: Path):
    ckpt = import_hf(marian_dir, tmp_path / "ckpt")
    again = export_hf(ckpt, tmp_path / "hf")
    a = transformers.MarianMTModel.from_pretrained(str(marian_dir)).eval()
    b = transformers.MarianMTModel.from_pretrained(str(again)).eval()
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=1e-6, rtol=0, msg=k)
    assert json.loads((again / "vocab.json").read_text()) == json.loads((marian_dir / "vocab.json").read_text())


def test_cli_import_hf(marian_dir: Path, tmp_path: Path, capsys):
    assert main(["import-hf", "--model", str(marian_dir), "-o", str(tmp_path / "ckpt")]) == 0
    assert "imported:" in capsys.readouterr().out
    assert (
        Translator.load(tmp_path / "ckpt").translate(["a man ."], beam=1)[0]
        == Translator.load(marian_dir).translate(["a man ."], beam=1)[0]
    )


def test_import_of_a_non_marian_directory_says_so(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bart"}))
    with pytest.raises(InteropError, match="not a Hugging Face Marian model"):
        load_hf(tmp_path)


# ----------------------------------------------------------------------------------------------------------------------
# CTranslate2


def ct2_translate(model_dir: Path, translator: Translator, sentences: list[str], beam: int, max_out: int):
    """CTranslate2's translations as our token ids."""
    ct = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    tok = translator.tokenizer
    pieces = [tok.src_pieces(tok.encode_src(s)) for s in sentences]
    results = ct.translate_batch(
        pieces, beam_size=beam, length_penalty=0.0, max_decoding_length=max_out, min_decoding_length=0
    )
    vocab = {p: i for i, p in enumerate(tok.tgt_pieces(range(tok.tgt_vocab_size)))}
    return [[vocab[p] for p in r.hypotheses[0]] for r in results]


def our_tokens(translator: Translator, sentences: list[str], beam: int, max_out: int) -> list[list[int]]:
    cfg = translator.decode.replace(beam=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=max_out)
    src = pad_sequences([[*translator.tokenizer.encode_src(s), 2] for s in sentences], 0)
    with one_thread():
        return [hyps[0].tokens for hyps in generate(translator.model, src, cfg)]


@pytest.fixture(scope="module")
def pre_norm_checkpoint(tmp_path_factory) -> Path:
    return train_copy_checkpoint(tmp_path_factory.mktemp("pre"), steps=150, norm="pre")


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2_float32_translates_token_for_token_like_us(
    copy_checkpoint: Path, pre_norm_checkpoint: Path, tmp_path: Path, norm: str, beam: int
):
    ckpt = copy_checkpoint if norm == "post" else pre_norm_checkpoint
    from transduce.interop.ctranslate2 import export_ctranslate2

    out = export_ctranslate2(ckpt, tmp_path / "ct2")
    assert (out / "model.bin").is_file() and (out / "spm.model").is_file()
    translator = Translator.load(ckpt)
    assert ct2_translate(out, translator, SENTENCES, beam, 30) == our_tokens(translator, SENTENCES, beam, 30)


def test_ctranslate2_length_normalised_nbest_equals_ours(copy_checkpoint: Path, tmp_path: Path):
    """``length_norm="length"`` is CTranslate2's normalisation (log-probability / |Y| ** alpha) and
    ``early_stopping`` its stopping rule: the 4-best lists agree token for token and score for score.
    ``min_decoding_length=0`` as our ``min_len``: CTranslate2's default (1) bars EOS from the first step and
    renormalises over the other tokens, which moves its scores by up to p(EOS first) (0.5% on a model trained here)."""
    from transduce.interop.ctranslate2 import export_ctranslate2

    translator = Translator.load(copy_checkpoint)
    ct = ctranslate2.Translator(str(export_ctranslate2(copy_checkpoint, tmp_path / "ct2")), device="cpu")
    tok = translator.tokenizer
    pieces = [tok.src_pieces(tok.encode_src(s)) for s in SENTENCES]
    results = ct.translate_batch(
        pieces, beam_size=4, num_hypotheses=4, length_penalty=1.0, max_decoding_length=30, min_decoding_length=0,
        return_scores=True,
    )  # fmt: skip
    vocab = {p: i for i, p in enumerate(tok.tgt_pieces(range(tok.tgt_vocab_size)))}
    cfg = translator.decode.replace(
        beam=4, nbest=4, length_penalty=1.0, length_norm="length", early_stopping=True, max_len_a=0.0, max_len_b=30
    )
    src = pad_sequences([[*tok.encode_src(s), 2] for s in SENTENCES], 0)
    with one_thread():
        ours = generate(translator.model, src, cfg)
    for theirs, mine in zip(results, ours):
        assert [[vocab[p] for p in h] for h in theirs.hypotheses] == [h.tokens for h in mine]
        assert theirs.scores == pytest.approx([h.score for h in mine], rel=1e-4, abs=1e-6)  # |Y| counts EOS in both


def test_ctranslate2_int8_export(copy_checkpoint: Path, tmp_path: Path):
    from transduce.interop.ctranslate2 import export_ctranslate2

    out = export_ctranslate2(copy_checkpoint, tmp_path / "int8", quantization="int8")
    assert json.loads((out / "transduce.json").read_text())["quantization"] == "int8"
    f32 = export_ctranslate2(copy_checkpoint, tmp_path / "f32")
    # int8 weights are a quarter of float32 ones; the position table (512 KiB here) stays float32
    assert (out / "model.bin").stat().st_size < 0.7 * (f32 / "model.bin").stat().st_size
    translator = Translator.load(copy_checkpoint)
    got = ct2_translate(out, translator, SENTENCES, 4, 30)
    want = our_tokens(translator, SENTENCES, 4, 30)
    assert sum(g == w for g, w in zip(got, want)) >= 0.8 * len(SENTENCES)  # int8 is close, not exact


def test_cli_export_ctranslate2_rejects_quantization_for_hf(copy_checkpoint: Path, tmp_path: Path, capsys):
    assert (
        main(
            ["export", "--format", "hf", "--quantization", "int8", "--model", str(copy_checkpoint), "-o", str(tmp_path)]
        )
        == 2
    )
    assert "--quantization applies to --format ctranslate2 only" in capsys.readouterr().err
