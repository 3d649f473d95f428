"""Scoring translations: sacreBLEU BLEU and chrF on detokenised text, each with its signature.

    s = score(hypotheses, references)
    log.info("BLEU %.2f (%s)", s.bleu, s.bleu_signature)

:func:`score_tokenized_lowercase` computes the number the Multi30k literature reports (lowercased, Moses-tokenised,
multi-bleu style); it runs higher than cased detokenised sacreBLEU on the same output, so it is labelled
``bleu_lc_tok`` and should always be reported next to the sacreBLEU score, never instead of it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from sacrebleu.metrics import BLEU, CHRF

from transduce.errors import TransduceError


class LengthMismatchError(TransduceError, ValueError):
    """Hypotheses and references have different numbers of lines; nothing is scored."""

    def __init__(self, hypotheses: int, references: int, where: str = "", *, what: str = "hypotheses"):
        self.hypotheses, self.references = hypotheses, references
        where = f"{where}: " if where else ""
        super().__init__(
            f"{where}{hypotheses} {what} but {references} references; the files must have one line each per "
            "sentence, so nothing was scored"
        )


@dataclass(frozen=True)
class Scores:
    """Corpus-level sacreBLEU scores of detokenised text (cased, sacreBLEU's 13a tokenisation for BLEU).

    Attributes:
        bleu: BLEU, 0-100.
        bleu_signature: sacreBLEU signature of the BLEU computation (report it with the score).
        chrf: chrF2, 0-100.
        chrf_signature: sacreBLEU signature of the chrF computation.
        sentences: number of sentences scored.
    """

    bleu: float
    bleu_signature: str
    chrf: float
    chrf_signature: str
    sentences: int

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"BLEU {self.bleu:.2f} ({self.bleu_signature}) chrF {self.chrf:.2f} ({self.chrf_signature})"


@dataclass(frozen=True)
class LowercaseTokenizedBleu:
    """BLEU on lowercased, Moses-tokenised text (multi-bleu style, the Multi30k literature's convention).

    Attributes:
        bleu_lc_tok: BLEU, 0-100; not comparable with detokenised sacreBLEU.
        signature: the sacreBLEU signature (tokenize none, on pre-tokenised text) plus the preprocessing.
        sentences: number of sentences scored.
    """

    bleu_lc_tok: float
    signature: str
    sentences: int

    def to_dict(self) -> dict:
        return asdict(self)


_TOKENIZED = re.compile(r"\s[.,](\s|$)|&apos;|&quot;|&amp;| @-@ ")  # " ." " ," and Moses' escapes


def tokenized_evidence(lines: Sequence[str]) -> str | None:
    """Why ``lines`` look tokenised (a space before sentence-final or inner "." and ",", or Moses' escapes such as
    ``&apos;`` on more than half of the non-empty lines), or None when they look like raw text. sacreBLEU tokenises
    on its own, so a tokenised reference gives a wrong score (sacreBLEU itself only warns about hypotheses).
    A space before "?", "!", ":" and ";" is ordinary French typography and does not count."""
    texts = [line for line in lines if line.strip()]
    hits = sum(1 for line in texts if _TOKENIZED.search(line))
    if texts and hits * 2 > len(texts):
        return f"{hits} of {len(texts)} lines have a space before '.' or ',' or a Moses escape such as &apos;"
    return None


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise LengthMismatchError(len(hypotheses), len(references))
    if not hypotheses:
        raise TransduceError("no sentences to score")


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """sacreBLEU BLEU and chrF of detokenised hypotheses against one reference each.

    Raises:
        LengthMismatchError: the two lists have different lengths (both counts are in the message).
        TransduceError: both are empty.
    """
    _check(hypotheses, references)
    hyps, refs = list(hypotheses), [list(references)]
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hyps, refs)
    c = chrf.corpus_score(hyps, refs)
    return Scores(
        bleu=float(b.score),
        bleu_signature=str(bleu.get_signature()),
        chrf=float(c.score),
        chrf_signature=str(chrf.get_signature()),
        sentences=len(hyps),
    )


def score_tokenized_lowercase(
    hypotheses: Sequence[str], references: Sequence[str], lang: str
) -> LowercaseTokenizedBleu:
    """BLEU as the Multi30k papers report it: both sides lowercased and Moses-tokenised (sacremoses, no escaping),
    then sacreBLEU with ``tokenize="none"`` (``force=True``: the input is tokenised on purpose).

    Args:
        lang: the target language code for the Moses tokenizer (e.g. ``"de"``).
    """
    from sacremoses import MosesTokenizer

    _check(hypotheses, references)
    mt = MosesTokenizer(lang=lang)

    def prep(text: str) -> str:
        return mt.tokenize(text.lower(), escape=False, return_str=True)

    bleu = BLEU(tokenize="none", force=True)
    result = bleu.corpus_score([prep(h) for h in hypotheses], [[prep(r) for r in references]])
    signature = f"{bleu.get_signature()} | lowercase+moses-tok:{lang}"
    return LowercaseTokenizedBleu(float(result.score), signature, len(hypotheses))
