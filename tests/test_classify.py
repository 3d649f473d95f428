"""Sentence classification (data.task: classify): labelled data and its one-line errors, the classifier's pooling and
padding invariance, starting from a translation model's encoder (transduce's and Marian's), fine-tuning and CoVe,
and the commands that take translation models refusing a classifier."""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import random
from pathlib import Path

import pytest
import torch

from decodekit import make_checkpoint
from transduce.cli import main
from transduce.config import Config, ConfigError, DataConfig, ModelConfig, TrainConfig
from transduce.data import ParallelDataset, prepare
from transduce.errors import CheckpointError, DataError
from transduce.search.common import pad_sequences
from transduce.search.translator import Translator
from transduce.text.vocab import load_vocabulary
from transduce.training import checkpoint as ckpt
from transduce.training.finetune import FinetuneError, _pretrained
from transduce.training.optim import build_optimizer, set_learning_rate
from transduce.training.train import TrainingError, train
from transduce.transfer.classify import load_classifier, transfer
from transduce.transfer.classify.data import collate_classes, encode_texts, fit_pair
from transduce.transfer.classify.model import ENCODER_PREFIXES, ClassifierModel
from transduce.transfer.classify.training import loss_sums

WORDS = ["the", "film", "a", "plot", "is", "dull", "actor", "story", "long", "fine", "music", "ends", "and", "was"]
MARK = "zebra"  # the toy rule: a text is "yes" when it holds this word
MOVIE_REVIEWS = Path(__file__).resolve().parents[2] / "shared" / "data" / "movie_reviews" / "train.tsv.gz"


def toy_examples(n: int, seed: int) -> list[tuple[str, str]]:
    """``(label, text)``: every second text has :data:`MARK` somewhere among 2-8 other words and is ``yes``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 8))]
        if i % 2:
            words.insert(rng.randrange(len(words) + 1), MARK)
        out.append(("yes" if i % 2 else "no", " ".join(words)))
    return out


def write_tsv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{label}\t{text}\n" for label, text in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    """A training and a validation TSV file of the toy rule."""
    root = tmp_path_factory.mktemp("toy")
    return write_tsv(root / "train.tsv", toy_examples(400, 1)), write_tsv(root / "valid.tsv", toy_examples(60, 2))


def classify_config(run_dir: Path, train_file: Path, valid_file: Path | None, *, model: dict | None = None,
                    **train_opts) -> Config:  # fmt: skip
    options = dict(run_dir=str(run_dir), max_steps=150, schedule="inverse_sqrt", peak_lr=3e-3, warmup_steps=10,
                   max_tokens=400, threads=1, log_every=10, valid_every=0, keep_last=1, label_smoothing=0.0,
                   precision="fp32")  # fmt: skip
    options.update(train_opts)
    return Config.from_dict({
        "model": {"preset": "test", "dropout": 0.0, **(model or {})},
        "data": {"task": "classify", "train": str(train_file), "valid": str(valid_file or ""), "vocab_size": 300,
                 "workers": 1},
        "train": options,
    })  # fmt: skip


def tiny_classifier(**fields) -> ClassifierModel:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=40, labels=["a", "b", "c"], **fields)
    return ClassifierModel(cfg).eval()


# ----------------------------------------------------------------------------------------------------------------------
# learning, pooling, padding


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_tiny_classifier_learns_a_word_rule(toy, tmp_path: Path, pooling: str):
    train_file, valid_file = toy
    run = tmp_path / "run"
    outcome = train(classify_config(run, train_file, valid_file, model={"pooling": pooling}))
    assert outcome.last_valid is not None and outcome.last_valid.accuracy == 100.0
    loaded = load_classifier(run)
    assert loaded.labels == ["no", "yes"] and loaded.model.config.pooling == pooling
    held_out = toy_examples(40, 3)
    assert loaded.predict([t for _, t in held_out]) == [label for label, _ in held_out]
    saved = Config.load(run / "config.yaml")
    assert (saved.model.labels, saved.train.best_metric) == (["no", "yes"], "accuracy")


@pytest.mark.parametrize(("pooling", "transfer_mode"), [("cls", "finetune"), ("mean", "finetune"), ("cls", "cove"),
                                                         ("mean", "cove")])  # fmt: skip
def test_a_sentence_scores_the_same_whatever_the_padding_of_its_batch(pooling: str, transfer_mode: str):
    model = tiny_classifier(pooling=pooling, transfer=transfer_mode, cove_layers=2)
    rng = random.Random(0)
    rows = [[rng.randrange(4, 40) for _ in range(n)] + [2] for n in (3, 9, 1, 6)]
    with torch.no_grad():
        batch = model(pad_sequences(rows, 0))
        for i, row in enumerate(rows):
            alone = model(torch.tensor([row]))
            torch.testing.assert_close(batch[i], alone[0], atol=1e-5, rtol=0)
    assert batch.shape == (4, 3)


def test_cls_and_mean_pooling_read_what_they_say():
    """cls: the head reads position 0, which is the <cls> vector's; mean: the average over the real positions."""
    model = tiny_classifier(pooling="mean")
    src = pad_sequences([[5, 6, 7, 2], [8, 2]], 0)
    seen = {}
    model.head.register_forward_hook(lambda _m, args, _out: seen.update(pooled=args[0]))
    with torch.no_grad():
        model(src)
        states = model.encode(src).states
    expected = torch.stack([states[0].mean(dim=0), states[1, :2].mean(dim=0)])
    torch.testing.assert_close(seen["pooled"], expected, atol=1e-6, rtol=0)
    model = tiny_classifier(pooling="cls")
    model.head.register_forward_hook(lambda _m, args, _out: seen.update(pooled=args[0]))
    with torch.no_grad():
        model(src)
        first = seen["pooled"]
        model.cls_embed.add_(1.0)  # only the <cls> input changes: the pooled vector follows it
        model(src)
    assert not torch.equal(first, seen["pooled"])


