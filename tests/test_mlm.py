"""Masked-language-model pretraining (data.task: mlm): BERT's masking (15% chosen, 80/10/10, never a special id), a
loss over the chosen positions only, a toy corpus learnt, resuming with the same masks, the vocabulary of another
run taken file for file, a classifier started from the pretrained encoder (fine-tuning and CoVe), and one-line errors
for bad input and for what cannot take a masked language model."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from decodekit import make_checkpoint
from transduce.cli import main
from transduce.config import Config, ConfigError, ModelConfig
from transduce.data import ParallelDataset, prepare
from transduce.errors import CheckpointError, DataError
from transduce.search.common import pad_sequences
from transduce.search.translator import Translator
from transduce.training import checkpoint as ckpt
from transduce.training.finetune import FinetuneError, _pretrained
from transduce.training.runlog import read_metrics
from transduce.training.train import train
from transduce.transfer.classify import load_classifier, transfer
from transduce.transfer.classify.model import ENCODER_PREFIXES, ClassifierModel
from transduce.transfer.mlm import load_masked_lm
from transduce.transfer.mlm.data import FixedMasking, MaskedEpochs, collate_masked
from transduce.transfer.mlm.masking import MaskedText, Masker
from transduce.transfer.mlm.model import MaskedLM
from transduce.transfer.mlm.training import loss_sums

LETTERS = "abcdefghijklmnop"


def toy_texts(n: int, seed: int) -> list[str]:
    """Runs of 5-10 consecutive letters (``d e f g h``): a hidden letter follows from its neighbours."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(5, 10)
        start = rng.randrange(len(LETTERS) - length + 1)
        out.append(" ".join(LETTERS[start : start + length]))
    return out


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    """A training and a validation text file of the toy corpus."""
    root = tmp_path_factory.mktemp("toy")
    return write_lines(root / "train.txt", toy_texts(300, 1)), write_lines(root / "valid.txt", toy_texts(40, 2))


def mlm_config(run_dir: Path, train_file: Path | str, valid_file: Path | str = "", *, data: dict | None = None,
               **train_opts) -> Config:  # fmt: skip
    options = dict(run_dir=str(run_dir), max_steps=40, schedule="inverse_sqrt", peak_lr=3e-3, warmup_steps=5,
                   max_tokens=300, threads=1, log_every=5, valid_every=0, keep_last=2, label_smoothing=0.0,
                   precision="fp32")  # fmt: skip
    options.update(train_opts)
    return Config.from_dict({
        "model": {"preset": "test", "dropout": 0.0},
        "data": {"task": "mlm", "train": str(train_file), "valid": str(valid_file), "vocab_size": 290, "workers": 1,
                 **(data or {})},
        "train": options,
    })  # fmt: skip


def masker(vocab: int = 40) -> Masker:
    return Masker.for_model(ModelConfig.preset("test", src_vocab_size=vocab, tgt_vocab_size=vocab))


def tiny_mlm(vocab: int = 40) -> MaskedLM:
    torch.manual_seed(0)
    return MaskedLM(ModelConfig.preset("test", src_vocab_size=vocab, tgt_vocab_size=vocab, dropout=0.0)).eval()


# ----------------------------------------------------------------------------------------------------------------------
# the masking


def test_bert_shares_over_many_pieces_and_never_a_special_id():
    m = masker(1000)
    rng = np.random.default_rng(0)
    chosen = masked = randomised = kept = real = 0
    for i in range(2000):
        ids = rng.integers(4, 1000, size=rng.integers(8, 30))
        ids[rng.integers(len(ids))] = 2  # an eos, a bos and a pad inside the text: never chosen
        ids[rng.integers(len(ids))] = 1
        ids[rng.integers(len(ids))] = 0
        text = m(ids, np.random.default_rng([7, i]))
        special = np.isin(ids, (0, 1, 2))
        real += int((~special).sum())
        assert len(text.chosen) >= 1 and not special[text.chosen].any()
        assert np.array_equal(text.labels, ids[text.chosen])
        assert np.isin(text.masked, text.chosen).all() and (text.ids[text.masked] == 3).all()  # unk under the mask
        unchosen = np.setdiff1d(np.arange(len(ids)), text.chosen)
        assert np.array_equal(text.ids[unchosen], ids[unchosen])  # only chosen pieces change
        others = np.setdiff1d(text.chosen, text.masked)
        changed = others[text.ids[others] != ids[others]]
        assert not np.isin(text.ids[changed], (0, 1, 2, 3)).any()  # random pieces are ordinary ones
        chosen, masked = chosen + len(text.chosen), masked + len(text.masked)
        randomised, kept = randomised + len(changed), kept + len(others) - len(changed)
    assert chosen / real == pytest.approx(0.15, abs=0.003)
    assert masked / chosen == pytest.approx(0.8, abs=0.015)
    assert randomised / chosen == pytest.approx(0.1, abs=0.01)  # (a random piece equal to the original: 1 in 996)
    assert kept / chosen == pytest.approx(0.1, abs=0.01)


