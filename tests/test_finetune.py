"""Fine-tuning from a pretrained model (train.init_from): the loss it starts from, the vocabulary it encodes with,
extension, freezing, mixing, and the way back to Hugging Face and CTranslate2."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from decodekit import COPY_WORDS, copy_sentences, train_copy_checkpoint
from transduce.cli import main
from transduce.config import Config, DataConfig, ModelConfig, TrainConfig
from transduce.data import ParallelDataset
from transduce.data.sampler import MixedBatchSampler, TokenBatchSampler
from transduce.interop.ctranslate2 import export_ctranslate2
from transduce.interop.marian import export_hf, load_hf
from transduce.search.translator import Translator
from transduce.text.vocab import load_vocabulary
from transduce.training.checkpoint import load_model, load_trainer_state, resolve
from transduce.training.finetune import FinetuneError
from transduce.training.train import train

transformers = pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")
transformers.utils.logging.disable_progress_bar()
from test_interop import make_marian_dir  # noqa: E402  (needs transformers)

NEW_WORDS = ["řeka", "kůň", "žena", "dívka", "běží", "čte"]  # letters the copy vocabularies never saw


def write_pairs(directory: Path, src: list[str], tgt: list[str], split: str = "train") -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (directory / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return str(directory / split)


def czech_sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = COPY_WORDS + NEW_WORDS * 2
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 5))) + "." for _ in range(n)]


def finetune_config(run_dir: Path, init_from: Path, train_prefix: str, *, model: dict | None = None, **train_opts):
    options = dict(
        run_dir=str(run_dir),
        init_from=str(init_from),
        max_steps=1,
        label_smoothing=0.0,
        log_every=1,
        valid_every=0,
        valid_bleu=False,
        threads=1,
        max_tokens=100_000,
        warmup_steps=1,
        keep_last=0,
        precision="fp32",  # exact comparisons; `auto` picks bf16 on a CPU with bf16 units
    )
    options.update(train_opts)  # fmt: skip
    return Config(
        model=ModelConfig(**({"dropout": 0.0} | (model or {}))),
        data=DataConfig(train=train_prefix, src_lang="en", tgt_lang="de", workers=1),
        train=TrainConfig(**options),
    )


def first_loss(run_dir: Path) -> float:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(e["loss"] for e in events if e["event"] == "train" and e["step"] == 1)


@pytest.fixture(scope="module", params=[True, False], ids=["shared-vocab", "separate-vocabs"])
def marian_dir(request, tmp_path_factory) -> Path:
    return make_marian_dir(tmp_path_factory.mktemp("marian") / "model", share=request.param)


@pytest.fixture(scope="module")
def copy_pre(tmp_path_factory) -> Path:
    """A trained pre-norm copy model (a standalone checkpoint)."""
    return train_copy_checkpoint(tmp_path_factory.mktemp("copy_pre"), steps=200, norm="pre")


# ----------------------------------------------------------------------------------------------------------------------
# starting from a Marian model


def test_first_loss_equals_marians_and_each_side_has_its_own_spm(marian_dir: Path, tmp_path: Path):
    share = json.loads((marian_dir / "config.json").read_text())["share_encoder_decoder_embeddings"]
    src = copy_sentences(30, seed=7)
    tgt = src if share else [s.upper() for s in src]  # the separate target vocabulary was trained on uppercase
    run = tmp_path / "run"
    train(finetune_config(run, marian_dir, write_pairs(tmp_path / "corpus", src, tgt)))
    # the prepared ids are MarianTokenizer's: source.spm for the source, target.spm (and its table) for the target
    tok = transformers.MarianTokenizer.from_pretrained(str(marian_dir))
    data = ParallelDataset(run / "data", "train")
    assert len(data) == len(src)
    order = np.argsort(data.line_index)
    got_src = [data[int(i)][0].tolist() for i in order]
    got_tgt = [data[int(i)][1].tolist() for i in order]
    assert got_src == tok(src, add_special_tokens=False)["input_ids"]
    assert got_tgt == tok(text_target=tgt, add_special_tokens=False)["input_ids"]
    if not share:  # the other way round would give other ids: the test can tell the sides apart
        assert got_tgt != tok(tgt, add_special_tokens=False)["input_ids"]
    # the first update's loss is MarianMTModel's own loss on the same pairs (before any update)
    hf = transformers.MarianMTModel.from_pretrained(str(marian_dir)).eval()
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id
    width = max(map(len, got_src + got_tgt)) + 1
    input_ids = torch.tensor([s + [eos] + [pad] * (width - len(s) - 1) for s in got_src])
    labels = torch.tensor([t + [eos] + [-100] * (width - len(t) - 1) for t in got_tgt])
    with torch.no_grad():
        expected = hf(input_ids=input_ids, attention_mask=input_ids.ne(pad).long(), labels=labels).loss.item()
    assert abs(first_loss(run) - expected) < 1e-4


def test_a_contradicting_model_section_is_an_error(marian_dir: Path, tmp_path: Path):
    corpus = write_pairs(tmp_path / "corpus", copy_sentences(10, 1), copy_sentences(10, 1))
    config = finetune_config(tmp_path / "run", marian_dir, corpus, model={"d_model": 64, "heads": 4})
    with pytest.raises(FinetuneError) as e:
        train(config)
    assert str(e.value) == (
        f"model.d_model: the config says 64, the pretrained model {marian_dir} has 32 (the architecture comes from "
        "train.init_from: drop model.d_model from the config)"
    )


def test_marian_extension_keeps_ids_and_rows_and_exports(marian_dir: Path, tmp_path: Path):
    src = czech_sentences(60, seed=3)
    run = tmp_path / "run"
    train(finetune_config(run, marian_dir, write_pairs(tmp_path / "corpus", src, src), max_steps=2, extend_vocab=60,
                          peak_lr=1e-3))  # fmt: skip
    old_model, _, old_vocab = load_hf(marian_dir)
    _, config, vocab_dir = load_model(run)
    vocab = load_vocabulary(vocab_dir)
    n_src, n_tgt = old_vocab.src_vocab_size, old_vocab.tgt_vocab_size
    assert vocab.src_vocab_size > n_src and vocab.tgt_vocab_size > n_tgt
    assert vocab.pieces_in_id_order("src")[:n_src] == old_vocab.pieces_in_id_order("src")  # old ids kept
    assert vocab.pieces_in_id_order("tgt")[:n_tgt] == old_vocab.pieces_in_id_order("tgt")
    assert config.model.pad_id == old_model.config.pad_id  # Marian's pad (its last id before extension) stays
    ids = vocab.encode_src("žena čte.")
    assert any(i >= n_src for i in ids) and old_vocab.unk_id not in ids  # new pieces are used, no unknowns left
    # the exported tokenizer knows them, and both exports translate as we do
    hf_dir = export_hf(run, tmp_path / "hf")
    tok = transformers.MarianTokenizer.from_pretrained(str(hf_dir))
    assert tok("žena čte.", add_special_tokens=False)["input_ids"] == ids
    sentences = czech_sentences(12, seed=9)
    ours = Translator.load(run).translate(sentences, beam=4, length_penalty=0.0, max_len_a=0.0, max_len_b=11)
    hf = transformers.MarianMTModel.from_pretrained(str(hf_dir)).eval()
    batch = tok(sentences, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = hf.generate(**batch, num_beams=4, length_penalty=0.0, max_new_tokens=12, do_sample=False)
    assert tok.batch_decode(out, skip_special_tokens=True) == ours
    ct = ctranslate2.Translator(str(export_ctranslate2(run, tmp_path / "ct2")), device="cpu", intra_threads=1)
    pieces = [vocab.src_pieces(vocab.encode_src(s)) for s in sentences]
    results = ct.translate_batch(pieces, beam_size=4, length_penalty=0.0, max_decoding_length=11,
                                 min_decoding_length=0, suppress_sequences=[["<pad>"]])  # fmt: skip
    table = {p: i for i, p in enumerate(vocab.pieces_in_id_order("tgt"))}
    assert [vocab.decode_tgt([table[p] for p in r.hypotheses[0]]) for r in results] == ours


# ----------------------------------------------------------------------------------------------------------------------
# starting from a transduce model


def test_extension_keeps_every_old_row_bit_for_bit_and_initialises_new_ones(copy_pre: Path, tmp_path: Path):
    sentences = czech_sentences(80, seed=4)
    run = tmp_path / "run"
    train(finetune_config(run, copy_pre, write_pairs(tmp_path / "corpus", sentences, sentences), max_steps=0,
                          extend_vocab=80))  # fmt: skip
    old, _, old_vocab_dir = load_model(copy_pre)
    new, _, vocab_dir = load_model(run)
    old_vocab, vocab = load_vocabulary(old_vocab_dir), load_vocabulary(vocab_dir)
    n = old.config.src_vocab_size
    assert new.config.src_vocab_size == vocab.src_vocab_size > n
    assert torch.equal(new.src_embed.weight[:n], old.src_embed.weight)  # bit for bit
    for name, tensor in old.state_dict().items():  # and everything else is the pretrained model's
        if "embed" not in name and not name.startswith("output."):
            assert torch.equal(new.state_dict()[name], tensor), name
    piece = vocab.src_pieces([n])[0]  # a new row is the mean of the rows of the piece's old segmentation
    ids = old_vocab.encode_src(piece.replace("▁", " "))
    if not piece.startswith("▁") and old_vocab.src_pieces(ids[:1]) == ["▁"]:
        ids = ids[1:]
    torch.testing.assert_close(new.src_embed.weight[n], old.src_embed.weight[ids].mean(0), rtol=0, atol=1e-7)
    data = ParallelDataset(run / "data", "train")
    assert max(int(data[i][0].max()) for i in range(len(data))) >= n  # the corpus is encoded with the new pieces


def test_finetuned_pre_norm_model_round_trips_to_hf_and_ctranslate2(copy_pre: Path, tmp_path: Path):
    sentences = czech_sentences(80, seed=5)
    run = tmp_path / "run"
    train(finetune_config(run, copy_pre, write_pairs(tmp_path / "corpus", sentences, sentences), max_steps=30,
                          extend_vocab=80, peak_lr=3e-3, warmup_steps=5))  # fmt: skip
    probe = czech_sentences(16, seed=11)
    ours = Translator.load(run).translate(probe, beam=4, length_penalty=0.0)
    # Hugging Face (a pre-norm model is a Pegasus model there): logits within 1e-4 and the same beam-4 output
    hf_dir = export_hf(run, tmp_path / "hf")
    assert json.loads((hf_dir / "config.json").read_text())["model_type"] == "pegasus"
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(hf_dir)).eval()
    model, _, _ = load_model(run)
    batch = tok(probe, text_target=probe, return_tensors="pt", padding=True)
    bos = model.config.bos_id
    tgt_in = torch.cat([torch.full((len(probe), 1), bos), batch["labels"][:, :-1].clamp(min=0)], dim=1)
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=tgt_in)
        mine = model(batch["input_ids"], tgt_in)
    real = batch["labels"].ne(model.config.pad_id) | tgt_in.eq(bos)
    assert (mine - theirs.logits).abs()[real].max() < 1e-4
    with torch.inference_mode():
        out = hf.generate(**tok(probe, return_tensors="pt", padding=True), num_beams=4, length_penalty=0.0,
                          max_new_tokens=60, do_sample=False)  # fmt: skip
    assert tok.batch_decode(out, skip_special_tokens=True) == ours
    assert any(i >= 300 for i in tok("žena čte.", add_special_tokens=False)["input_ids"])  # knows the new pieces
    # CTranslate2, with the SentencePiece model copied beside it (extended too)
    import sentencepiece as spm

    ct2_dir = export_ctranslate2(run, tmp_path / "ct2")
    sp = spm.SentencePieceProcessor(model_file=str(ct2_dir / "spm.model"))
    result = ctranslate2.Translator(str(ct2_dir)).translate_batch(
        [sp.encode(s, out_type=str) for s in probe], beam_size=4, length_penalty=0.0, max_decoding_length=60
    )
    assert [sp.decode(r.hypotheses[0]) for r in result] == ours


@pytest.mark.parametrize(
    "option, frozen",
    [
        ({"freeze_embeddings": True}, lambda name: "embed" in name or name == "output.weight"),
        ({"freeze_encoder": True}, lambda name: name.startswith(("encoder_", "src_embed", "tgt_embed", "output.w"))),
        ({"train_last_layers": 1}, lambda name: "embed" in name or name == "output.weight" or ".0." in name),
    ],
    ids=["embeddings", "encoder", "last-layer"],
)
def test_frozen_parameters_stay_bit_identical(copy_pre: Path, tmp_path: Path, option: dict, frozen):
    sentences = copy_sentences(60, seed=6)
    run = tmp_path / "run"
    train(finetune_config(run, copy_pre, write_pairs(tmp_path / "corpus", sentences, sentences), max_steps=3,
                          max_tokens=300, peak_lr=1e-2, **option))  # fmt: skip
    before, _, _ = load_model(copy_pre)
    after, _, _ = load_model(run)
    old, new = before.state_dict(), after.state_dict()
    kept = [name for name in old if frozen(name)]
    assert kept and all(torch.equal(old[name], new[name]) for name in kept)
    assert all(not torch.equal(old[name], new[name]) for name in old if not frozen(name) and name.endswith("weight"))


def test_optimizer_state_can_be_kept(tmp_path: Path):
    sentences = copy_sentences(60, seed=8)
    corpus = write_pairs(tmp_path / "corpus", sentences, sentences)
    base = Config(
        model=ModelConfig.preset("test"),
        data=DataConfig(train=corpus, src_lang="en", tgt_lang="de", workers=1, vocab_size=300),
        train=TrainConfig(run_dir=str(tmp_path / "base"), max_steps=2, valid_every=0, valid_bleu=False, threads=1,
                          log_every=1, warmup_steps=1, precision="fp32"),
    )  # fmt: skip
    train(base)
    run = tmp_path / "run"
    train(finetune_config(run, tmp_path / "base", corpus, max_steps=1, init_optimizer=True, model={"dropout": 0.1}))
    saved = load_trainer_state(resolve(tmp_path / "base"))["trainer"]["optimizer"]["state"]
    now = load_trainer_state(resolve(run))["trainer"]
    assert now["step"] == 1  # the step restarts; Adam's own count goes on from the checkpoint's
    assert int(now["optimizer"]["state"][0]["step"]) == int(saved[0]["step"]) + 1


def test_cli_init_from_and_config_checks(marian_dir: Path, tmp_path: Path):
    corpus = write_pairs(tmp_path / "corpus", copy_sentences(20, 2), copy_sentences(20, 2))
    config = tmp_path / "ft.yaml"
    config.write_text(finetune_config(tmp_path / "run", Path("unused"), corpus).to_yaml().replace(
        "init_from: unused", "init_from: ''"))  # fmt: skip
    # overrides may follow --init-from (argparse alone would refuse them there)
    assert main(["train", str(config), "--init-from", str(marian_dir), "train.max_steps=2"]) == 0
    trained = load_model(tmp_path / "run")[1].train
    assert (trained.init_from, trained.max_steps) == (str(marian_dir), 2)
    with pytest.raises(SystemExit):
        main(["train", str(config), "--init-from", str(marian_dir), "--no-such-option"])
    with pytest.raises(Exception, match="extend_vocab: needs train.init_from"):
        TrainConfig(extend_vocab=100)


# ----------------------------------------------------------------------------------------------------------------------
# mixing and the vocabulary interface


def test_mixing_share_holds_within_sampling_error():
    rng = np.random.default_rng(0)
    main_src, main_tgt = rng.integers(1, 30, 4000), rng.integers(1, 30, 4000)
    mix_src, mix_tgt = rng.integers(1, 30, 3000), rng.integers(1, 30, 3000)
    main = TokenBatchSampler(main_src, main_tgt, int(600 * 0.7), seed=1)
    mixed = MixedBatchSampler(main, mix_src, mix_tgt, 0.3, offset=4000, seed=1)
    batches = list(mixed.iter_from(0)) + list(mixed.iter_from(1))
    from_mix = sum(sum(i >= 4000 for i in b) for b in batches)
    total = sum(len(b) for b in batches)
    sigma = (0.3 * 0.7 / total) ** 0.5
    assert abs(from_mix / total - 0.3) < 4 * sigma
    assert all(any(i >= 4000 for i in b) for b in batches if len(b) >= 10)  # in every batch, not in some
    assert sorted(i for b in batches[: len(mixed)] for i in b if i < 4000) == list(range(4000))  # all main pairs
    longest = np.maximum(main_src, main_tgt)
    mix_longest = np.maximum(mix_src, mix_tgt)
    for b in batches:  # the mixed-in pairs are no longer than the batch's own longest: no extra padding
        top = max(longest[i] for i in b if i < 4000)
        assert all(mix_longest[i - 4000] <= top for i in b if i >= 4000)
    assert list(mixed.iter_from(1, 5)) == batches[len(mixed) + 5 :]  # resumable


def test_tokenizer_does_not_import_interop():
    code = "import sys, transduce.text.tokenizer; print(any(m.startswith('transduce.interop') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_mixed_fine_tuning_run_resumes(copy_pre: Path, tmp_path: Path):
    """data.mix is prepared with the pretrained vocabulary beside the new corpus and mixed into training; a fine-tuned
    run resumes from its own checkpoint (not from init_from again), keeping its vocabulary and frozen parameters."""
    new = czech_sentences(40, seed=12)
    general = copy_sentences(40, seed=13)
    corpus = write_pairs(tmp_path / "corpus", new, new)
    mix = write_pairs(tmp_path / "general", general, general)
    run = tmp_path / "run"
    config = finetune_config(run, copy_pre, corpus, max_steps=2, max_tokens=200, extend_vocab=80,
                             freeze_embeddings=True)  # fmt: skip
    config = config.replace(data=config.data.replace(mix=mix, mix_share=0.5))
    train(config)
    manifest = json.loads((run / "data" / "manifest.json").read_text())
    assert manifest["splits"]["mix"]["pairs"] == 40
    first, _, _ = load_model(run)
    outcome = train(resume=run, overrides=["train.max_steps=4"])
    assert outcome.step == 4
    again, _, _ = load_model(run)
    assert torch.equal(first.src_embed.weight, again.src_embed.weight)  # still frozen, and not re-initialised
    assert not torch.equal(first.encoder_layers[0].ffn.w1.weight, again.encoder_layers[0].ffn.w1.weight)


def test_prepare_encodes_with_the_init_from_vocabulary_that_train_then_reuses(copy_pre: Path, tmp_path: Path, caplog):
    sentences = czech_sentences(80, seed=5)
    config = finetune_config(tmp_path / "run", copy_pre, write_pairs(tmp_path / "corpus", sentences, sentences),
                             max_steps=0, extend_vocab=80)  # fmt: skip
    config.save(tmp_path / "ft.yaml")
    prepared = tmp_path / "prepared"
    assert main(["prepare", "--config", str(tmp_path / "ft.yaml"), "-o", str(prepared)]) == 0
    # the pretrained vocabulary, extended: the ids of the copy model's pieces are kept, the new pieces come after
    n = load_vocabulary(load_model(copy_pre)[2]).src_vocab_size
    assert load_vocabulary(prepared).src_vocab_size > n
    with caplog.at_level("INFO", logger="transduce.data.preparation"):
        train(config.replace(data=config.data.replace(prepared=str(prepared))))
    assert "already holds this preparation (same inputs and options); reusing it" in caplog.text
