"""Translating text: a tokenizer, a model and a search, batched for speed and order-preserving.

    translator = Translator.load("runs/multi30k")             # a run directory or a checkpoint file
    translator.translate(["A man on a bike.", ""])            # ['Ein Mann auf einem Fahrrad.', '']
    translator.translate_nbest(["A dog."], nbest=4)           # [[Translation(text, score, log_prob), ...]]
    translator.translate_file("test.en", "test.hyp.de")       # a file, line for line; returns the line count
    translator.embed(["A man on a bike."])                    # the encoder's vectors per piece
    (transduce.transfer.embed) translator.translate(["A dog."], tgt_lang="fr")           # a multilingual model: the
    target language

A model trained on several target languages (``data.tgt_langs``) gets the token of the language asked for
(``tgt_lang``: one code for every sentence, or one per sentence; ``decode.tgt_lang`` when none is given) before each
source's pieces (:mod:`transduce.text.langs`); a model without such tokens refuses a target language.

Sentences are tokenised, sorted by length and batched by a token budget (``DecodeConfig.max_tokens`` counts
sentences x beam x padded source length); results come back in input order, exactly one per input. An empty (or
blank) sentence gives an empty translation without running the model. A sentence longer than ``max_input_tokens``
subword tokens is split into pieces (preferably after sentence punctuation), the pieces are translated separately
and joined with a space, and a warning names its line. A :class:`Translator` holds no mutable state while it
translates, so one instance may serve several threads.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from transduce import fastpaths
from transduce.config import ConfigError, DecodeConfig
from transduce.device import allow_tf32, check_precision, resolve_device
from transduce.search import Hypothesis, SearchConstraint, generate, length_batches
from transduce.search.common import pad_sequences
from transduce.text import casing
from transduce.text.langs import LanguageError, TargetLanguages

if TYPE_CHECKING:
    from transduce.transfer.embed import SentenceVectors

log = logging.getLogger(__name__)

#: builds the search constraint of a batch from the indices of its sentences in the input
ConstraintFactory = Callable[[list[int]], SearchConstraint]

DEFAULT_MAX_INPUT_TOKENS = 1024  # longest source (subword tokens) translated in one piece with sinusoidal positions
_LINE_BREAKS = str.maketrans(dict.fromkeys("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029", " "))  # str.splitlines' set
_SENTENCE_END = re.compile(r"[.!?;:。！？]['\"»”’)\]]*$")  # a piece after which splitting a long line is natural


class TokenizerLike(Protocol):
    """The tokenizer methods a :class:`Translator` uses (:class:`transduce.text.tokenizer.Tokenizer` has them)."""

    def encode_src(self, text: str) -> list[int]: ...

    def encode_tgt(self, text: str) -> list[int]: ...

    def decode_tgt(self, ids: Iterable[int]) -> str: ...

    def src_pieces(self, ids: Iterable[int]) -> list[str]: ...

    def tgt_pieces(self, ids: Iterable[int]) -> list[str]: ...


@dataclass(frozen=True)
class Translation:
    """One translation of one input.

    Attributes:
        text: detokenised output (never contains a line break).
        score: the search's ranking score (length-penalised log-probability when the penalty is on).
        log_prob: sum of the model's log-probabilities of the output tokens and EOS.
    """

    text: str
    score: float
    log_prob: float


class Translator:
    """Model + tokenizer + decoding configuration.

    Args:
        model: a :class:`transduce.model.Transformer` (or any :class:`transduce.search.SearchModel` module);
            it is moved to ``device`` and put in eval mode.
        tokenizer: see :class:`TokenizerLike`.
        decode: default decoding configuration (the paper's when None).
        device: ``cpu`` (the default, as for any torch module), ``auto`` (a GPU when there is one: the commands'
            default), ``cuda``, ``cuda:N``, ``mps`` or a ``torch.device``.
        max_input_tokens: longer sources are split into pieces; default: ``max_positions - 1`` for learned
            positions, else 1024.
        precision: ``fp32`` (on CUDA with TF32 matrix products), ``bf16`` or ``fp16``: the dtype the weights are
            cast to for decoding (the search's scores stay float32); on the CPU ``bf16`` casts only the linear
            layers' weights, and their products run in bf16 (:mod:`transduce.model.bf16`). ``auto``: bf16 on a
            CPU with AMX, else fp32 (:func:`transduce.fastpaths.decode_precision`; logged once).
        task: what the model was trained for (``data.task``: ``translate`` or ``parse``); :meth:`load` takes it
            from the run, and parsing (:class:`transduce.parsing.parser.Parser`) needs ``parse``.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: TokenizerLike,
        decode: DecodeConfig | None = None,
        device: str | torch.device = "cpu",
        *,
        max_input_tokens: int | None = None,
        precision: str = "fp32",
        task: str = "translate",
    ) -> None:
        self.device = resolve_device(device)
        precision = resolve_decode_precision(precision, self.device, model)
        dtype = check_precision(precision)
        self.precision = precision
        if dtype != torch.float32 and any(p.dtype != torch.float32 for p in model.parameters()):
            raise ConfigError(f"precision: {precision!r} casts float32 weights; this model's are not all float32 "
                              "(an int8 model runs at precision fp32)")  # fmt: skip
        allow_tf32(self.device)
        if dtype == torch.bfloat16 and self.device.type == "cpu":  # bf16 products, the rest float32 (model/bf16.py)
            from transduce.model.bf16 import bf16_products

            self.model = bf16_products(model)
        else:
            self.model = model.to(self.device, dtype if dtype != torch.float32 else None).eval()
        self.tokenizer = tokenizer
        self.decode = decode if decode is not None else DecodeConfig()
        mc = model.config  # an ensemble's: the smallest position limit of its members
        learned = getattr(mc, "positions", None) == "learned"
        if max_input_tokens is None:
            max_input_tokens = mc.max_positions - 1 if learned else DEFAULT_MAX_INPUT_TOKENS
        if max_input_tokens < 1:
            raise ConfigError(f"max_input_tokens must be >= 1, got {max_input_tokens}")
        if learned and max_input_tokens > mc.max_positions - 1:  # the source and its EOS must fit the table
            raise ConfigError(f"max_input_tokens: {max_input_tokens} exceeds the model's learned positions "
                              f"(max_positions {mc.max_positions} allows {mc.max_positions - 1})")  # fmt: skip
        self.max_input_tokens = max_input_tokens
        self.task = task
        self.languages = TargetLanguages.of(tokenizer, self.decode.tgt_lang)  # a multilingual model's tokens
        self._encode_lock = threading.Lock()  # tokenizers are not all documented as thread-safe

    @classmethod
    def load(
        cls,
        path: str | Path | Sequence[str | Path],
        device: str | torch.device = "cpu",
        *,
        decode: DecodeConfig | None = None,
        max_input_tokens: int | None = None,
        quantize: str | None = None,
        precision: str = "fp32",
    ) -> Translator:
        """A translator from a run directory, a checkpoint, or a Hugging Face Marian model directory (an opus-mt
        model, for example; needs the ``interop`` extra), with the model's decoding configuration unless ``decode``
        is given. ``quantize="int8"`` runs the linear layers (every one where the CPU has VNNI, else the larger
        ones) with dynamic int8 quantisation (CPU only; see :mod:`transduce.model.quantize`).

        A list of several paths loads an ensemble (:class:`transduce.search.ensemble.Ensemble`: the mean of the models'
        next-token probabilities); they must share one vocabulary, and the decoding configuration is the first's."""
        from transduce.interop.marian import load_any
        from transduce.model.quantize import QUANTIZATIONS, quantize_int8

        if quantize is not None and quantize not in QUANTIZATIONS:
            raise ConfigError(f"quantize: {quantize!r} is not one of {', '.join(QUANTIZATIONS)}")
        device = resolve_device(device)
        if quantize is not None and precision == "auto":
            precision = "fp32"
        if precision != "auto":
            check_precision(precision)
        if quantize is not None and device.type != "cpu":
            raise ConfigError(f"quantize: {quantize!r} runs on the CPU only, not on {device}")
        if quantize is not None and precision != "fp32":
            raise ConfigError(f"quantize: {quantize!r} runs with precision fp32, not {precision}")
        paths = [path] if isinstance(path, str | Path) else list(path)
        if not paths:
            raise ConfigError("no model to load")
        loaded = [load_any(p, device) for p in paths]
        models = [quantize_int8(m) if quantize == "int8" else m for m, _, _ in loaded]
        _, config, tokenizer = loaded[0]
        model = models[0]
        if len(paths) > 1:
            from transduce.search.ensemble import Ensemble, check_same_task, check_same_vocabulary

            names = [str(p) for p in paths]
            check_same_task([c.data.task for _, c, _ in loaded], names)
            check_same_vocabulary([tok for _, _, tok in loaded], names)
            model = Ensemble(models)
        return cls(model, tokenizer, decode or config.decode, device, max_input_tokens=max_input_tokens,
                   precision=precision, task=config.data.task)  # fmt: skip

    # ------------------------------------------------------------------------------------------------------------------
    # public API

    def translate(
        self,
        sentences: Sequence[str],
        *,
        beam: int | None = None,
        decode: DecodeConfig | None = None,
        constraint: ConstraintFactory | None = None,
        tgt_lang: str | Sequence[str] | None = None,
        **options: Any,
    ) -> list[str]:
        """Translate sentences; returns one string per input, in input order.

        Args:
            sentences: raw source sentences.
            tgt_lang: a multilingual model's target language (``fr`` or ``fra``), for every sentence or a list of one
                per sentence (default: ``decode.tgt_lang``); :class:`transduce.text.langs.LanguageError` names one that
                is malformed or unknown, or a missing one.
            beam: beam size (default: the translator's configuration).
            decode: a whole decoding configuration instead of the translator's.
            constraint: a further rule on the next token (e.g. parsing's tree constraint): called with the indices
                (into ``sentences``) of each batch's sentences, it returns their
                :class:`transduce.search.SearchConstraint`; a sentence split into pieces gets its own for each.
            options: other :class:`DecodeConfig` fields (``length_penalty=1.0``, ``sampling=True``, ...); unknown
                names raise :class:`transduce.config.ConfigError`.
        """
        _check_sentences(sentences, "translate")
        cfg = self.search_config(beam=beam, decode=decode, **options)
        langs = self.language_ids(tgt_lang, len(sentences), cfg)
        return [ts[0].text for ts in self._translate(list(enumerate(sentences, start=1)), cfg, constraint, langs)]

    def translate_nbest(
        self,
        sentences: Sequence[str],
        *,
        nbest: int,
        beam: int | None = None,
        decode: DecodeConfig | None = None,
        constraint: ConstraintFactory | None = None,
        tgt_lang: str | Sequence[str] | None = None,
        **options: Any,
    ) -> list[list[Translation]]:
        """The ``nbest`` best translations of each sentence with their scores, best first.

        The beam is widened to ``nbest`` if it is smaller. An empty sentence, and a sentence that had to be split,
        get a single translation. ``constraint``, ``tgt_lang``: as for :meth:`translate`.
        """
        _check_sentences(sentences, "translate_nbest")
        cfg = self.search_config(nbest=nbest, beam=beam, decode=decode, **options)
        langs = self.language_ids(tgt_lang, len(sentences), cfg)
        return self._translate(list(enumerate(sentences, start=1)), cfg, constraint, langs)

    def translate_file(
        self,
        src: str | Path,
        out: str | Path,
        *,
        replace_invalid: bool = False,
        beam: int | None = None,
        decode: DecodeConfig | None = None,
        tgt_lang: str | None = None,
        **options: Any,
    ) -> int:
        """Translate a text file (plain or gzipped, one sentence per line) into ``out``, line for line.

        The input is read and translated a chunk at a time (see :meth:`translate_lines`), so a file of any size
        needs bounded memory; ``out`` is written as UTF-8 with ``\\n`` line ends and appears only when complete
        (written beside it under a temporary name, then renamed).

        Args:
            src: the source file (see :func:`read_source_lines`); a line that is not UTF-8 raises
                :class:`transduce.errors.DataError` naming it, unless ``replace_invalid``.
            out: the file of translations; its directory is created. ``src`` itself is refused
                (:class:`transduce.files.SameFileError`), before anything is read or written.
            beam, decode, tgt_lang, options: as for :meth:`translate` (one target language for the file).

        Returns:
            The number of lines translated.
        """
        from transduce.files import check_outputs, open_output

        cfg = self.search_config(beam=beam, decode=decode, **options)
        self.language_ids(tgt_lang, 1, cfg)  # refused before anything is read or written
        check_outputs([("source", src)], [("output", out)])
        count = 0
        with open_output(out) as f:
            lines = read_source_lines(src, replace_invalid=replace_invalid)
            for translations in self.translate_lines(lines, cfg, tgt_lang=tgt_lang):
                f.write(translations[0].text + "\n")
                count += 1
        return count

    def embed(
        self,
        texts: Sequence[str],
        *,
        pooled_only: bool = False,
        with_embeddings: bool = False,
        include_eos: bool = False,
        input_case: str | None = None,
        max_tokens: int | None = None,
    ) -> list[SentenceVectors]:
        """The encoder's output as contextual word vectors (CoVe), one :class:`transduce.transfer.embed.SentenceVectors`
        (pieces, a float32 ``(pieces, D)`` array, their mean) per text, in input order; see
        :mod:`transduce.transfer.embed` for exactly what the vectors are.

        Args:
            texts: raw source sentences, prepared as :meth:`translate` prepares them.
            pooled_only: only the mean vector of each text (``states`` None, ``pieces`` empty).
            with_embeddings: each row ``[embedding; state]`` (``D = 2 * d_model``): the piece's source embedding,
                scaled as the encoder scales it, before positions.
            include_eos: keep the EOS position's row (and piece) at the end; without it, EOS is encoded but its row
                is left out, and out of the mean.
            input_case: ``keep``, ``normalize`` or ``truecase`` (default: the translator's ``decode.input_case``).
            max_tokens: token budget of a batch (default: the translator's ``decode.max_tokens``).
        """
        from transduce.transfer.embed import embed_lines

        _check_sentences(texts, "embed")
        return list(embed_lines(self, list(enumerate(texts, start=1)), pooled_only=pooled_only,
                                with_embeddings=with_embeddings, include_eos=include_eos, input_case=input_case,
                                max_tokens=max_tokens, chunk_size=max(1, len(texts))))  # fmt: skip

    def search_config(
        self, *, nbest: int | None = None, beam: int | None = None, decode: DecodeConfig | None = None, **options: Any
    ) -> DecodeConfig:
        """The decoding configuration :meth:`translate` (``nbest`` None: one translation) or :meth:`translate_nbest`
        (the beam widened to ``nbest``) searches with for these arguments; None values keep the base's setting.
        Raises :class:`transduce.config.ConfigError` for options :class:`DecodeConfig` refuses."""
        if nbest is None:
            return self._config(decode, beam=beam, nbest=1, **options)
        return self._config(decode, beam=max(beam or (decode or self.decode).beam, nbest), nbest=nbest, **options)

    def translate_lines(
        self, lines: Iterable[tuple[int, str] | tuple[int, str, str]], cfg: DecodeConfig | None = None, *,
        chunk_size: int = 2000, tgt_lang: str | None = None,
    ) -> Iterator[list[Translation]]:  # fmt: skip
        """Translate a stream of ``(line number, text)``, ``chunk_size`` lines at a time (sorted within a chunk);
        yields each line's translations in input order. Line numbers appear in warnings. ``tgt_lang``: a
        multilingual model's target language for every line (checked before the first line is read); a line
        ``(line number, text, language)`` names its own (a multilingual test file's, ``read_languages``)."""
        cfg = cfg or self.decode
        if tgt_lang is not None and not isinstance(tgt_lang, str):
            raise LanguageError(f"tgt_lang: one language for every line, got {type(tgt_lang).__name__} (a line "
                                "names its own as (line number, text, language))")  # fmt: skip
        missing = None
        try:
            lang = self.language_ids(tgt_lang, 1, cfg)[0]
        except LanguageError as e:
            if tgt_lang is not None:
                raise
            lang, missing = None, e  # a multilingual model without a default: each line must name its language
        known = TargetLanguages(self.languages.tokens)

        def ids(chunk: list) -> list[int | None]:
            if missing is not None and any(len(item) == 2 for item in chunk):
                raise missing
            return [lang if len(item) == 2 else known.token_id(item[2], f"line {item[0]}") for item in chunk]

        chunk: list = []
        for item in lines:
            chunk.append(item)
            if len(chunk) >= chunk_size:
                yield from self._translate([item[:2] for item in chunk], cfg, langs=ids(chunk))
                chunk = []
        if chunk:
            yield from self._translate([item[:2] for item in chunk], cfg, langs=ids(chunk))

    def language_ids(
        self, tgt_lang: str | Sequence[str] | None, n: int, decode: DecodeConfig | None = None
    ) -> list[int | None]:
        """The target-language token id of each of ``n`` texts (None for a model without such tokens) that
        ``tgt_lang`` asks for (one code, a list of ``n``, or None: ``decode.tgt_lang``).

        Raises:
            transduce.text.langs.LanguageError: a code that is malformed or not the model's, a missing one (the model
                has tokens and no default), or any code for a model without tokens; the message names the text.
        """
        default = (decode or self.decode).tgt_lang
        return TargetLanguages(self.languages.tokens, default).token_ids(tgt_lang, n)

    # ------------------------------------------------------------------------------------------------------------------

    def _config(self, decode: DecodeConfig | None, **changes: Any) -> DecodeConfig:
        base = decode or self.decode
        changes = {k: v for k, v in changes.items() if v is not None}
        return base.replace(**changes) if changes else base

    def _encode(self, texts: list[str]) -> list[list[int]]:
        with self._encode_lock:
            batch = getattr(self.tokenizer, "encode_src_batch", None)
            if batch is not None:
                return [list(ids) for ids in batch(texts)]
            return [list(self.tokenizer.encode_src(t)) for t in texts]

    def _translate(
        self, lines: list[tuple[int, str]], cfg: DecodeConfig, constraint: ConstraintFactory | None = None,
        langs: Sequence[int | None] | None = None,
    ) -> list[list[Translation]]:  # fmt: skip
        """``langs``: each line's target-language token id (put before its source ids; None: no token)."""
        eos = self.model.config.eos_id
        if langs is None:
            langs = self.language_ids(None, len(lines), cfg)
        width = cfg.nbest if cfg.sampling else cfg.beam  # hypotheses per sentence in the search
        styles: list[casing.Style | None] = [None] * len(lines)
        if cfg.input_case != "keep":
            truecaser = self._truecaser() if cfg.input_case == "truecase" else None
            normalized = [casing.normalize(text, truecaser) for _, text in lines]
            lines = [(lineno, text) for (lineno, _), (text, _) in zip(lines, normalized)]
            styles = [style for _, style in normalized]
        ids = self._encode([text for _, text in lines])
        # segments: (input index, piece index, source ids + EOS)
        segments: list[tuple[int, int, list[int]]] = []
        pieces_of = [0] * len(lines)
        for i, ((lineno, text), toks) in enumerate(zip(lines, ids)):
            if not text.strip() or not toks:
                continue
            prefix = [] if langs[i] is None else [langs[i]]  # the target-language token, before every piece
            limit = max(1, self.max_input_tokens - len(prefix))
            parts = self._split(toks, limit) if len(toks) > limit else [toks]
            if len(parts) > 1:
                log.warning(
                    "line %d: %d source tokens exceed max_input_tokens=%d; translated in %d pieces and joined",
                    lineno, len(toks), self.max_input_tokens, len(parts),
                )  # fmt: skip
            pieces_of[i] = len(parts)
            segments.extend((i, j, [*prefix, *part, eos]) for j, part in enumerate(parts))

        results: dict[tuple[int, int], list[Hypothesis]] = {}
        for indices in length_batches([len(seg[2]) for seg in segments], cfg.max_tokens, width):
            batch = [segments[k] for k in indices]
            src = pad_sequences([seg[2] for seg in batch], self.model.config.pad_id, self.device)
            rule = constraint([seg[0] for seg in batch]) if constraint is not None else None
            for seg, hyps in zip(batch, generate(self.model, src, cfg, constraint=rule)):
                results[seg[0], seg[1]] = hyps

        out: list[list[Translation]] = []
        for i, n in enumerate(pieces_of):
            if n == 0:
                out.append([Translation("", 0.0, 0.0)])
            elif n == 1:
                out.append([self._to_translation(h, styles[i]) for h in results[i, 0]])
            else:
                best = [results[i, j][0] for j in range(n)]
                text = " ".join(self._to_translation(h, styles[i]).text for h in best).strip()
                out.append([Translation(text, sum(h.score for h in best), sum(h.log_prob for h in best))])
        return out

    def _truecaser(self) -> casing.Truecaser:
        truecaser = getattr(self.tokenizer, "truecaser", None)
        if truecaser is None:
            raise ConfigError(
                f"input_case: 'truecase' needs the source truecasing table ({casing.TRUECASE_FILE}) that transduce "
                "prepare writes beside the vocabulary of a cased corpus; this model has none (use 'normalize')"
            )
        return truecaser

    def _to_translation(self, hyp: Hypothesis, style: casing.Style | None = None) -> Translation:
        text = self.tokenizer.decode_tgt(hyp.tokens)
        text = casing.restore(text.translate(_LINE_BREAKS), style)  # one line in, one line out, whoever splits it
        return Translation(text, hyp.score, hyp.log_prob)

    def _split(self, toks: list[int], limit: int | None = None) -> list[list[int]]:
        """Cut a too-long source into pieces of at most ``limit`` tokens (default: ``max_input_tokens``), after
        sentence punctuation when there is some in the second half of a window, else at the limit."""
        limit = limit or self.max_input_tokens
        pieces = self.tokenizer.src_pieces(toks)
        parts, start = [], 0
        while len(toks) - start > limit:
            end = start + limit
            cut = end
            for k in range(end, start + limit // 2, -1):  # after piece k - 1
                if _SENTENCE_END.search(pieces[k - 1]):
                    cut = k
                    break
            parts.append(toks[start:cut])
            start = cut
        parts.append(toks[start:])
        return parts

    # ------------------------------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def attention(
        self, source: str, target: str | None = None, *, beam: int | None = None, tgt_lang: str | None = None
    ) -> AttentionMaps:
        """Attention weights of one sentence pair (the translation of ``source`` when ``target`` is None);
        ``tgt_lang``: a multilingual model's target language (as for :meth:`translate`).

        Returns:
            :class:`AttentionMaps` with the subword pieces for the axes.
        """
        if len(getattr(self.model, "members", ())) > 1:
            raise ConfigError("attention shows one model's weights; this translator is an ensemble of "
                              f"{len(self.model.members)} models")  # fmt: skip
        cfg = self.model.config
        lang = self.language_ids(tgt_lang, 1)[0]
        prefix = [] if lang is None else [lang]
        src_ids = [*prefix, *self._encode([source])[0][: self.max_input_tokens - len(prefix)], cfg.eos_id]
        if target is None:
            src = torch.tensor([src_ids], device=self.device)
            tgt_ids = generate(self.model, src, self._config(None, beam=beam, nbest=1))[0][0].tokens
        else:
            tgt_ids = list(self.tokenizer.encode_tgt(target))
        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[cfg.bos_id, *tgt_ids]], device=self.device)
        _, weights = self.model.attention(src, tgt_in)
        return AttentionMaps(
            src_pieces=self.tokenizer.src_pieces(src_ids),
            tgt_in_pieces=self.tokenizer.tgt_pieces([cfg.bos_id, *tgt_ids]),
            tgt_out_pieces=self.tokenizer.tgt_pieces([*tgt_ids, cfg.eos_id]),
            encoder=torch.stack([w[0] for w in weights.encoder]).float().cpu(),
            decoder=torch.stack([w[0] for w in weights.decoder]).float().cpu(),
            cross=torch.stack([w[0] for w in weights.cross]).float().cpu(),
        )