def test_every_text_gets_a_chosen_piece_and_the_expected_count_is_fifteen_percent_of_its_length():
    m = masker()
    for n in (1, 2, 6):
        counts = [len(m(np.full(n, 9), np.random.default_rng([n, i])).chosen) for i in range(400)]
        assert min(counts) == 1
    counts = [len(m(np.full(20, 9), np.random.default_rng([20, i])).chosen) for i in range(400)]
    assert set(counts) == {3}  # 15% of 20
    counts = [len(m(np.full(11, 9), np.random.default_rng([11, i])).chosen) for i in range(2000)]
    assert set(counts) == {1, 2} and np.mean(counts) == pytest.approx(1.65, abs=0.03)
    assert len(m(np.asarray([2, 0]), np.random.default_rng(0)).chosen) == 0  # only special ids: nothing to choose


def test_the_batch_marks_the_mask_and_pad_and_eos_are_never_predicted():
    m = masker()
    texts = [m(np.arange(4, 4 + n), np.random.default_rng(n)) for n in (12, 3, 25, 7)]
    batch = collate_masked(texts)
    width = batch.src.shape[1]
    assert batch.src.shape == (4, 26) and batch.n_tgt_tokens == sum(len(t.chosen) for t in texts) == len(batch.labels)
    rows, columns = batch.positions // width, batch.positions % width
    for row, t in enumerate(texts):
        assert columns[rows == row].tolist() == t.chosen.tolist()
        assert (columns[rows == row] < len(t.ids)).all()  # never the eos at len(t.ids), never the padding after it
        assert batch.masked[row].nonzero().flatten().tolist() == t.masked.tolist()
    assert torch.equal(batch.labels, torch.from_numpy(np.concatenate([t.labels for t in texts])))


def test_masking_is_the_same_for_the_same_seed_epoch_and_text_and_fixed_for_validation(toy, tmp_path: Path):
    prepare(mlm_config(tmp_path / "run", *toy).data, tmp_path / "prepared")
    train_set, valid_set = ParallelDataset(tmp_path / "prepared", "train"), ParallelDataset(tmp_path / "prepared",
                                                                                            "valid")  # fmt: skip
    m = masker(290)
    one, two = MaskedEpochs(train_set, m, 300, seed=1), MaskedEpochs(train_set, m, 300, seed=1)

    def epoch_masks(epochs: MaskedEpochs, epoch: int) -> list[list[int]]:
        return [epochs[i].ids.tolist() for indices in epochs.iter_from(epoch) for i in indices]

    assert epoch_masks(one, 3) == epoch_masks(two, 3)
    assert epoch_masks(one, 3) != epoch_masks(one, 4)  # every epoch masks anew
    fixed = FixedMasking(valid_set, m)
    assert [fixed[i].chosen.tolist() for i in range(len(fixed))] == [fixed[i].chosen.tolist() for i in range(40)]


# ----------------------------------------------------------------------------------------------------------------------
# the model and its loss


