"""A training run reports how much of its batches is padding (in the console log and ``train.log``)."""

from __future__ import annotations

import re

from trainkit import toy_config, write_corpus
from transduce.data import ParallelDataset, TokenBatchSampler, padding_stats, prepare
from transduce.training.train import train


def test_training_logs_the_batches_per_epoch_and_the_padding_share(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_train=120, n_valid=8)
    prepared = tmp_path / "prepared"
    config = toy_config(corpus, tmp_path / "run", prepared, max_steps=1, valid_bleu=False)
    prepare(config.data, prepared)
    assert train(config).exit_code == 0

    data = ParallelDataset(prepared, "train")
    sampler = TokenBatchSampler(data.src_lengths, data.tgt_lengths, config.train.max_tokens, seed=config.train.seed)
    stats = padding_stats(sampler)
    log = (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    match = re.search(r"batches: (\d+) per epoch \(all ranks\), padding ([\d.]+)% of tokens", log)
    assert match, log
    assert int(match[1]) == stats["batches"] > 1
    assert float(match[2]) == round(100 * stats["padding_share"], 1)
