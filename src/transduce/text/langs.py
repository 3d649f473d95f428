"""Target-language tokens: how a multilingual model is told which language to write.

A model trained on several target languages reads, as the first piece of every source, a token naming the language
of the translation, in Marian's convention (OPUS-MT's multilingual models): ``>>fra<<`` for French, ``>>deu<<`` for
German. The token is one piece of the vocabulary (a SentencePiece user-defined piece in ours, an entry of
``vocab.json`` in a Marian vocabulary): it is put before the source's pieces by id, never segmented, and the search
never generates it (``model.suppress_ids``).

Codes. A language is named by an ISO 639-1 (``fr``) or ISO 639-3 code (``fra``), optionally with a script or
region (``zho_Hans``, ``pt_BR``). :data:`ISO639` pairs the two forms for the languages OPUS-MT and Multi30k use, so
that ``fr`` and ``fra`` name one language; a code outside the table stands for itself. A new token takes the ISO
639-3 form where the table knows it (``fr`` -> ``>>fra<<``, as OPUS-MT writes them), else the code as given; a
vocabulary that already holds a token for the language (``>>fr<<`` or ``>>fra<<``) keeps it.

    langs = TargetLanguages.of(vocab)      # the tokens a vocabulary holds
    langs.token_id("fr")                   # the id of >>fra<< (or >>fr<<); an error naming the known ones otherwise
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from transduce.errors import TransduceError

#: ISO 639-1 -> ISO 639-3 (the forms OPUS-MT's language tokens use: terminology codes, deu/fra/ces, not ger/fre/cze)
ISO639 = {
    "ar": "ara", "bg": "bul", "ca": "cat", "cs": "ces", "cy": "cym", "da": "dan", "de": "deu", "el": "ell",
    "en": "eng", "es": "spa", "et": "est", "eu": "eus", "fa": "fas", "fi": "fin", "fr": "fra", "ga": "gle",
    "gl": "glg", "he": "heb", "hi": "hin", "hr": "hrv", "hu": "hun", "hy": "hye", "id": "ind", "is": "isl",
    "it": "ita", "ja": "jpn", "ka": "kat", "ko": "kor", "lt": "lit", "lv": "lav", "mk": "mkd", "mt": "mlt",
    "nl": "nld", "no": "nor", "pl": "pol", "pt": "por", "ro": "ron", "ru": "rus", "sk": "slk", "sl": "slv",
    "sq": "sqi", "sr": "srp", "sv": "swe", "sw": "swa", "th": "tha", "tr": "tur", "uk": "ukr", "ur": "urd",
    "vi": "vie", "zh": "zho",
}  # fmt: skip
_ISO639_1 = {three: two for two, three in ISO639.items()}
_CODE = re.compile(r"[a-z]{2,3}(_[A-Za-z]{2,4})?")  # ISO 639-1 or -3, optionally _Script or _Region (zho_Hans, pt_BR)
TOKEN = re.compile(r">>([A-Za-z0-9_-]+)<<")  # Marian's form of a target-language token


class LanguageError(TransduceError, ValueError):
    """A target language that is malformed, unknown to the model, or missing where the model needs one."""


def check_code(code: str, where: str = "target language") -> str:
    """``code`` (or a token ``>>code<<``) as a bare code, checked against the pattern rule.

    Raises:
        LanguageError: naming ``where``: not 2-3 lowercase letters with an optional ``_Script`` or ``_Region``.
    """
    if not isinstance(code, str):
        raise LanguageError(f"{where}: expected a language code (a string), got {type(code).__name__}")
    m = TOKEN.fullmatch(code)
    bare = m.group(1) if m else code
    if not _CODE.fullmatch(bare):
        raise LanguageError(f"{where}: {code!r} is not a language code (ISO 639-1 or 639-3: 2 or 3 lowercase letters, "
                            "optionally _Script or _Region, e.g. fr, fra, zho_Hans, pt_BR)")  # fmt: skip
    return bare


def forms(code: str) -> list[str]:
    """The codes naming the same language as ``code``: itself first, then its other ISO 639 form (if known)."""
    base, _, script = code.partition("_")
    other = ISO639.get(base) or _ISO639_1.get(base)
    out = [code]
    if other:
        out.append(other + (f"_{script}" if script else ""))
    return out


def canonical(code: str) -> str:
    """The ISO 639-3 form where the table knows the language (``fr`` -> ``fra``), else ``code``."""
    base, _, script = code.partition("_")
    return ISO639.get(base, base) + (f"_{script}" if script else "")


def new_token(code: str) -> str:
    """The token a vocabulary gets for a language it has no token for: ``>>fra<<`` for ``fr`` or ``fra``."""
    return f">>{canonical(check_code(code))}<<"


def same_language(a: str, b: str) -> bool:
    return canonical(a) == canonical(b)


@dataclass(frozen=True)
class TargetLanguages:
    """The target-language tokens of a vocabulary: token -> source id (empty for a model of one target language).

    Attributes:
        tokens: ``{">>fra<<": 8004, ...}`` in id order.
        default: the language used when a request names none (``decode.tgt_lang``); "" for none.
    """

    tokens: Mapping[str, int]
    default: str = ""

    @classmethod
    def of(cls, vocab, default: str = "") -> TargetLanguages:
        """The tokens of ``vocab`` (any :class:`transduce.text.tokenizer.Vocabulary`; source pieces of the form
        ``>>xx<<``)."""
        tokens = vocab.lang_tokens() if hasattr(vocab, "lang_tokens") else {}
        langs = cls(dict(sorted(tokens.items(), key=lambda kv: kv[1])), default)
        if default:
            langs.token_id(default, "decode.tgt_lang")  # refuse a default the model cannot write
        return langs

    def __bool__(self) -> bool:
        return bool(self.tokens)

    def codes(self) -> list[str]:
        """The languages, as their tokens spell them (``deu``, ``fra``, ...)."""
        return [TOKEN.fullmatch(t).group(1) for t in self.tokens]  # type: ignore[union-attr]

    def listed(self, most: int = 20) -> str:
        """The languages for a message: all of them, or the first ``most`` and how many more (OPUS-MT's widest
        models hold hundreds of tokens)."""
        codes = self.codes()
        more = f", and {len(codes) - most} more" if len(codes) > most else ""
        return ", ".join(codes[:most]) + more

    def find(self, code: str) -> str | None:
        """The token of the language ``code`` names (any of its forms; a script or region in any letter case:
        ``pt_BR`` finds ``>>pt_br<<``), None if the vocabulary has none."""
        folded = {token.lower(): token for token in self.tokens}
        for form in forms(code):
            token = folded.get(f">>{form}<<".lower())
            if token is not None:
                return token
        return None

    def token_id(self, code: str | None, where: str = "tgt_lang") -> int | None:
        """The id of the token for ``code`` (``None``: the default's; None for a model without tokens).

        Raises:
            LanguageError: naming ``where``: a malformed or unknown code, a code for a model without tokens, no code
                (and no default) for a model with tokens.
        """
        code = code or self.default
        if not code:
            if not self.tokens:
                return None
            known = self.listed()
            raise LanguageError(
                f"{where}: missing: this model writes {len(self.tokens)} target languages ({known}); name one "
                '(--tgt-lang, tgt_lang=, the request\'s "tgt_lang") or set decode.tgt_lang'
            )
        bare = check_code(code, where)
        if not self.tokens:
            raise LanguageError(f"{where}: {code!r}: this model has no target-language tokens (it writes one language);"
                                " leave the target language out")  # fmt: skip
        token = self.find(bare)
        if token is None:
            raise LanguageError(f"{where}: {code!r} is not a target language of this model (it knows: "
                                f"{self.listed()})")  # fmt: skip
        return self.tokens[token]

    def token_ids(self, codes: str | Sequence[str | None] | None, n: int, where: str = "tgt_lang") -> list[int | None]:
        """One token id (or None) per text of ``n``: ``codes`` one for all, or a list of ``n`` (item i named
        ``where[i]`` in errors)."""
        if codes is None or isinstance(codes, str):
            one = self.token_id(codes, where)
            return [one] * n
        if not isinstance(codes, Sequence):
            raise LanguageError(f"{where}: expected a language code or a list of them, got {type(codes).__name__}")
        codes = list(codes)
        if len(codes) != n:
            raise LanguageError(f"{where}: {len(codes)} languages for {n} texts (give one, or one per text)")
        return [self.token_id(c, f"{where}[{i}]") for i, c in enumerate(codes)]


def tokens_for(codes: Iterable[str], existing: Mapping[str, int]) -> list[str]:
    """The token of each language in ``codes``: the one ``existing`` holds for it, else :func:`new_token`."""
    held = TargetLanguages(existing)
    return [held.find(check_code(c)) or new_token(c) for c in codes]