def test_only_the_chosen_positions_count_in_the_loss():
    v = 6
    texts = [MaskedText(np.asarray([4, 3, 5]), np.asarray([1]), np.asarray([1, 2]), np.asarray([4, 5])),
             MaskedText(np.asarray([3, 4]), np.asarray([0]), np.asarray([0]), np.asarray([5]))]  # fmt: skip
    batch = collate_masked(texts)  # src (2, 4): [4 3 5 eos], [3 4 eos pad]
    logits = torch.randn(2, 4, v) * 5  # whatever is at the positions not chosen
    logits[0, 1] = torch.tensor([0.0, 0, 0, 0, math.log(4), 0])  # label 4: p = 4 / 9
    logits[0, 2] = torch.zeros(v)  # label 5: p = 1 / 6
    logits[1, 0] = torch.tensor([0.0, 0, 0, 0, 0, math.log(10)])  # label 5: p = 10 / 15
    logits.requires_grad_()
    loss, _nll = loss_sums(logits.reshape(-1, v)[batch.positions], batch.labels, 0.0, 0)
    assert loss.item() == pytest.approx(-math.log(4 / 9) - math.log(1 / 6) - math.log(10 / 15), abs=1e-5)
    loss.backward()
    touched = logits.grad.abs().sum(dim=-1).ne(0)  # (2, 4)
    assert touched.tolist() == [[False, True, True, False], [True, False, False, False]]
    other = logits.detach().clone()
    other[~touched] = torch.randn(int((~touched).sum()), v) * 100  # logits elsewhere change: the loss does not
    again, _ = loss_sums(other.reshape(-1, v)[batch.positions], batch.labels, 0.0, 0)
    assert again.item() == pytest.approx(loss.item(), abs=1e-5)


def test_the_model_scores_the_chosen_positions_and_never_sees_a_masked_piece():
    model = tiny_mlm()
    m = masker()
    batch = collate_masked([m(np.arange(5, 5 + n), np.random.default_rng(n)) for n in (9, 4, 14)])
    with torch.no_grad():
        every = model(batch.src, batch.masked)  # (B, S, V)
        chosen = model(batch.src, batch.masked, batch.positions)  # (N, V)
        torch.testing.assert_close(chosen, every.reshape(-1, every.shape[-1])[batch.positions])
        other = batch.src.clone()
        other[batch.masked] = 17  # whatever id is under the mask, the mask vector replaces it
        assert torch.equal(model(other, batch.masked, batch.positions), chosen)
        plain = batch.src.clone()
        assert torch.equal(model.encode(plain).states, model.encode(plain, torch.zeros_like(batch.masked)).states)
    assert every.shape == (3, 15, 40) and chosen.shape == (batch.n_tgt_tokens, 40)


def test_the_output_projection_is_the_embedding_matrix():
    model = tiny_mlm()
    names = {name for name, _ in model.named_parameters()}
    assert names == {n for n in names if n.startswith((*ENCODER_PREFIXES, "mask_embed", "head."))}
    assert {n for n in names if n.startswith("head.")} == {"head.dense.weight", "head.dense.bias", "head.norm.weight",
                                                            "head.norm.bias", "head.bias"}  # fmt: skip
    states = torch.randn(3, 32)
    expected = model.head.norm(torch.relu(model.head.dense(states))) @ model.src_embed.weight.T + model.head.bias
    torch.testing.assert_close(model.head(states, model.src_embed.weight), expected)


# ----------------------------------------------------------------------------------------------------------------------
# training


def test_a_tiny_masked_lm_learns_a_toy_corpus(toy, tmp_path: Path):
    run = tmp_path / "run"
    outcome = train(mlm_config(run, *toy, max_steps=60, valid_every=30, peak_lr=5e-3))
    losses = [e["loss"] for e in read_metrics(run / "metrics.jsonl", "train")]
    assert sum(losses[-3:]) / 3 < 0.5 * losses[0]  # from about log(290), a uniform guess
    valid = read_metrics(run / "metrics.jsonl", "valid")
    # the 16 letters each as often: a guess without the context scores log(16) and 1 in 16 at best
    assert valid[-1]["loss"] < min(valid[0]["loss"], math.log(16) - 0.3) and valid[-1]["accuracy"] > 30.0
    assert outcome.last_valid is not None and outcome.last_valid.tokens == valid[0]["tokens"]  # the same masking
    saved = Config.load(run / "config.yaml")
    assert saved.train.best_metric == "loss" and saved.model.src_vocab_size == 290


