"""BPE-dropout (data.bpe_dropout): every epoch a new, reproducible segmentation of the same text; batches that
cover every pair once per epoch on every rank; exact resume; clear errors where it cannot apply."""

import logging
import signal

import numpy as np
import pytest
import torch

import transduce.training.train as train_module
from test_train import _cfg, _drive, _losses, _weights
from trainkit import toy_config, write_corpus
from transduce.config import Config, ConfigError
from transduce.data import ParallelDataset, prepare
from transduce.data.bpe_dropout import BPEDropout, BPEDropoutEpochs
from transduce.data.sampler import TokenBatchSampler
from transduce.data.train_batches import training_data
from transduce.errors import DataError
from transduce.text.tokenizer import Tokenizer
from transduce.training.train import train


def _epochs(prepared, dropout=0.2, **kw):
    kw = {"seed": 1, **kw}
    return BPEDropoutEpochs(ParallelDataset(prepared, "train"), Tokenizer.load(prepared), dropout, 256, **kw)


def test_without_dropout_it_is_sentencepiece_s_segmentation(data):
    corpus, prepared = data
    tok = Tokenizer.load(prepared)
    bpe = BPEDropout(tok.model_protos()[0])
    texts = [*(corpus / "train.en").read_text().splitlines(), "the red 🐈 dog", "  big  cat ", "", "ddd dogdog"]
    assert bpe.encode(texts, 0.0, np.random.default_rng(0)) == [tok.encode_src(t) for t in texts]
    assert bpe.encode(["the 🐈"], 0.5, np.random.default_rng(0))[0][-5:] == tok.encode_src("🐈")  # bytes, as is


def test_a_word_stays_split_where_every_merge_of_a_step_is_dropped(data):
    """ "▁a" has one possible merge: it stays two pieces exactly when that merge is dropped at the first step (no
    other merge is left to make), so with p = 1/4 in about a quarter of the draws; a longer word ends up whole at
    least as often as every one of its merge steps kept its best merge."""
    _, prepared = data
    tok = Tokenizer.load(prepared)
    bpe = BPEDropout(tok.model_protos()[0])
    rng, n = np.random.default_rng(0), 4000
    assert len(tok.encode_src("a")) == 1
    split = sum(len(seg) == 2 for seg in bpe.encode(["a"] * n, 0.25, rng)) / n
    assert abs(split - 0.25) < 0.025
    whole = sum(len(seg) == 1 for seg in bpe.encode(["dog"] * n, 0.25, rng)) / n
    assert 0.75 ** (len("▁dog") - 1) - 0.025 < whole < 0.75


def test_every_epoch_is_a_new_segmentation_of_the_same_text(data):
    _, prepared = data
    train, tok = ParallelDataset(prepared, "train"), Tokenizer.load(prepared)
    epochs = _epochs(prepared)
    plain = [train[i] for i in range(len(train))]
    seen = []
    for epoch in range(3):
        src, tgt = epochs.segment(epoch)
        assert len(src) == len(tgt) == len(train)
        for (s, t), (ps, pt) in zip(zip(src, tgt, strict=True), plain, strict=True):
            assert tok.decode_src(s) == tok.decode_src(ps) and tok.decode_tgt(t) == tok.decode_tgt(pt)
        seen.append(src)
    plain_pieces = sum(len(s) for s, _ in plain)
    for src in seen:  # finer than the deterministic segmentation, and different from it and from each other
        assert sum(map(len, src)) > 1.1 * plain_pieces
        assert src != [s.tolist() for s, _ in plain]
    assert seen[0] != seen[1] != seen[2]


def test_the_segmentation_is_a_function_of_seed_and_epoch(data):
    _, prepared = data
    a, b = _epochs(prepared), _epochs(prepared)
    assert a.segment(2) == b.segment(2) == a.segment(2)
    assert _epochs(prepared, seed=2).segment(2) != a.segment(2)
    a.segment(5)  # (other epochs in between change nothing)
    assert a.segment(2) == b.segment(2)


def test_an_epoch_s_batches_cover_every_pair_once_in_its_segmentation(data):
    _, prepared = data
    ranks = [_epochs(prepared, rank=r, world_size=2) for r in range(2)]
    for epoch in (0, 1):
        batches = [list(r.iter_from(epoch)) for r in ranks]
        assert len(batches[0]) == len(batches[1]) == len(ranks[0])  # every rank as many batches
        pairs = sorted(i for rank in batches for batch in rank for i in batch)
        assert pairs == list(range(len(ranks[0].dataset)))
        src, tgt = ranks[0].segment(epoch)
        for r in ranks:
            assert [p.tolist() for p, _ in r.dataset.pairs] == src
            assert [p.tolist() for _, p in r.dataset.pairs] == tgt
            assert r.src_lengths.tolist() == list(map(len, src))
            for batch in r.iter_from(epoch):  # within the budget of the epoch's lengths (+ one special each)
                n = len(batch)
                assert n * (max(len(src[i]) for i in batch) + 1) <= 256 or n == 1
    expected = TokenBatchSampler(*(np.array(list(map(len, s))) for s in ranks[1].segment(1)), 256, seed=1, rank=1,
                                 world_size=2)  # fmt: skip
    assert list(ranks[1].iter_from(1, 2)) == list(expected.iter_from(1, 2))  # resumable inside an epoch