def test_loss_is_the_cross_entropy_and_label_smoothing_is_torchs():
    logits, labels = torch.randn(5, 3), torch.tensor([0, 2, 1, 1, 0])
    loss, nll = loss_sums(logits, labels, 0.0)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
    loss, nll = loss_sums(logits, labels, 0.1)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, labels, reduction="sum",
                                                                       label_smoothing=0.1))  # fmt: skip
    torch.testing.assert_close(nll, torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))


# ----------------------------------------------------------------------------------------------------------------------
# starting from a translation model


@pytest.fixture(scope="module")
def translation(tmp_path_factory) -> Path:
    """A standalone checkpoint of a random translation model (``test`` preset) with a real vocabulary."""
    return make_checkpoint(tmp_path_factory.mktemp("translation"))


def initialised(init_from: Path, **model) -> ClassifierModel:
    config = Config.from_dict({"model": model, "data": {"task": "classify"}, "train": {"init_from": str(init_from)}})
    _, _, vocab, _ = _pretrained(str(init_from))
    classifier = ClassifierModel(transfer.model_config(config, vocab, ["neg", "pos"], resume=False))
    transfer.initialise(classifier, config)
    return classifier.eval()


def test_the_encoder_taken_from_a_translation_model_computes_its_states(translation: Path, caplog):
    pretrained, _, _ = ckpt.load_model(translation)
    with caplog.at_level("INFO"):
        classifier = initialised(translation)
    total = sum(p.numel() for p in pretrained.parameters())
    encoder = sum(p.numel() for n, p in pretrained.named_parameters() if n.startswith(ENCODER_PREFIXES))
    assert f"kept the source embeddings and the encoder ({encoder:,} parameters)" in caplog.text
    assert f"({total - encoder:,} parameters)" in caplog.text  # the decoder and what only it uses: dropped
    src = pad_sequences([[5, 9, 17, 2], [30, 2], [11, 12, 13, 14, 15, 2]], 0)
    with torch.no_grad():
        assert torch.equal(classifier.encode(src).states, pretrained.encode(src).states)
    assert classifier.config.d_model == pretrained.config.d_model and classifier.config.labels == ["neg", "pos"]


