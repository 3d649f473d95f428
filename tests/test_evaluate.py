"""Scoring: sacreBLEU BLEU/chrF with signatures, the lowercased tokenised variant, and length mismatches."""

from __future__ import annotations

import pytest
import sacrebleu

from transduce.errors import TransduceError
from transduce.search.evaluate import LengthMismatchError, score, score_tokenized_lowercase

HYPS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest."]
REFS = ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]


def test_score_matches_sacrebleu_with_signatures():
    s = score(HYPS, REFS)
    assert s.bleu == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert s.chrf == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert "tok:13a" in s.bleu_signature and "case:mixed" in s.bleu_signature
    assert s.chrf_signature.startswith("nrefs:1") and s.sentences == 3
    assert set(s.to_dict()) == {"bleu", "bleu_signature", "chrf", "chrf_signature", "sentences"}
    assert score(REFS, REFS).bleu == pytest.approx(100.0)


def test_length_mismatch_is_an_error_with_both_counts():
    with pytest.raises(LengthMismatchError, match="2 hypotheses but 3 references") as e:
        score(HYPS[:2], REFS)
    assert isinstance(e.value, TransduceError)
    with pytest.raises(LengthMismatchError):
        score_tokenized_lowercase(HYPS, REFS[:1], "de")
    with pytest.raises(TransduceError, match="no sentences"):
        score([], [])


def test_lowercase_tokenized_bleu_is_labelled_and_case_insensitive():
    r = score_tokenized_lowercase(["EIN MANN fährt Rad."], ["ein Mann fährt Rad ."], "de")
    assert r.bleu_lc_tok == pytest.approx(100.0)
    assert "tok:none" in r.signature and "lowercase+moses-tok:de" in r.signature
    assert score(["EIN MANN fährt Rad."], ["ein Mann fährt Rad ."]).bleu < 100.0
    assert "bleu_lc_tok" in r.to_dict()
