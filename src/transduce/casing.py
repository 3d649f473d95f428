"""Robustness to the casing of the input: training-time case augmentation and decode-time case normalisation.

A model trained on cased text sees ALL-CAPS or Title-Case input almost never, and its subword pieces for such text
are rare or absent: given "TWO DOGS ARE PLAYING IN THE SNOW." it produces garbage. Two remedies, which work
together:

- **Augmentation** (``data.case_augment``, at preparation): a share of the training pairs is added again with the
  source lowercased and the target as it is, so that the model learns to translate input that carries no case
  information into properly cased output.
- **Normalisation** (``decode.input_case: normalize``, at translation): a source line written in ALL CAPS or in
  Title Case (:func:`input_style`) is lowercased before it is translated, and the translation is given the input's
  style back (:func:`restore`). Lines in ordinary case are translated as they are.

Which pairs are augmented is a function of the line number alone (:func:`augmented`), so a preparation is
reproducible and independent of how the corpus is cut into chunks.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Style = Literal["upper", "title"]
INPUT_CASES = ("keep", "normalize")  # DecodeConfig.input_case


def augmented(line: int, share: float) -> bool:
    """Whether the pair on 0-based ``line`` of a training corpus gets a case-augmented copy, for a ``share`` of
    the lines (a hash of the line number, so the same lines every time)."""
    if share <= 0.0:
        return False
    digest = hashlib.blake2b(line.to_bytes(8, "little", signed=False), digest_size=8).digest()
    return int.from_bytes(digest, "little") < share * 2.0**64


def augment_pair(src: str, tgt: str) -> tuple[str, str]:
    """The augmented copy of a pair: the source lowercased, the target unchanged."""
    return src.lower(), tgt


def _words(text: str) -> list[str]:
    """Whitespace-separated words that start with a cased letter."""
    return [w for w in text.split() if w[:1].isalpha() and w[:1].lower() != w[:1].upper()]


def input_style(text: str) -> Style | None:
    """ "upper" for a line in ALL CAPS (at least two words with letters, no lowercase letter), "title" for a line in
    Title Case (at least three such words, each starting with a capital, not all caps), else None.

    Ordinary sentences, German ones with their capitalised nouns included, have lowercase words between their
    capitalised ones and are left alone.
    """
    words = _words(text)
    if len(words) >= 2 and not any(c.islower() for c in text) and any(c.isupper() for c in text):
        return "upper"
    if len(words) >= 3 and all(w[0].isupper() for w in words):
        return "title"
    return None


def title(text: str) -> str:
    """Each whitespace-separated word with its first letter capitalised and the rest as it is (unlike
    ``str.title``, which also capitalises after apostrophes and lowercases the rest)."""
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


def normalize(text: str) -> tuple[str, Style | None]:
    """The text to translate and the style to restore: ``(text.lower(), style)`` for ALL-CAPS and Title-Case lines,
    ``(text, None)`` for the others."""
    style = input_style(text)
    return (text.lower(), style) if style is not None else (text, None)


def restore(text: str, style: Style | None) -> str:
    """A translation given the input's style back: upper-cased for "upper", title-cased for "title"."""
    if style == "upper":  # "ß" as the capital "ẞ", not "SS": lowercasing the output gives the word back
        return text.replace("ß", "ẞ").upper()
    if style == "title":
        return title(text)
    return text