def test_the_encoder_taken_from_a_marian_model_computes_marians_states(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    from test_interop import make_marian_dir  # (skips when the interop extra is not installed)
    from transduce.interop.marian import load_hf, residual_permutation

    marian = make_marian_dir(tmp_path / "marian", share=True)
    classifier = initialised(marian)
    ours, _, _ = load_hf(marian)
    hf = transformers.MarianMTModel.from_pretrained(str(marian)).eval()
    c = classifier.config
    src = pad_sequences([[5, 9, 17, 0], [30, 0], [11, 12, 13, 14, 15, 0]], c.pad_id)
    with torch.no_grad():
        states = classifier.encode(src).states
        theirs = hf.model.encoder(input_ids=src, attention_mask=src.ne(c.pad_id).long()).last_hidden_state
        assert torch.equal(states, ours.encode(src).states)
    real = src.ne(c.pad_id)
    assert (states[..., residual_permutation(c.d_model)] - theirs).abs()[real].max() < 1e-4


def test_a_model_section_that_contradicts_the_pretrained_shape_is_one_error(toy, translation: Path, tmp_path: Path):
    config = classify_config(tmp_path / "run", *toy, model={"preset": "tiny"}, init_from=str(translation))
    with pytest.raises(FinetuneError) as e:
        train(config)
    assert str(e.value) == (
        f"model.encoder_layers: the config says 4, the pretrained model {translation} has 2 (a classifier takes the "
        "encoder's shape from train.init_from: drop model.encoder_layers)"
    )


def encoder_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith(ENCODER_PREFIXES)}


def test_cove_keeps_the_pretrained_part_bit_identical_and_trains_the_rest(toy, translation: Path, tmp_path: Path):
    run = tmp_path / "run"
    pretrained, _, _ = ckpt.load_model(translation)
    config = classify_config(run, *toy, model={"transfer": "cove", "cove_layers": 2, "dropout": 0.1},
                             init_from=str(translation), max_steps=5)  # fmt: skip
    train(config)
    loaded = load_classifier(run)
    after = encoder_state(loaded.model)
    before = encoder_state(pretrained)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    # the pretrained vocabulary encodes the texts: no vocabulary is learned
    assert ckpt.vocab_sha256(run / "vocab") == ckpt.vocab_sha256(run / "pretrained_vocab")
    texts = [t for _, t in toy_examples(20, 7)]
    theirs = load_vocabulary(ckpt.vocab_dir_of(translation))
    assert load_vocabulary(run / "vocab").encode_src_batch(texts) == theirs.encode_src_batch(texts)
    assert json.loads((run / "data" / "manifest.json").read_text())["options"]["vocabulary"]
    # the task model and the head train; the pretrained part gets no gradient and stays in eval mode
    model = loaded.model.train()
    assert not any(m.training for m in model.pretrained_modules()) and model.cove_layers.training
    batch = collate_classes([([5, 6, 7], [0]), ([8, 9], [1])])
    loss, _ = loss_sums(model(batch.src), batch.labels, 0.0)
    loss.backward()
    assert all(p.grad is None for p in model.pretrained_parameters())
    for p in (model.head.out.weight, model.cove_project.weight, model.cls_embed):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_finetuning_with_frozen_layers_and_a_lower_rate_for_the_pretrained_part(toy, translation: Path,
                                                                                tmp_path: Path):  # fmt: skip
    run = tmp_path / "run"
    pretrained, _, _ = ckpt.load_model(translation)
    before = encoder_state(pretrained)
    train(classify_config(run, *toy, init_from=str(translation), freeze_layers=1, max_steps=4, valid_every=2))
    after = encoder_state(load_classifier(run).model)
    frozen = [k for k in before if k.startswith(("src_embed.", "encoder_layers.0."))]
    trained = [k for k in before if k.startswith("encoder_layers.1.")]
    assert frozen and trained
    assert all(torch.equal(after[k], before[k]) for k in frozen)
    assert all(not torch.equal(after[k], before[k]) for k in trained if not k.endswith("bias"))
    # a resumed run keeps its parameter groups (the pretrained part's and the rest) and goes on
    outcome = train(resume=run, overrides=["train.max_steps=6"])
    assert outcome.step == 6


def test_the_pretrained_part_learns_at_its_scale():
    model = tiny_classifier()
    cfg = TrainConfig(init_from="x", pretrained_lr_scale=0.25)
    config = Config(model=model.config, data=DataConfig(task="classify"), train=cfg)
    optimizer = build_optimizer(model, cfg, transfer.lr_scales(model, config))
    set_learning_rate(optimizer, 1e-3)
    rates = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    pretrained = {id(p) for p in model.pretrained_parameters()}
    assert {rates[i] for i in pretrained} == {0.25e-3}
    assert {rate for i, rate in rates.items() if i not in pretrained} == {1e-3}
    assert len(rates) == sum(1 for p in model.parameters() if p.requires_grad)


