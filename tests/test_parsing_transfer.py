"""A parser started from a translation run (data.task: parse with train.init_from): the encoder computes the
translation model's states, the words are encoded with the translation vocabulary, a contradicting shape is one
error naming the field, and after a few updates `transduce parse` writes well-formed trees over exactly the input
words, words the treebank never had and characters the translation vocabulary never saw included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from test_parsing_model import write_toy_treebank
from trainkit import toy_config, write_corpus
from transduce.cli import main
from transduce.config import Config, ConfigError, DataConfig, TrainConfig
from transduce.data import ParallelDataset
from transduce.errors import DataError
from transduce.model import Transformer
from transduce.model.encoder import ENCODER_PREFIXES
from transduce.parsing import transfer
from transduce.parsing.prepare import train_vocabulary
from transduce.parsing.trees import parse_trees
from transduce.search.common import pad_sequences
from transduce.text.tokenizer import Tokenizer
from transduce.text.vocab import load_vocabulary
from transduce.training import checkpoint as ckpt
from transduce.training.finetune import FinetuneError, _pretrained, check_prepared
from transduce.training.optim import build_optimizer, set_learning_rate
from transduce.training.train import train
from transduce.transfer.encoder import lr_scales, pretrained_parameters

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def translation(tmp_path_factory) -> Path:
    """A translation run of a few updates: pre-norm with learned positions (the encoder's norm and positions are
    taken over too), 2+2 layers, d_model 32, a joint vocabulary."""
    root = tmp_path_factory.mktemp("translation")
    config = toy_config(write_corpus(root / "corpus"), root / "run", max_steps=3, valid_bleu=False, valid_every=0)
    config = config.replace(model=config.model.replace(norm="pre", positions="learned", max_positions=256))
    assert train(config).exit_code == 0
    return root / "run"


def parse_config(treebank: tuple[Path, Path], run_dir: Path, init_from: Path, *more: str) -> Config:
    train_mrg, test_mrg = treebank
    overrides = [
        "data.task=parse", "data.src_lang=words", "data.tgt_lang=tree", "data.joint_vocab=false",
        "data.tree_leaves=word", f"data.train={train_mrg}", f"data.valid={test_mrg}", f"train.run_dir={run_dir}",
        f"train.init_from={init_from}", "model.decoder_layers=1", "train.max_steps=4", "train.max_tokens=1024",
        "train.valid_every=0", "train.valid_bleu=false", "train.precision=fp32", "decode.max_len_b=40", *more,
    ]  # fmt: skip
    return Config.load(ROOT / "configs" / "toy.yaml", overrides=overrides)


@pytest.fixture(scope="module")
def treebank(tmp_path_factory) -> tuple[Path, Path]:
    return write_toy_treebank(tmp_path_factory.mktemp("treebank"))


@pytest.fixture(scope="module")
def parser_run(translation: Path, treebank, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("parser") / "run"
    assert train(parse_config(treebank, run, translation)).exit_code == 0
    return run


def test_the_parsers_encoder_computes_the_translation_encoders_states(translation: Path, treebank, tmp_path: Path,
                                                                       caplog):  # fmt: skip
    pretrained, _, _ = ckpt.load_model(ckpt.resolve(translation, prefer=ckpt.LAST))
    config = parse_config(treebank, tmp_path / "run", translation)
    vocab = load_vocabulary(ckpt.vocab_dir_of(ckpt.resolve(translation)))
    model_cfg = transfer.model_config(config, vocab, resume=False)
    c, p = model_cfg, pretrained.config
    assert (c.d_model, c.heads, c.d_ff, c.encoder_layers, c.norm, c.positions) == (
        p.d_model,
        p.heads,
        p.d_ff,
        p.encoder_layers,
        "pre",
        "learned",
    )
    assert (c.decoder_layers, c.share_vocab) == (1, False)  # the parser's own decoder, its own tree tokens
    torch.manual_seed(0)
    parser = Transformer(model_cfg).eval()
    with caplog.at_level("INFO"):
        transfer.initialise(parser, config)
    kept = sum(q.numel() for name, q in pretrained.named_parameters() if name.startswith(ENCODER_PREFIXES))
    dropped = sum(q.numel() for q in pretrained.parameters()) - kept
    assert f"kept the source embeddings and the encoder ({kept:,} parameters)" in caplog.text
    assert f"output projection ({dropped:,} parameters)" in caplog.text
    src = pad_sequences([[5, 9, 17, 2], [30, 2], [11, 12, 13, 14, 15, 2]], 0)
    with torch.no_grad():
        assert torch.equal(parser.encode(src).states, pretrained.encode(src).states)
    ours, theirs = parser.decoder_layers[0].state_dict(), pretrained.decoder_layers[0].state_dict()
    assert not any(torch.equal(ours[k], theirs[k]) for k in ours if "norm" not in k and not k.endswith("bias"))


def test_a_shape_field_that_contradicts_the_translation_model_is_one_error(translation: Path, treebank,
                                                                           tmp_path: Path):  # fmt: skip
    config = parse_config(treebank, tmp_path / "run", translation, "model.d_ff=128")
    vocab = load_vocabulary(ckpt.vocab_dir_of(ckpt.resolve(translation)))
    with pytest.raises(FinetuneError) as e:
        transfer.model_config(config, vocab, resume=False)
    assert str(e.value) == (f"model.d_ff: the config says 128, the pretrained model {translation} has 64 (a parser "
                            "takes the encoder's shape from train.init_from: drop model.d_ff)")  # fmt: skip
    _pretrained.cache_clear()


def test_the_words_are_encoded_with_the_translation_vocabulary(translation: Path, parser_run: Path, tmp_path: Path):
    theirs = load_vocabulary(translation / "vocab")
    ours = load_vocabulary(parser_run / "vocab")
    assert (parser_run / "vocab" / "spm.src.model").read_bytes() == (translation / "vocab" / "spm.model").read_bytes()
    prepared = parser_run / "data"
    words = (prepared / "text" / "train.words").read_text(encoding="utf-8").splitlines()
    dataset = ParallelDataset(prepared, "train")
    ids = [list(map(int, dataset[i][0])) for i in range(len(words))]
    assert ids == theirs.encode_src_batch(words) == ours.encode_src_batch(words)
    # the target side is the trees' tokens: 4 special ids + 8 brackets + the 15 words of the lexicon and "."
    tokenizer = json.loads((prepared / "tokenizer.json").read_text(encoding="utf-8"))
    assert (tokenizer["joint"], tokenizer["tgt_vocab_type"], tokenizer["tgt_vocab_size"]) == (False, "word", 28)
    assert tokenizer["src_vocab_size"] == theirs.src_vocab_size
    # a run given this prepared directory alone (data.prepared) accepts it for this translation model
    check_prepared(prepared, parser_run / "pretrained_vocab")
    other = Tokenizer.train(tmp_path / "other", words, vocab_size=290).save(tmp_path / "other")
    with pytest.raises(FinetuneError, match="prepared with another vocabulary than the pretrained model's"):
        check_prepared(prepared, other)


def test_a_lowercasing_vocabulary_is_refused(tmp_path: Path):
    """A vocabulary lowercases both of its sides: a parser's tree labels too."""
    words = [" ".join(["The", "cat", "sat", "on", "Kim", "."] * (i % 5 + 1)) for i in range(50)]
    source = Tokenizer.train(tmp_path / "lower", words, vocab_size=280, lowercase=True).save(tmp_path / "lower")
    pairs = [(w, "(S " + w + " )S") for w in words]
    with pytest.raises(DataError, match=r"lower: the vocabulary lowercases its text, and a parser's would lowercase "):
        train_vocabulary(tmp_path / "out", pairs, DataConfig(task="parse", joint_vocab=False), source=source)


