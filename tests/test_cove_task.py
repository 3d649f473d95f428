"""CoVe's BiLSTM task model (model.cove_task: bilstm): a sentence's scores whatever the padding of its batch, the
config's refusals, the fixed pretrained part beside an LSTM that learns, and a toy rule learnt through the training
loop from a translation model's encoder."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from decodekit import make_checkpoint
from test_classify import classify_config, toy_examples, write_tsv
from transduce.config import Config, ConfigError, ModelConfig
from transduce.search.common import pad_sequences
from transduce.training import checkpoint as ckpt
from transduce.training.finetune import _pretrained
from transduce.training.train import train
from transduce.transfer.classify import load_classifier, transfer
from transduce.transfer.classify.data import collate_classes
from transduce.transfer.classify.model import ENCODER_PREFIXES, ClassifierModel
from transduce.transfer.classify.training import loss_sums


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("toy")
    return write_tsv(root / "train.tsv", toy_examples(400, 1)), write_tsv(root / "valid.tsv", toy_examples(60, 2))


@pytest.fixture(scope="module")
def translation(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("translation"))


def bilstm(pooling: str = "mean", layers: int = 2, dropout: float = 0.0) -> ClassifierModel:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=40, labels=["a", "b", "c"], transfer="cove",
                             cove_task="bilstm", cove_layers=layers, pooling=pooling, dropout=dropout)  # fmt: skip
    return ClassifierModel(cfg)


def encoder_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith(ENCODER_PREFIXES)}


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_a_sentence_scores_the_same_whatever_the_padding_of_its_batch(pooling: str):
    model = bilstm(pooling).eval()
    assert model.cove_lstm is not None and model.cove_lstm.hidden_size == model.config.d_model // 2
    rng = random.Random(0)
    rows = [[rng.randrange(4, 40) for _ in range(n)] + [2] for n in (3, 9, 1, 6)]
    with torch.no_grad():
        batch = model(pad_sequences(rows, 0))
        for i, row in enumerate(rows):
            torch.testing.assert_close(batch[i], model(torch.tensor([row]))[0], atol=1e-5, rtol=0)
    # the pooled states are the BiLSTM's over the real positions only (max: their element-wise maximum)
    seen = {}
    model.head.register_forward_hook(lambda _m, args, _out: seen.update(pooled=args[0]))
    with torch.no_grad():
        model(torch.tensor([rows[0]]))
        x = model.cove_project(torch.cat([model.src_embed(torch.tensor([rows[0]])) * model.embed_scale,
                                          model.encode(torch.tensor([rows[0]])).states], dim=-1))  # fmt: skip
        states, _ = model.cove_lstm(x)
    expected = states.amax(dim=1) if pooling == "max" else states.mean(dim=1)
    torch.testing.assert_close(seen["pooled"], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("transfer_mode", ["finetune", "cove"])
def test_max_pooling_over_the_encoder_or_a_transformer_task_model_ignores_padding(transfer_mode: str):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("test", src_vocab_size=40, tgt_vocab_size=40, labels=["a", "b"], transfer=transfer_mode,
                             pooling="max")  # fmt: skip
    model = ClassifierModel(cfg).eval()
    rows = [[5, 6, 7, 8, 2], [9, 2], [10, 11, 2]]
    with torch.no_grad():
        batch = model(pad_sequences(rows, 0))
        for i, row in enumerate(rows):
            torch.testing.assert_close(batch[i], model(torch.tensor([row]))[0], atol=1e-5, rtol=0)


def cove_config(**model) -> Config:
    return Config.from_dict({"model": {"transfer": "cove", **model}, "data": {"task": "classify"},
                             "train": {"init_from": "runs/x"}})  # fmt: skip


def test_the_config_refuses_what_a_bilstm_task_model_cannot_do():
    with pytest.raises(ConfigError) as e:
        cove_config(cove_task="bilstm")  # pooling: cls, the default
    assert str(e.value) == ("model.pooling: a bilstm task model pools with mean or max, not cls (at a prepended <cls> "
                            "position its forward direction has read nothing but <cls>)")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^model\.cove_layers: a bilstm task model needs at least one layer$"):
        cove_config(cove_task="bilstm", pooling="max", cove_layers=0)
    with pytest.raises(ConfigError, match=r"^model\.cove_task: has no effect in this run \(it is for model\.transfer"):
        Config.from_dict({"model": {"cove_task": "bilstm", "pooling": "mean"}, "data": {"task": "classify"}})
    with pytest.raises(ConfigError, match=r"^model\.cove_task: 'lstm' is not one of 'transformer', 'bilstm'"):
        cove_config(cove_task="lstm")
    assert cove_config(cove_task="bilstm", pooling="mean").model.cove_task == "bilstm"
    assert cove_config().model.cove_task == "transformer"  # the default: the transformer task model


def test_the_pretrained_part_gets_no_gradient_and_the_lstm_does():
    model = bilstm("max", dropout=0.1).train()
    assert model.cove_lstm.training and model.cove_lstm.dropout == 0.1  # dropout between the two layers
    assert not any(m.training for m in model.pretrained_modules())
    batch = collate_classes([([5, 6, 7], [0]), ([8, 9], [1]), ([10], [2])])
    loss, _ = loss_sums(model(batch.src), batch.labels, 0.0)
    loss.backward()
    assert all(p.grad is None for p in model.pretrained_parameters())
    for name, p in [*model.cove_lstm.named_parameters(), ("project", model.cove_project.weight)]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_a_bilstm_over_a_translation_encoder_learns_a_word_rule(toy, translation: Path, tmp_path: Path):
    """Through the training loop: the rule learnt, the pretrained part bit-identical, the run loaded back."""
    run = tmp_path / "run"
    pretrained, _, _ = ckpt.load_model(translation)
    model = {"transfer": "cove", "cove_task": "bilstm", "cove_layers": 1, "pooling": "max"}
    outcome = train(classify_config(run, *toy, model=model, init_from=str(translation), max_steps=80))
    assert outcome.last_valid is not None and outcome.last_valid.accuracy == 100.0
    loaded = load_classifier(run)
    assert loaded.model.config.cove_task == "bilstm" and loaded.model.cove_lstm is not None
    before, after = encoder_state(pretrained), encoder_state(loaded.model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    held_out = toy_examples(40, 3)
    assert loaded.predict([t for _, t in held_out]) == [label for label, _ in held_out]
    _pretrained.cache_clear()


def test_a_translation_models_shape_and_a_bilstm_task_model(translation: Path):
    """The classifier's shape is the pretrained model's; the BiLSTM's fields are the config's."""
    config = cove_config(cove_task="bilstm", pooling="mean", cove_layers=2)
    config.train.init_from = str(translation)
    _, _, vocab, _ = _pretrained(str(translation))
    model_cfg = transfer.model_config(config, vocab, ["neg", "pos"], resume=False)
    assert (model_cfg.cove_task, model_cfg.cove_layers, model_cfg.pooling) == ("bilstm", 2, "mean")
    classifier = ClassifierModel(model_cfg)
    transfer.initialise(classifier, config)
    assert classifier.cove_lstm.num_layers == 2 and classifier.cove_lstm.input_size == model_cfg.d_model