# ----------------------------------------------------------------------------------------------------------------------
# data: forms, pairs, bad input


def prepare_cfg(train_file: Path, valid_file: Path | None = None, **fields) -> DataConfig:
    fields = {"vocab_size": 300, "workers": 1, **fields}
    return DataConfig(task="classify", train=str(train_file), valid=str(valid_file or ""), **fields)


def test_jsonl_pairs_are_text_sep_text2_and_labels_may_be_integers(tmp_path: Path):
    rows = [{"s1": f"{a} {MARK}" if i % 2 else a, "s2": b, "y": i % 2}
            for i, (_, a), (_, b) in zip(range(300), toy_examples(300, 4), toy_examples(300, 5))]  # fmt: skip
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "prepared"
    manifest = prepare(prepare_cfg(path, text_field="s1", text2_field="s2", label_field="y"), out)
    assert manifest["labels"] == ["0", "1"]
    tok = load_vocabulary(out)
    data = ParallelDataset(out, "train")
    text, label = data[1]
    assert text.tolist() == [*tok.encode_src(rows[1]["s1"]), 2, *tok.encode_src(rows[1]["s2"])]
    assert label.tolist() == [1]


def test_the_real_movie_reviews_prepare(tmp_path: Path):
    if not MOVIE_REVIEWS.is_file():
        pytest.skip(f"{MOVIE_REVIEWS} is absent (the shared data directory is not there)")
    with gzip.open(MOVIE_REVIEWS, "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(400)]
    train_file, valid_file = tmp_path / "train.tsv", tmp_path / "valid.tsv"
    train_file.write_text("".join(lines[:350]), encoding="utf-8")
    valid_file.write_text("".join(lines[350:]), encoding="utf-8")
    valid_labels = {line.split("\t")[0] for line in lines[350:]}
    train_labels = sorted({line.split("\t")[0] for line in lines[:350]})
    if not valid_labels <= set(train_labels):
        pytest.skip("the first 350 lines lack a label of the next 50")
    manifest = prepare(prepare_cfg(train_file, valid_file, vocab_size=600), tmp_path / "prepared")
    assert manifest["labels"] == train_labels == ["negative", "positive"]
    assert (manifest["splits"]["train"]["pairs"], manifest["splits"]["valid"]["pairs"]) == (350, 50)


BAD_INPUT = [
    # (train lines, valid lines, the error: {train} and {valid} stand for the files)
    (["yes\ta b", "no a b"], None, "{train}, line 2: expected label<TAB>text (one tab), found no tab"),
    (["yes\ta b", "no\ta\tb"], None, "{train}, line 2: expected label<TAB>text (one tab), found 2 tabs"),
    (["yes\ta b", "no\tc", "no\t  "], None, "{train}, line 3: empty text"),
    (["yes\ta b", "\tc"], None, "{train}, line 2: empty label"),
    (["yes\ta b", "no\tc"], ["no\tc", "maybe\td"],
     "{valid}, line 2: label 'maybe' does not occur in the training data {train} (its labels: no, yes)"),
    (["yes\ta b", "yes\tc"], None, "{train}: a classifier needs two labels at least, found only 'yes'"),
    (["yes\ta b", "no\tc"], [], "{valid}: no examples (the file is empty)"),
]  # fmt: skip


@pytest.mark.parametrize(("train_lines", "valid_lines", "message"), BAD_INPUT)
def test_bad_input_is_one_error_naming_file_and_line_and_nothing_is_written(
    tmp_path: Path, capsys, train_lines: list[str], valid_lines: list[str] | None, message: str
):
    data = tmp_path / "data"
    data.mkdir()
    train_file = data / "train.tsv"
    train_file.write_text("".join(line + "\n" for line in train_lines), encoding="utf-8")
    valid_file = None
    if valid_lines is not None:
        valid_file = data / "valid.tsv"
        valid_file.write_text("".join(line + "\n" for line in valid_lines), encoding="utf-8")
    out = tmp_path / "out" / "prepared"
    with pytest.raises(DataError) as e:
        prepare(prepare_cfg(train_file, valid_file), out)
    assert str(e.value) == message.format(train=train_file, valid=valid_file)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    argv = ["prepare", "--task", "classify", "--train", str(train_file), "-o", str(out), "--vocab-size", "300"]
    code = main([*argv, *(["--valid", str(valid_file)] if valid_file else [])])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"transduce prepare: error: {e.value}"]
    assert not (tmp_path / "out").exists()


