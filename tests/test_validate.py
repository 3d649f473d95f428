"""Validation during training: references read with prepare's UTF-8 rule, decode batches within the beam's budget."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import transduce.search as search
from trainkit import toy_config, write_corpus
from transduce.data import ParallelDataset, prepare
from transduce.search import Hypothesis
from transduce.text.tokenizer import Tokenizer
from transduce.training.distributed import Dist
from transduce.training.validate import read_references, validation_translations


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A toy corpus whose validation target line 3 holds a byte that is not UTF-8, prepared with skip_invalid_utf8."""
    root = tmp_path_factory.mktemp("valid")
    corpus = write_corpus(root / "corpus", n_train=120, n_valid=12)
    lines = (corpus / "valid.de").read_bytes().split(b"\n")
    lines[2] = b"bad \xff " + lines[2]
    (corpus / "valid.de").write_bytes(b"\n".join(lines))
    config = toy_config(corpus, root / "unused")
    config = dataclasses.replace(config, data=config.data.replace(skip_invalid_utf8=True))
    prepare(config.data, root / "prepared")
    return config, root / "prepared", lines


def test_references_keep_lines_that_are_not_utf8_with_a_replacement_character(prepared):
    _, directory, raw = prepared
    dataset = ParallelDataset(directory, "valid")
    tokenizer = Tokenizer.load(directory)
    references, kind = read_references(dataset, tokenizer)
    assert kind == "raw" and len(references) == len(dataset) == 12
    expected = [tokenizer.normalise(line.decode("utf-8", "replace")) for line in raw[:12]]
    assert [references[k] for k in range(12)] == [expected[int(i)] for i in dataset.line_index]
    assert sum("\ufffd" in r for r in references) == 1
    assert "bad \ufffd " in references[list(dataset.line_index).index(2)]


@pytest.mark.parametrize("beam", [1, 4])
def test_validation_decode_batches_respect_sentences_x_beam_x_longest(prepared, monkeypatch, beam):
    config, directory, _ = prepared
    config = dataclasses.replace(
        config, train=config.train.replace(valid_beam=beam), decode=config.decode.replace(max_tokens=48)
    )
    dataset = ParallelDataset(directory, "valid")
    shapes = []

    def fake_generate(model, src, cfg):
        assert cfg.beam == beam
        shapes.append(tuple(src.shape))
        return [[Hypothesis([5], 0.0, 0.0)] for _ in range(src.shape[0])]

    monkeypatch.setattr(search, "generate", fake_generate)
    hyps = validation_translations(torch.nn.Identity(), dataset, Tokenizer.load(directory), config, "cpu", Dist())
    assert len(hyps) == len(dataset) and sum(b for b, _ in shapes) == len(dataset)
    assert any(b > 1 for b, _ in shapes)  # the test means something: sentences do share batches
    for b, s in shapes:
        assert b == 1 or b * beam * s <= 48, shapes
