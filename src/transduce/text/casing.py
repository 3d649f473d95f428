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
- **Truecasing** (``decode.input_case: truecase``): as normalisation, but the lowercased line is then recased, each
  word to its most frequent form in the training sources and the first word capitalised (:class:`Truecaser`), so
  that the model sees the case it was trained on: German nouns capitalised again, for instance. ``transduce
  prepare`` writes the table (``truecase.json``) beside the vocabulary of a cased corpus.

Which pairs are augmented is a function of the line number alone (:func:`augmented`), so a preparation is
reproducible and independent of how the corpus is cut into chunks.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from transduce.errors import DataError

Style = Literal["upper", "title"]
INPUT_CASES = ("keep", "normalize", "truecase")  # DecodeConfig.input_case
TRUECASE_FILE = "truecase.json"  # the source side's truecasing table, beside the vocabulary
_WORD = re.compile(r"[^\W\d_](?:[^\W\d_]|[\u0300-\u036f])*")  # letters (and combining accents): what is recased


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


MIN_CASED_SHARE = 0.8  # a line's style is decided only where at least this share of its letters are cased


def _is_upper(c: str) -> bool:
    """A capital with a distinct lowercase form (dotted İ, whose lowercase is two characters, included)."""
    return c.isupper() and c.lower() != c


def _is_lower(c: str) -> bool:
    """A lowercase letter whose capital is one other letter: not ß (capital "SS"), º or ª (no capital)."""
    upper = c.upper()
    return c.islower() and len(upper) == 1 and upper != c


def _words(text: str) -> list[str]:
    """Whitespace-separated words that start with a cased letter."""
    return [w for w in text.split() if _is_upper(w[0]) or _is_lower(w[0])]


def input_style(text: str) -> Style | None:
    """ "upper" for a line in ALL CAPS (at least two words with letters, no lowercase letter), "title" for a line in
    Title Case (at least three such words, each starting with a capital, not all caps), else None.

    Only letters with distinct upper and lower forms count: ß, º and ª are neither (EIN GROßER HUND is ALL CAPS).
    Ordinary sentences, German ones with their capitalised nouns included, have lowercase words between their
    capitalised ones and are left alone; so are lines whose letters are mostly of a script without case (Chinese,
    Japanese, Arabic, Hebrew: fewer than ``MIN_CASED_SHARE`` of the letters cased), where a few Latin acronyms say
    nothing about the line.
    """
    letters = [c for c in text if c.isalpha()]
    upper = sum(map(_is_upper, letters))
    lower = sum(map(_is_lower, letters))
    if not letters or upper + lower < MIN_CASED_SHARE * len(letters):
        return None
    words = _words(text)
    if len(words) >= 2 and lower == 0 and upper > 0:
        return "upper"
    if len(words) >= 3 and all(_is_upper(w[0]) for w in words):
        return "title"
    return None


def title(text: str) -> str:
    """Each whitespace-separated word with its first letter capitalised and the rest as it is (unlike
    ``str.title``, which also capitalises after apostrophes and lowercases the rest)."""
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


class Truecaser:
    """The most frequent form of each word of a corpus, for recasing text that lost its case.

    A word is a run of letters (text in NFC); its occurrences as the first word of a line are not counted (they are
    capitalised whatever the word). Words are told apart by their case-folded form, so that "STRASSE" finds
    "Straße" and "WEISSEN" "weißen". Only the words whose most frequent form is not their case fold are stored (ties
    go to the lowercase form). Recasing gives every word of a lowercased line that form and capitalises the line's
    first word.
    """

    def __init__(self, forms: dict[str, str]) -> None:
        self.forms = forms  # case-folded word -> its most frequent form, where that is not the case fold

    @classmethod
    def train(cls, lines: Iterable[str]) -> Truecaser:
        counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for line in lines:
            for match in list(_WORD.finditer(unicodedata.normalize("NFC", line)))[1:]:
                word = match.group()
                counts[word.casefold()][word] += 1
        forms = {}
        for key, seen in counts.items():
            best = max(seen.items(), key=lambda form: (form[1], form[0] == form[0].lower(), form[0]))[0]
            if best != key:  # capitalised, or not its own case fold: "weißen", whose ALL CAPS is WEISSEN
                forms[key] = best
        return cls(dict(sorted(forms.items())))

    def __call__(self, text: str) -> str:
        """``text`` (lowercased first) with each word in its most frequent form and the first word capitalised."""
        first = True

        def recase(match: re.Match[str]) -> str:
            nonlocal first
            low = match.group()
            word = self.forms.get(low.casefold(), low)
            if first:
                word, first = word[:1].upper() + word[1:], False
            return word

        return _WORD.sub(recase, unicodedata.normalize("NFC", text).lower())

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / TRUECASE_FILE
        path.write_text(json.dumps({"forms": self.forms}, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> Truecaser | None:
        """The table in ``directory``, or None where it has none."""
        path = Path(directory) / TRUECASE_FILE
        if not path.is_file():
            return None
        try:
            return cls(dict(json.loads(path.read_text(encoding="utf-8"))["forms"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise DataError(f"{path}: not a truecasing table ({type(e).__name__}: {e})") from None


def normalize(text: str, truecaser: Truecaser | None = None) -> tuple[str, Style | None]:
    """The text to translate and the style to restore: for ALL-CAPS and Title-Case lines the text lowercased (and
    recased by ``truecaser`` where one is given) and its style, ``(text, None)`` for the others."""
    style = input_style(text)
    if style is None:
        return text, None
    return (truecaser(text) if truecaser is not None else text.lower()), style


def restore(text: str, style: Style | None) -> str:
    """A translation given the input's style back: upper-cased for "upper", title-cased for "title"."""
    if style == "upper":  # "ß" as the capital "ẞ", not "SS": lowercasing the output gives the word back
        return text.replace("ß", "ẞ").upper()
    if style == "title":
        return title(text)
    return text