def test_jsonl_without_the_text_field_names_the_option(tmp_path: Path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"label": "yes", "sentence": "a b"}\n', encoding="utf-8")
    with pytest.raises(DataError) as e:
        prepare(prepare_cfg(path), tmp_path / "out")
    assert str(e.value) == f"{path}, line 1: no field 'text' (found: 'label', 'sentence'); --text-field names another"


def test_a_jsonl_label_with_a_line_break_is_one_error(tmp_path: Path, capsys):
    """A label is written a line each (classify, evaluate): one holding a line break would take two."""
    path = tmp_path / "train.jsonl"
    rows = [{"label": "negative", "text": "a b"}, {"label": "very\npositive", "text": "c d"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataError) as e:
        prepare(prepare_cfg(path), tmp_path / "out")
    assert str(e.value) == f"{path}, line 2: the label holds a line break"
    assert main(["prepare", "--task", "classify", "--train", str(path), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"transduce prepare: error: {e.value}"]
    assert not (tmp_path / "out").exists()


def test_an_empty_test_file_is_one_error(tmp_path: Path):
    train_file = write_tsv(tmp_path / "train.tsv", [("yes", "a b"), ("no", "c")])
    empty = tmp_path / "test.tsv"
    empty.write_bytes(b"")
    with pytest.raises(DataError) as e:
        prepare(prepare_cfg(train_file, test=[str(empty)]), tmp_path / "out")
    assert str(e.value) == f"{empty}: no examples (the file is empty)"


def bert_truncation(a: list[int], b: list[int], max_len: int) -> tuple[list[int], list[int]]:
    """BERT's _truncate_seq_pair: a piece at a time from the end of the longer text (the second on a tie) until the
    pair and its separator fit."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_len - 1:
        (a if len(a) > len(b) else b).pop()
    return a, b


def test_a_pair_is_truncated_longest_first_as_berts_are(tmp_path: Path):
    for n, n2, max_len in itertools.product(range(12), range(12), range(1, 26)):
        a, b = list(range(10, 10 + n)), list(range(100, 100 + n2))
        kept, kept2 = bert_truncation(a, b, max_len)
        assert fit_pair(a, b, max_len, 2) == [*kept, 2, *kept2], (n, n2, max_len)
    # prepare truncates so (and counts it); the API encodes with the same function
    rows = [f"yes\t{' '.join(WORDS)} {MARK} {' '.join(WORDS)}\tthe film is fine", "no\tthe plot\tdull",
            f"no\tthe story\t{' '.join(WORDS)}"] * 20  # fmt: skip
    train_file = tmp_path / "train.tsv"
    train_file.write_text("".join(row + "\n" for row in rows), encoding="utf-8")
    out = tmp_path / "prepared"
    manifest = prepare(prepare_cfg(train_file, text2_field="hyp", max_len=10), out)
    tok = load_vocabulary(out)
    texts, texts2 = [row.split("\t")[1] for row in rows], [row.split("\t")[2] for row in rows]
    expected = encode_texts(tok, texts, texts2, 10, 2)
    data = ParallelDataset(out, "train")
    assert [data[i][0].tolist() for i in range(len(rows))] == expected
    first, first2 = tok.encode_src(texts[0]), tok.encode_src(texts2[0])
    assert len(first) > 10 and len(first2) >= 4
    assert expected[0] == [*first[:5], 2, *first2[:4]]  # the hypothesis keeps its share
    truncated = sum(len(tok.encode_src(t)) + 1 + len(tok.encode_src(t2)) > 10 for t, t2 in zip(texts, texts2))
    assert manifest["splits"]["train"]["counts"]["truncated"] == truncated == 40


def test_a_run_on_prepared_data_saves_the_fields_and_max_len_it_was_prepared_with(toy, tmp_path: Path):
    train_file = tmp_path / "pairs.tsv"
    train_file.write_text("".join(f"{label}\t{text}\t{text}\n" for label, text in toy_examples(60, 1)),
                          encoding="utf-8")  # fmt: skip
    prepared = tmp_path / "prepared"
    prepare(prepare_cfg(train_file, text2_field="hyp", max_len=8), prepared)
    base = classify_config(tmp_path / "run", train_file, None, max_steps=2)

    def on_prepared(run: str, **fields) -> Config:
        data = DataConfig(task="classify", prepared=str(prepared), **fields)
        return Config(model=base.model, data=data, train=base.train.replace(run_dir=str(tmp_path / run)))

    train(on_prepared("run"))
    saved = Config.load(tmp_path / "run" / "config.yaml").data
    assert (saved.text_field, saved.text2_field, saved.label_field, saved.max_len) == ("text", "hyp", "label", 8)
    assert load_classifier(tmp_path / "run").pairs
    with pytest.raises(DataError) as e:
        train(on_prepared("other", text2_field="premise"))
    assert str(e.value) == (f"data.text2_field: the config says 'premise', the data in {prepared} was prepared with "
                            "'hyp'; leave data.text2_field out (the prepared data sets it)")  # fmt: skip


def test_a_max_len_the_learned_positions_cannot_hold_is_refused_before_preparing(toy, tmp_path: Path):
    run = tmp_path / "run"
    with pytest.raises(TrainingError) as e:
        train(classify_config(run, *toy, model={"positions": "learned", "max_positions": 16}))
    assert str(e.value) == ("data.max_len: 250 pieces and the end-of-sentence id do not fit the 16 learned "
                            "positions (model.max_positions); set data.max_len to 15 or less (the data is prepared "
                            "with it)")  # fmt: skip
    assert not (run / "data").exists()


def test_config_refusals_are_one_line():
    with pytest.raises(ConfigError, match=r"^model.transfer: cove keeps a pretrained encoder fixed, so it needs "):
        Config.from_dict({"model": {"transfer": "cove"}, "data": {"task": "classify"}})
    with pytest.raises(ConfigError, match=r"^train.best_metric: accuracy is a classifier's"):
        Config.from_dict({"train": {"best_metric": "accuracy"}})
    with pytest.raises(ConfigError, match=r"^data.bpe_dropout: not available for data.task: classify"):
        Config.from_dict({"data": {"task": "classify", "bpe_dropout": 0.1}})
    with pytest.raises(ConfigError) as e:
        Config.from_dict({"model": {"pooling": "mean"}})  # a translation model has no pooling
    assert str(e.value) == "model.pooling: has no effect in this run (it is for data.task: classify); leave it out"
    with pytest.raises(ConfigError, match=r"^train.pretrained_lr_scale: has no effect in this run \(it is for a "):
        Config.from_dict({"data": {"task": "classify"}, "train": {"pretrained_lr_scale": 0.5}})
    assert Config.from_dict({"data": {"task": "classify"}}).train.best_metric == "accuracy"
    with pytest.raises(ConfigError) as e:  # nothing would read the text into the <cls> position: constant scores
        ModelConfig(transfer="cove", cove_layers=0)
    assert str(e.value) == ("pooling: cls pooling needs at least one task layer (with cove_layers: 0 nothing reads the "
                            "text into the <cls> position: every text gets the same scores); set pooling: mean or max, "
                            "or cove_layers: 1 or more")  # fmt: skip
    assert ModelConfig(transfer="cove", cove_layers=0, pooling="mean").cove_layers == 0


# ----------------------------------------------------------------------------------------------------------------------
# commands that take translation models


@pytest.fixture(scope="module")
def classifier_run(toy, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("classifier") / "run"
    train(classify_config(run, *toy, max_steps=2))
    return run


def test_translation_commands_refuse_a_classifier_in_one_line(classifier_run: Path, tmp_path: Path, capsys):
    message = (f"{classifier_run} is a classifier (data.task: classify): use transduce classify (in Python: "
               "transduce.Classifier.load); this command takes a translation model")  # fmt: skip
    with pytest.raises(CheckpointError) as e:
        Translator.load(classifier_run)
    assert str(e.value) == message
    source = tmp_path / "in.txt"
    source.write_text("the film\n", encoding="utf-8")
    commands = [["translate", "--model", str(classifier_run), "-i", str(source)]]
    if importlib.util.find_spec("transformers") is not None:  # (export needs the interop extra)
        commands.append(["export", "--model", str(classifier_run), "-o", str(tmp_path / "hf"), "--format", "hf"])
    for argv in commands:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"transduce {argv[0]}: error: {message}"]
