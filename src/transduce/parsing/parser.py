"""Parsing with a trained model: words in, a well-formed tree out, through the translation machinery.

A :class:`Parser` wraps a :class:`transduce.translate.Translator` whose model was trained with ``data.task: parse``.
It decodes each sentence into a linearised tree with the paper's search for parsing (:data:`PAPER_DECODE`: beam 21,
GNMT length penalty α = 0.3, at most input + 300 tokens) and turns the tokens back into a tree over the sentence's
words with :func:`~transduce.parsing.linearize.delinearise`, which never fails.

    parser = Parser.load("runs/ptb_parse")
    for result in parser.parse([["The", "cat", "sat", "."]]):
        print(result.tree.to_string(), result.repair.needed)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from transduce.config import DecodeConfig
from transduce.parsing.linearize import Repair, delinearise
from transduce.parsing.trees import Tree
from transduce.translate import Translator

log = logging.getLogger(__name__)

#: the paper's decoding for parsing (§6.3): beam 21, alpha 0.3, maximum output length = input length + 300
PAPER_DECODE = DecodeConfig(beam=21, length_penalty=0.3, length_norm="gnmt", max_len_a=1.0, max_len_b=300)


@dataclass(frozen=True)
class ParseResult:
    """One parse: the tree, what had to be mended, the model's output as decoded."""

    tree: Tree
    repair: Repair
    output: str


class Parser:
    """A translator for linearised trees plus the way back to trees (see the module docstring)."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        pieces = set(translator.tokenizer.tgt_pieces(range(translator.model.config.tgt_vocab_size)))
        if not any(p.lstrip("▁").startswith("(") for p in pieces):
            log.warning("the model's target vocabulary has no opening brackets: was it trained with data.task: parse?")

    @classmethod
    def load(
        cls, path: str | Path, device: str | torch.device = "cpu", *, decode: DecodeConfig | None = None
    ) -> Parser:
        """A parser from a run directory or checkpoint; decoding by ``decode`` (default :data:`PAPER_DECODE`)."""
        return cls(Translator.load(path, device, decode=decode or PAPER_DECODE))

    @property
    def decode(self) -> DecodeConfig:
        return self.translator.decode

    def parse(
        self, sentences: Sequence[Sequence[str]], decode: DecodeConfig | None = None, *, well_formed: bool = True
    ) -> list[ParseResult]:
        """Parse tokenised sentences (lists of words), in input order; an empty sentence gives an empty tree.

        Args:
            sentences: the words of each sentence.
            decode: the search (default: the parser's, :data:`PAPER_DECODE` from :meth:`load`).
            well_formed: take, among the beam's finished hypotheses (best first), the first one that is a
                well-formed tree over exactly the sentence's words (one leaf per word, balanced and matching
                brackets); the best one, repaired, when there is none. ``False``: always the best one.
        """
        cfg = decode or self.decode
        texts = [" ".join(words) for words in sentences]
        if not well_formed or cfg.sampling:
            outputs = self.translator.translate(texts, decode=cfg)
            return [_result(list(words), out) for words, out in zip(sentences, outputs)]
        nbest = self.translator.translate_nbest(texts, nbest=cfg.beam, decode=cfg)
        results = []
        for words, hyps in zip(sentences, nbest):
            candidates = [_result(list(words), h.text) for h in hyps]
            results.append(next((r for r in candidates if not r.repair.needed), candidates[0]))
        return results

    def parse_lines(self, lines: Sequence[str], decode: DecodeConfig | None = None) -> list[ParseResult]:
        """Parse sentences given as text, words separated by whitespace."""
        return self.parse([line.split() for line in lines], decode)


def _result(words: list[str], output: str) -> ParseResult:
    tree, repair = delinearise(output.split(), words)
    return ParseResult(tree, repair, output)