@dataclass(frozen=True)
class AttentionMaps:
    """Attention weights of one teacher-forced sentence pair, for pictures.

    Attributes:
        src_pieces: source pieces, EOS included (S).
        tgt_in_pieces: decoder inputs, BOS + target pieces (T).
        tgt_out_pieces: what each decoder position predicts, target pieces + EOS (T).
        encoder: (layers, heads, S, S) encoder self-attention.
        decoder: (layers, heads, T, T) decoder self-attention: row t (predicting tgt_out t) over tgt_in.
        cross: (layers, heads, T, S) encoder-decoder attention: row t (predicting tgt_out t) over the source.
    """

    src_pieces: list[str]
    tgt_in_pieces: list[str]
    tgt_out_pieces: list[str]
    encoder: torch.Tensor
    decoder: torch.Tensor
    cross: torch.Tensor


# ----------------------------------------------------------------------------------------------------------------------
# input text


_SAID: set[str] = set()  # the precision lines already logged (each once per process)


def resolve_decode_precision(precision: str, device: torch.device, model: nn.Module) -> str:
    """``precision`` with ``auto`` resolved for decoding ``model`` on ``device``: on the CPU what
    :func:`transduce.fastpaths.decode_precision` picks for it (bf16 with AMX, else fp32); fp32 on other devices and
    for models whose weights are not all float32 (int8 ones). The choice and its reason are logged, once."""
    if precision != "auto":
        return precision
    quantised = any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
    if device.type != "cpu":
        name, why = "fp32", f"auto: fp32 on {device.type}"
    elif quantised or any(p.dtype != torch.float32 for p in model.parameters()):
        name, why = "fp32", "auto: the model's weights are not all float32"
    else:
        name, why = fastpaths.decode_precision()
    line = f"precision: {name} ({why})"
    if line not in _SAID:
        _SAID.add(line)
        log.info("%s", line)
    return name