def test_parse_after_a_few_updates_gives_trees_over_exactly_the_input_words(parser_run: Path, tmp_path: Path):
    sentences = ["the cat sees a dog .", "Kim sleeps .", "zebras graze near the café .", "naïve Lee likes Ωmega ."]
    source, out = tmp_path / "in.txt", tmp_path / "out.trees"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    assert main(["parse", "--model", str(parser_run), "-i", str(source), "-o", str(out), "--beam", "2"]) == 0
    trees = parse_trees(out.read_text(encoding="utf-8"))
    assert [tree.words() for tree in trees] == [s.split() for s in sentences]
    # a resumed run goes on from its own checkpoint (not from init_from again)
    assert train(resume=parser_run, overrides=["train.max_steps=5"]).step == 5


def test_the_pretrained_encoder_learns_at_its_scale_and_what_a_parser_refuses(translation: Path):
    torch.manual_seed(0)
    config = Config(model=Config().model.replace(share_vocab=False, encoder_layers=1, decoder_layers=1, d_model=16,
                                                 d_ff=32, heads=2, src_vocab_size=30, tgt_vocab_size=20),
                    data=DataConfig(task="parse", joint_vocab=False),
                    train=TrainConfig(init_from="x", pretrained_lr_scale=0.25))  # fmt: skip
    model = Transformer(config.model)
    optimizer = build_optimizer(model, config.train, lr_scales(model, config))
    set_learning_rate(optimizer, 1e-3)
    rates = {id(q): g["lr"] for g in optimizer.param_groups for q in g["params"]}
    encoder = {id(q) for q in pretrained_parameters(model)}
    assert encoder and {rates[i] for i in encoder} == {0.25e-3}
    assert {rate for i, rate in rates.items() if i not in encoder} == {1e-3}
    parse = {"data": {"task": "parse", "joint_vocab": False}}
    with pytest.raises(ConfigError, match=r"^train\.pretrained_lr_scale: has no effect in this run"):
        Config.from_dict({**parse, "train": {"pretrained_lr_scale": 0.5}})  # no init_from
    for name in ("init_optimizer", "extend_vocab"):
        with pytest.raises(ConfigError, match=rf"^train\.{name}: not available for a parser started from "):
            Config.from_dict({**parse, "train": {"init_from": str(translation), name: 1 if name == "extend_vocab"
                                                 else True}})  # fmt: skip


def test_the_transfer_config_is_ptb_parse_with_a_pretrained_encoder():
    ours = Config.load(ROOT / "configs" / "ptb_parse_transfer.yaml").to_dict()
    base = Config.load(ROOT / "configs" / "ptb_parse.yaml").to_dict()
    differ = lambda section: {k for k in base[section] if ours[section][k] != base[section][k]}  # noqa: E731
    assert differ("model") == {"encoder_layers", "d_model", "d_ff", "heads", "norm"}  # (left to the pretrained model)
    assert differ("data") == {"vocab_size"} and differ("decode") == set()
    assert differ("train") == {"run_dir", "init_from", "pretrained_lr_scale"}  # the same budget: max_steps,
    assert ours["train"]["pretrained_lr_scale"] == 1.0  # max_minutes, decay_by time; the encoder at the full rate
    assert ours["model"]["decoder_layers"] == 3 and ours["train"]["init_from"] == "runs/multi30k_en_de"