def test_a_resumed_run_masks_and_trains_as_the_uninterrupted_one(toy, tmp_path: Path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    train(mlm_config(whole, *toy, max_steps=6, log_every=1))
    train(mlm_config(halves, *toy, max_steps=3, log_every=1))
    train(resume=halves, overrides=["train.max_steps=6"])
    curve = lambda run: [(e["step"], e["loss"], e["grad_norm"]) for e in read_metrics(run / "metrics.jsonl", "train")]  # noqa: E731
    assert len(curve(whole)) == 6 and curve(whole) == curve(halves)
    a, _, _ = load_masked_lm(whole)
    b, _, _ = load_masked_lm(halves)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


# ----------------------------------------------------------------------------------------------------------------------
# the vocabulary: learned or another run's


def test_the_vocabulary_of_a_translation_run_is_taken_file_for_file(tmp_path: Path):
    translation = make_checkpoint(tmp_path / "translation")  # a standalone checkpoint, as a run's vocab/ is
    write_lines(tmp_path / "corpus" / "train.en", ["a man rides the bike .", "the dog ."] * 20)
    run = tmp_path / "run"
    # the source side of a translation corpus (a prefix and data.src_lang), encoded with the checkpoint's vocabulary
    config = mlm_config(run, tmp_path / "corpus" / "train", data={"vocabulary": str(translation)}, max_steps=2)
    train(config)
    assert ckpt.vocab_sha256(run / "vocab") == ckpt.vocab_sha256(translation / "vocab")
    model, saved, _ = load_masked_lm(run)
    pretrained, _, _ = ckpt.load_model(translation)
    assert model.config.src_vocab_size == pretrained.config.src_vocab_size and saved.data.vocabulary == str(translation)
    # a SentencePiece .model file
    out = tmp_path / "prepared"
    manifest = prepare(config.data.replace(vocabulary=str(translation / "vocab" / "spm.model")), out)
    assert manifest["tokenizer"]["src_vocab_size"] == pretrained.config.src_vocab_size
    assert (out / "spm.model").read_bytes() == (translation / "vocab" / "spm.model").read_bytes()


# ----------------------------------------------------------------------------------------------------------------------
# a classifier from the pretrained encoder


@pytest.fixture(scope="module")
def mlm_run(toy, tmp_path_factory) -> Path:
    """A masked language model trained by ``transduce train`` (the command line)."""
    run = tmp_path_factory.mktemp("mlm") / "run"
    train_file, valid_file = toy
    argv = ["train", "--preset", "test", "--task", "mlm", "--train", str(train_file), "--valid", str(valid_file),
            "-o", str(run), "--vocab-size", "290", "--workers", "1", "train.max_steps=8", "train.max_tokens=300",
            "train.threads=1", "train.precision=fp32", "train.schedule=inverse_sqrt", "train.peak_lr=3e-3",
            "train.warmup_steps=4", "train.valid_every=4"]  # fmt: skip
    assert main(argv) == 0
    return run


@pytest.mark.parametrize("transfer_mode", ["finetune", "cove"])
def test_a_classifier_takes_the_encoder_and_the_vocabulary_of_a_masked_lm_run(mlm_run: Path, transfer_mode: str,
                                                                             caplog):  # fmt: skip
    mlm, _, _ = load_masked_lm(mlm_run)
    config = Config.from_dict({"model": {"transfer": transfer_mode}, "data": {"task": "classify"},
                               "train": {"init_from": str(mlm_run)}})  # fmt: skip
    _, _, vocab, _ = _pretrained(str(mlm_run))
    classifier = ClassifierModel(transfer.model_config(config, vocab, ["neg", "pos"], resume=False))
    with caplog.at_level("INFO"):
        transfer.initialise(classifier, config)
    head = sum(p.numel() for n, p in mlm.named_parameters() if n.startswith(("mask_embed", "head.")))
    assert f"dropped the masked language model's mask vector and prediction head ({head:,} parameters)" in caplog.text
    classifier.eval()
    src = pad_sequences([[5, 9, 17, 2], [30, 2], [11, 12, 13, 14, 15, 2]], 0)
    with torch.no_grad():
        assert torch.equal(classifier.encode(src).states, mlm.encode(src).states)
    assert classifier.config.d_model == mlm.config.d_model and classifier.config.src_vocab_size == 290


def test_a_classifier_trains_from_a_masked_lm_run(mlm_run: Path, tmp_path: Path):
    rows = [("yes" if "e" in t.split() else "no", t) for t in toy_texts(80, 5)]
    train_file = write_lines(tmp_path / "train.tsv", [f"{label}\t{text}" for label, text in rows])
    run = tmp_path / "classifier"
    train(Config.from_dict({
        "model": {"transfer": "cove", "cove_layers": 1},
        "data": {"task": "classify", "train": str(train_file), "workers": 1},
        "train": {"run_dir": str(run), "init_from": str(mlm_run), "max_steps": 2, "max_tokens": 300, "threads": 1,
                  "precision": "fp32", "schedule": "inverse_sqrt", "warmup_steps": 1},
    }))  # fmt: skip
    # no vocabulary learned: the pretrained one's SentencePiece model encodes the texts
    assert (run / "vocab" / "spm.model").read_bytes() == (mlm_run / "vocab" / "spm.model").read_bytes()
    mlm, _, _ = load_masked_lm(mlm_run)
    classifier = load_classifier(run).model
    assert all(torch.equal(v, mlm.state_dict()[k]) for k, v in classifier.state_dict().items()
               if k.startswith(ENCODER_PREFIXES))  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# errors


BAD_INPUT = [
    # (the file's bytes or None for no file, its name, the error: {path} stands for the file)
    (None, "train.txt", "{path}: file not found (data.train)"),
    (None, "corpus/train", "{path}.en: file not found (nor train.en.gz) (data.train)"),
    (b"", "train.txt", "{path}: no texts (the file is empty)"),
    (b"a b c\n\nd e\n", "train.txt", "{path}, line 2: empty text"),
    (b"a b c\nd \xff e\n", "train.txt", "{path}, line 2: not valid UTF-8 (byte 0xff at column 3)"),
]


@pytest.mark.parametrize(("content", "name", "message"), BAD_INPUT)
def test_bad_input_is_one_error_naming_the_file_and_nothing_is_written(tmp_path: Path, capsys, content, name, message):
    path = tmp_path / "data" / name
    path.parent.mkdir(parents=True)
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "out" / "prepared"
    with pytest.raises(DataError) as e:
        prepare(mlm_config(tmp_path / "run", path).data, out)
    assert str(e.value) == message.format(path=path)
    assert main(["prepare", "--task", "mlm", "--train", str(path), "-o", str(out), "--vocab-size", "290"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"transduce prepare: error: {e.value}"]
    assert not (tmp_path / "out").exists()


def test_what_cannot_take_a_masked_language_model_says_so_in_one_line(mlm_run: Path, toy, tmp_path: Path):
    message = (f"{mlm_run} is a masked language model (data.task: mlm), which has no decoder: use "
               "transduce.load_masked_lm, or train.init_from of a classifier; this command takes a translation "
               "model")  # fmt: skip
    with pytest.raises(CheckpointError) as e:
        Translator.load(mlm_run)
    assert str(e.value) == message
    corpus = write_lines(tmp_path / "train.tsv", ["a b\tc d", "e f\tg h"])
    config = Config.from_dict({"data": {"train": str(corpus)}, "train": {"run_dir": str(tmp_path / "run"),
                                                                          "init_from": str(mlm_run)}})  # fmt: skip
    with pytest.raises(FinetuneError, match=r"is a masked language model \(data.task: mlm\), which has no decoder: a "
                                            r"translate run cannot start from it"):  # fmt: skip
        train(config)
    with pytest.raises(ConfigError, match=r"^train.init_from: not available for data.task: mlm"):
        mlm_config(tmp_path / "x", toy[0], init_from=str(mlm_run))
    with pytest.raises(ConfigError, match=r"^data.vocabulary: for data.task: mlm"):
        Config.from_dict({"data": {"vocabulary": str(mlm_run)}})
    with pytest.raises(DataError, match=r"no vocabulary there"):
        prepare(mlm_config(tmp_path / "x", toy[0], data={"vocabulary": str(tmp_path)}).data, tmp_path / "p")