def _check_sentences(sentences: Sequence[str], method: str) -> None:
    """A str is a Sequence[str] of its characters: refuse it rather than translate each character."""
    if isinstance(sentences, str | bytes):
        raise TypeError(
            f"Translator.{method}() takes a list of sentences, got a single {type(sentences).__name__}; "
            f"pass [text] (one sentence) or text.split('\\n') (one per line)"
        )


def read_source_lines(
    path: str | Path, *, replace_invalid: bool = False, field: str | None = None
) -> Iterator[tuple[int, str]]:
    """The sentences to translate as ``(line number, text)``: the lines of a text file (``"-"``: standard input),
    split on ``\\n`` only, or the source side of a corpus file as ``transduce prepare`` reads it: the first column of
    ``NAME.tsv[.gz]``, the field ``field`` (default ``src``; ``a.b`` nests) of ``NAME.jsonl[.gz]``.

    Args:
        replace_invalid: replace bytes that are not UTF-8 with U+FFFD (and warn with the line number) instead of
            raising :class:`transduce.errors.DataError` naming the line.
        field: the JSON Lines field of the source.

    Raises:
        DataError: naming the file and line: bytes that are not UTF-8, a TSV line without exactly one tab, a JSON
            Lines line without the field.
    """
    from transduce.data.corpus import read_side

    errors = "replace" if replace_invalid else "strict"
    hint = "use --replace-invalid to translate it with U+FFFD in place"
    yield from read_side(path, "source", field, errors=errors, hint=hint)
