"""Parsing with a trained model: words in, a well-formed tree out, through the translation machinery.

A :class:`Parser` wraps a :class:`transduce.search.translator.Translator` whose model was trained with ``data.task:
parse``. It decodes each sentence into a linearised tree with the paper's search for parsing (:data:`PAPER_DECODE`: beam
21, GNMT length penalty α = 0.3, at most input + 300 tokens), constrained to well-formed trees over exactly the
sentence's words (:class:`~transduce.parsing.constrained.TreeConstraint`), and turns the tokens back into a tree
with :func:`~transduce.parsing.linearize.delinearise`, which never fails (and, constrained, has nothing to mend).

    parser = Parser.load("runs/ptb_parse")
    for result in parser.parse([["The", "cat", "sat", "."]]):
        print(result.tree.to_string(), result.repair.needed)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from transduce.config import ConfigError, DecodeConfig
from transduce.parsing.constrained import InOrderConstraint, TreeConstraint, TreeVocabulary
from transduce.parsing.linearize import Repair, delinearise
from transduce.parsing.trees import Tree
from transduce.search.translator import Translator

#: the paper's decoding for parsing (§6.3): beam 21, alpha 0.3, maximum output length = input length + 300
PAPER_DECODE = DecodeConfig(beam=21, length_penalty=0.3, length_norm="gnmt", max_len_a=1.0, max_len_b=300)


@dataclass(frozen=True)
class ParseResult:
    """One parse: the tree, what had to be mended, the model's output as decoded."""

    tree: Tree
    repair: Repair
    output: str


def _target_pieces(translator: Translator) -> list[str]:
    return list(translator.tokenizer.tgt_pieces(range(translator.model.config.tgt_vocab_size)))


def is_parsing_model(translator: Translator) -> bool:
    """Whether the translator's model writes linearised trees: it was trained with ``data.task: parse`` (the task
    recorded in its run; a translation model's target pieces may start with "(" too)."""
    return getattr(translator, "task", "translate") == "parse"


class Parser:
    """A translator for linearised trees plus the way back to trees (see the module docstring)."""

    def __init__(self, translator: Translator) -> None:
        if not is_parsing_model(translator):
            raise ConfigError(f"the model was trained with data.task: {getattr(translator, 'task', 'translate')}: "
                              "parsing needs a model trained with data.task: parse")  # fmt: skip
        self.translator = translator
        self.pieces = _target_pieces(translator)
        self._vocab: TreeVocabulary | None = None
        self.order = getattr(translator.tokenizer, "tree_order", "top-down")  # data.tree_order of its training

    @property
    def vocab(self) -> TreeVocabulary:
        """The target ids by role, for the constrained search (built on first use)."""
        if self._vocab is None:
            self._vocab = TreeVocabulary(self.pieces, self.translator.model.config.eos_id, self.translator.device)
        return self._vocab

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
        self,
        sentences: Sequence[Sequence[str]],
        decode: DecodeConfig | None = None,
        *,
        well_formed: bool = True,
        constrained: bool = True,
    ) -> list[ParseResult]:
        """Parse tokenised sentences (lists of words), in input order; an empty sentence gives an empty tree.

        Args:
            sentences: the words of each sentence.
            decode: the search (default: the parser's, :data:`PAPER_DECODE` from :meth:`load`).
            well_formed: take, among the beam's finished hypotheses (best first), the first one that is a
                well-formed tree over exactly the sentence's words (one leaf per word, balanced and matching
                brackets); the best one, repaired, when there is none. ``False``: always the best one.
            constrained: search only among well-formed trees over exactly the sentence's words (every output is
                one); ``False``: the model's outputs as they come, mended by ``delinearise``.
        """
        cfg = decode or self.decode
        texts = [" ".join(words) for words in sentences]
        rule = None
        if constrained:
            vocab, device = self.vocab, self.translator.device
            constraint = InOrderConstraint if self.order == "in-order" else TreeConstraint

            def rule(batch: list[int]) -> TreeConstraint:
                leaves = [vocab.leaves_for(sentences[i]) for i in batch]
                return constraint.for_rows(vocab, [len(sentences[i]) for i in batch], device, leaves)

        if not well_formed or cfg.sampling:
            outputs = self.translator.translate(texts, decode=cfg, constraint=rule)
            return [_result(list(words), out, self.order) for words, out in zip(sentences, outputs)]
        nbest = self.translator.translate_nbest(texts, nbest=cfg.beam, decode=cfg, constraint=rule)
        results = []
        for words, hyps in zip(sentences, nbest):
            candidates = [_result(list(words), h.text, self.order) for h in hyps]
            results.append(next((r for r in candidates if not r.repair.needed), candidates[0]))
        return results

    def parse_lines(self, lines: Sequence[str], decode: DecodeConfig | None = None) -> list[ParseResult]:
        """Parse sentences given as text, words separated by whitespace."""
        return self.parse([line.split() for line in lines], decode)


def _result(words: list[str], output: str, order: str = "top-down") -> ParseResult:
    tree, repair = delinearise(output.split(), words, order)
    return ParseResult(tree, repair, output)