def test_training_data_with_bpe_dropout(data):
    _, prepared = data
    tok = Tokenizer.load(prepared)
    dataset, sampler, plain = training_data(prepared, 256, 0.0, seed=1, bpe_dropout=0.2, tokenizer=tok)
    assert isinstance(sampler, BPEDropoutEpochs) and dataset is sampler.dataset
    train = ParallelDataset(prepared, "train")
    assert plain.src_lengths.tolist() == train.src_lengths.tolist()  # before any epoch: the prepared segmentation
    batch = next(sampler.iter_from(3))
    assert [dataset[i][0].tolist() for i in batch] == [sampler.segment(3)[0][i] for i in batch]


def test_a_pair_made_longer_than_max_len_keeps_its_prepared_segmentation(data, caplog):
    _, prepared = data
    train = ParallelDataset(prepared, "train")
    limit = int(max(train.src_lengths.max(), train.tgt_lengths.max()))  # every prepared pair fits
    src, tgt = _epochs(prepared, dropout=0.5).segment(1)
    over = [i for i in range(len(train)) if max(len(src[i]), len(tgt[i])) > limit]
    assert over  # dropout 0.5 makes some pairs longer than the limit
    bounded = _epochs(prepared, dropout=0.5, max_len=limit)
    b_src, b_tgt = bounded.segment(1)
    for i in range(len(train)):
        expected = (train[i][0].tolist(), train[i][1].tolist()) if i in over else (src[i], tgt[i])
        assert (b_src[i], b_tgt[i]) == expected
    with caplog.at_level(logging.INFO, logger="transduce.data.bpe_dropout"):
        batches = list(bounded.iter_from(1))
    assert max(bounded.src_lengths.max(), bounded.tgt_lengths.max()) <= limit
    assert sorted(i for batch in batches for i in batch) == list(range(len(train)))  # none skipped
    assert caplog.messages[-1].endswith(f"; {len(over)} pairs it made longer than data.max_len={limit} keep their "
                                        "prepared segmentation")  # fmt: skip


def test_training_takes_the_length_limit_from_data_max_len(data, tmp_path, monkeypatch):
    seen = {}

    def stop(*args, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "training_data", stop)
    config = Config.resolve(_cfg(data, tmp_path / "run", max_steps=1).to_dict(), ["data.bpe_dropout=0.2"])
    with pytest.raises(KeyboardInterrupt):
        train(config)
    assert (seen["bpe_dropout"], seen["max_len"]) == (0.2, config.data.max_len)


def test_a_unigram_vocabulary_is_refused(data, tmp_path):
    corpus, _ = data
    cfg = toy_config(corpus, tmp_path / "run").data.replace(vocab_type="unigram", vocab_size=290)
    prepare(cfg, tmp_path / "prepared")
    with pytest.raises(DataError, match=r"^data.bpe_dropout: the source vocabulary is a SentencePiece unigram "
                       r"model; BPE-dropout needs a BPE one \(data.vocab_type: bpe\)$"):  # fmt: skip
        _epochs(tmp_path / "prepared")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.bpe_dropout=1.0"], "bpe_dropout: must be in [0, 1), got 1.0"),
        (["data.bpe_dropout=-0.1"], "bpe_dropout: must be in [0, 1), got -0.1"),
        (["data.bpe_dropout=0.1", "data.vocab_type=unigram"], "bpe_dropout: needs vocab_type bpe, got 'unigram'"),
    ],
)
def test_config_errors(data, tmp_path, overrides, message):
    corpus, _ = data
    toy = toy_config(corpus, tmp_path / "run").to_dict()
    with pytest.raises(ConfigError) as err:
        Config.resolve(toy, overrides)
    assert str(err.value) == f"command-line override {overrides[-1]!r}: data.{message}"


def test_a_run_with_bpe_dropout_learns_and_resumes_exactly(data, tmp_path):
    """Interrupted inside an epoch and resumed, a run sees the same segmentations and batches as one that was not."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"

    def cfg(run):
        return Config.resolve(_cfg(data, run, max_steps=30, valid_every=10).to_dict(), ["data.bpe_dropout=0.2"])

    outcome = train(cfg(whole))
    assert outcome.step == 30
    log = (whole / "train.log").read_text()
    assert "epoch 0: BPE-dropout 0.2 segments the training pairs into" in log and "epoch 2: BPE-dropout" in log
    proc = _drive(tmp_path, cfg(stopped), 13, signal.SIGINT)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert train(resume=stopped).step == 30
    a, b = _weights(whole / "checkpoints" / "step_00000030"), _weights(stopped / "checkpoints" / "step_00000030")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(stopped) == _losses(whole)


def test_mixed_in_pairs_keep_their_prepared_segmentation(data, tmp_path):
    corpus, _ = data
    mixed_corpus = write_corpus(tmp_path / "mix", seed=1)
    cfg = toy_config(corpus, tmp_path / "run").data.replace(mix=str(mixed_corpus / "train"), mix_share=0.3)
    prepared = tmp_path / "prepared"
    prepare(cfg, prepared)
    dataset, sampler, _ = training_data(prepared, 256, 0.3, seed=1, bpe_dropout=0.2, tokenizer=Tokenizer.load(prepared))
    train, mix = ParallelDataset(prepared, "train"), ParallelDataset(prepared, "mix")
    batches = list(sampler.iter_from(4))
    src, _ = sampler.main.segment(4)
    own = sorted(i for batch in batches for i in batch if i < len(train))
    assert own == list(range(len(train)))  # every training pair once, in the epoch's segmentation
    assert all(dataset[i][0].tolist() == src[i] for i in own)
    others = [i for batch in batches for i in batch if i >= len(train)]
    assert others and all(dataset[i][0].tolist() == mix[i - len(train)][0].tolist() for i in others)
