"""An HTTP translation server: a JSON API with dynamic batching, and a web page to explore attention.

    transduce serve --model runs/multi30k --port 8000          # then open http://127.0.0.1:8000/

    app = create_app(Translator.load("runs/multi30k"))          # a FastAPI app, for any ASGI server
    with ServerThread(app) as url:                              # uvicorn in a background thread, on a free port
        httpx.post(url + "/translate", json={"sentences": ["A dog."]}).json()   # {'translations': ['Ein Hund.']}

Endpoints (the OpenAPI schema is at ``/openapi.json``, interactive documentation at ``/docs``):

* ``POST /translate`` ``{"sentences": [...], "beam": 4, "length_penalty": 0.6, ...}`` ->
  ``{"translations": [...]}``, one per sentence in input order (``"nbest": K`` adds the K best with scores).
  Options that are left out or ``null`` take the server's defaults (the run's decoding configuration).
  ``"sampling": true`` samples (``temperature``, ``top_k``, ``top_p``); ``"seed": N`` gives each sentence the same
  samples every time, whatever it is batched with. ``"tgt_lang": "fr"`` names a multilingual model's target language
  (default: the server's ``--tgt-lang``, else the run's ``decode.tgt_lang``; with neither, a request must name one).
* ``POST /attention`` ``{"sentence": "...", "target": null, "beam": ..., "length_penalty": ...}`` -> the
  translation, the source and target subword pieces and the encoder-decoder attention
  ``cross[layer][head][target piece][source piece]``.
* ``GET /health`` -> ``{"status": "ok", ...}`` with the model's shape, its target languages (``"tgt_langs"``: a
  multilingual model's, as its tokens spell them, ``["deu", "fra"]``; ``[]`` for a model of one target language) and
  the default one (``"tgt_lang"``, spelt the same way; null: none), the decoding defaults, the limits and the
  batching counters.
* ``GET /`` -> the page (``transduce/static/index.html``: plain HTML/CSS/JS, no build step, nothing loaded from
  elsewhere): type a sentence (and, for a multilingual model, choose the target language), read its translation,
  choose a layer and head of the attention, hover a target piece to see the source pieces it attended to.

Design. One :class:`transduce.search.translator.Translator` serves every request. Requests from many clients are merged
by a :class:`transduce.serving.batching.Batcher` on the event loop (the batching core, without HTTP): it collects
requests for up to ``batch_wait_ms`` (or until ``max_batch_sentences``), makes ONE ``translate`` call per set of
decoding options in a single inference thread, and hands each request its own slice of the results. ``/attention`` runs
in the same inference thread, one sentence at a time. The request-body limit and :class:`ServerThread` are in
:mod:`transduce.serving.asgi`.

Limits and errors (every error is JSON with a one-line ``"error"``; the server keeps serving after each):

* 413: more than ``max_sentences`` sentences, a sentence of more than ``max_chars`` characters, or a request body
  of more than ``max_body_bytes`` bytes (by its ``Content-Length`` and by what actually arrives, so a chunked body
  is caught too); for ``/attention`` also a source or target of more than ``max_attention_tokens`` subword pieces,
  or an answer of more than ``max_attention_values`` values (layers x heads x target x source pieces), counted
  before the attention is computed (and before the translation, for the source).
* 422: a body that is not sent as JSON (``Content-Type: application/json``) or is not UTF-8, malformed JSON, a
  missing field, a wrong type, an unknown option or a value out of range (beam 1 .. ``max_beam``), a ``tgt_lang``
  that is malformed, not the model's or missing where the model needs one; ``"detail"``
  holds the validation errors as FastAPI reports them, ``"error"`` sums them up in one line.
* 500: an exception while translating (logged with its traceback).

An empty (or blank) sentence translates to an empty string, in place, without running the model.
"""

import functools
import logging
import time
from dataclasses import asdict
from importlib import resources
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from transduce.config import ConfigError, LengthNorm
from transduce.serving.app import ErrorResponse, ValidationErrorResponse, base_app, check_limits, too_long, too_many
from transduce.serving.asgi import ServerThread, json_error
from transduce.serving.batching import Batcher, BatchStats
from transduce.text.langs import TOKEN, LanguageError, check_code

log = logging.getLogger(__name__)

SAMPLING_ONLY = ("temperature", "top_k", "top_p", "seed")  # request options that only sampling reads

__all__ = ["BatchStats", "Batcher", "ServerThread", "create_app", "serve"]


# ----------------------------------------------------------------------------------------------------------------------
# request and response bodies


class Hypothesis(BaseModel):
    """One of the n best translations of a sentence."""

    text: str
    score: float = Field(description="the search's ranking score (length-penalised log-probability)")
    log_prob: float = Field(description="sum of the log-probabilities of the output tokens and EOS")


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="one translation per input sentence, in input order")
    nbest: list[list[Hypothesis]] | None = Field(
        None, description="only when the request asked for nbest: the n best translations of each sentence"
    )


class AttentionResponse(BaseModel):
    translation: str = Field(description="the translation the attention belongs to (the given target, if any)")
    src_pieces: list[str] = Field(description="source subword pieces, EOS included (S)")
    tgt_pieces: list[str] = Field(description="the target piece predicted at each decoder position, EOS included (T)")
    layers: int
    heads: int
    cross: list[list[list[list[float]]]] = Field(
        description="encoder-decoder attention [layer][head][t][s], rounded to 4 decimals; each row sums to 1"
    )


class HealthResponse(BaseModel):
    status: str = Field(description='"ok"')
    task: str = Field(description="what the model was trained for (data.task: translate or parse)")
    model: dict[str, Any] = Field(
        description="the model's shape (an ensemble's first member's, and \"ensemble\": its size)"
    )
    tgt_langs: list[str] = Field(
        description="a multilingual model's target languages, as its tokens spell them (deu, fra, ...); empty for a "
        "model of one target language (a request then names none)"
    )
    tgt_lang: str | None = Field(
        description="the target language a request that names none gets (the server's --tgt-lang, else the run's "
        "decode.tgt_lang), spelt as in tgt_langs; null: none (a multilingual model's requests must name one)"
    )
    decode: dict[str, Any] = Field(description="the decoding defaults (DecodeConfig)")
    limits: dict[str, Any]
    stats: dict[str, Any] = Field(description="batching counters since the server started")
    uptime_s: float


def _request_models(max_beam: int) -> tuple[type[BaseModel], type[BaseModel]]:
    """The request bodies, with this server's beam limit in their schema. Strict: "4" is not a beam size."""

    class TranslateRequest(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")

        sentences: list[str] = Field(description="source sentences; an empty one translates to an empty string")
        beam: int | None = Field(None, ge=1, le=max_beam, description="beam size; 1 is greedy")
        length_penalty: float | None = Field(None, ge=0, allow_inf_nan=False, description="penalty alpha; 0: off")
        length_norm: LengthNorm | None = Field(
            None, description="the penalty: gnmt ((5 + |Y|) / 6) ** alpha, or length |Y| ** alpha (fairseq's)"
        )
        max_len_a: float | None = Field(None, ge=0, le=4, allow_inf_nan=False, description="max length = a*S + b")
        max_len_b: int | None = Field(None, ge=0, le=512)
        min_len: int | None = Field(None, ge=0, le=512, description="no EOS before this many tokens")
        no_repeat_ngram: int | None = Field(None, ge=0, le=16, description="block repeated n-grams of this size")
        nbest: int | None = Field(
            None, ge=1, le=max_beam, description="also return the n best translations with scores (widens the beam)"
        )
        sampling: bool | None = Field(None, description="sample instead of searching (nbest: the samples)")
        temperature: float | None = Field(None, gt=0, le=100, allow_inf_nan=False, description="sampling only")
        top_k: int | None = Field(None, ge=0, description="sampling only: from the k most likely tokens; 0: all")
        top_p: float | None = Field(None, gt=0, le=1, description="sampling only: nucleus sampling's mass")
        seed: int | None = Field(
            None, ge=0, lt=2**64, description="sampling only: the same seed gives a sentence the same samples"
        )
        tgt_lang: str | None = Field(
            None, max_length=32, description="a multilingual model's target language (fr or fra; default: the server's)"
        )

    class AttentionRequest(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")

        sentence: str = Field(description="the source sentence")
        target: str | None = Field(None, description="its translation (default: the model's, with these options)")
        beam: int | None = Field(None, ge=1, le=max_beam)
        length_penalty: float | None = Field(None, ge=0, allow_inf_nan=False)
        length_norm: LengthNorm | None = None
        tgt_lang: str | None = Field(None, max_length=32, description="a multilingual model's target language")

    return TranslateRequest, AttentionRequest


# ----------------------------------------------------------------------------------------------------------------------
# the application


def create_app(
    translator: Any,
    *,
    max_sentences: int = 64,
    max_chars: int = 1000,
    max_body_bytes: int = 1_000_000,
    batch_wait_ms: float = 5.0,
    max_batch_sentences: int = 256,
    max_beam: int = 16,
    max_attention_tokens: int = 256,
    max_attention_values: int = 1_000_000,
) -> FastAPI:
    """The FastAPI application serving ``translator`` (a :class:`transduce.search.translator.Translator`).

    Args:
        max_sentences: most sentences in one request (413 beyond).
        max_chars: most characters in one sentence (413 beyond).
        max_body_bytes: largest request body (413 beyond).
        batch_wait_ms: the batching window: how long to wait for more requests after the first one.
        max_batch_sentences: most sentences collected into one batch.
        max_beam: largest beam (and nbest) a request may ask for (422 beyond).
        max_attention_tokens: /attention: most subword pieces of the source and of the target, EOS included (413
            beyond; characters are not enough: byte fallback makes an emoji 4 pieces).
        max_attention_values: /attention: most attention values in an answer, layers x heads x target x source
            pieces (413 beyond; about 8 bytes of JSON each).
    """
    check_limits(max_sentences=max_sentences, max_chars=max_chars, max_body_bytes=max_body_bytes,
                 max_attention_tokens=max_attention_tokens, max_attention_values=max_attention_values,
                 max_beam=max_beam)  # fmt: skip
    limits = {
        "max_sentences": max_sentences,
        "max_chars": max_chars,
        "max_body_bytes": max_body_bytes,
        "max_beam": max_beam,
        "batch_wait_ms": batch_wait_ms,
        "max_batch_sentences": max_batch_sentences,
        "max_attention_tokens": max_attention_tokens,
        "max_attention_values": max_attention_values,
    }
    model_info = _model_info(translator)
    page = resources.files("transduce.serving").joinpath("static/index.html").read_text(encoding="utf-8")
    TranslateRequest, AttentionRequest = _request_models(max_beam)

    def translate_batch(sentences: list[str], options: dict[str, Any]) -> list[Any]:
        options = dict(options)
        nbest = options.pop("nbest", None)
        if nbest is None:
            return translator.translate(sentences, **options)
        return translator.translate_nbest(sentences, nbest=nbest, **options)

    batcher = Batcher(translate_batch, wait_ms=batch_wait_ms, max_batch_sentences=max_batch_sentences)
    started = time.monotonic()
    app = base_app(batcher, "Transformer machine translation with dynamic batching", max_body_bytes)
    app.state.translator = translator

    def check_options(options: dict[str, Any]) -> JSONResponse | None:
        """422 if DecodeConfig rejects the options as the request will use them (``Translator.search_config``), or
        if sampling options come without sampling (they would change nothing). The request models already check
        every field's type and range."""
        options = dict(options)
        tgt_lang = options.pop("tgt_lang", None)
        try:
            cfg = translator.search_config(**options)
            if hasattr(translator, "language_ids"):  # a missing, malformed or unknown target language: 422
                translator.language_ids(tgt_lang, 1, cfg)
            unused = [name for name in SAMPLING_ONLY if name in options]
            if not unused or cfg.sampling:
                return None
            message = f'{unused[0]}: applies to sampling only, and this search does not sample (add "sampling": true)'
        except (ConfigError, LanguageError) as e:
            message = str(e)
        detail = [{"type": "value_error", "loc": ["body"], "msg": message, "input": options}]
        return JSONResponse({"error": message, "detail": detail}, status_code=422)

    def attention_size(sentence: str, target: str | None) -> str | None:
        """Why the attention of ``sentence`` and ``target`` (None: not known yet) is too large to answer, or None:
        the pieces :meth:`Translator.attention` would draw, counted with the translator's own tokenizer."""
        token = 1 if getattr(translator, "languages", None) else 0  # a multilingual model's target-language token
        source = min(len(translator.tokenizer.encode_src(sentence)) + token, translator.max_input_tokens) + 1
        if source > max_attention_tokens:
            return f"sentence has {source} source pieces (EOS included) > max_attention_tokens {max_attention_tokens}"
        if target is None:
            return None
        pieces = len(translator.tokenizer.encode_tgt(target)) + 1
        if pieces > max_attention_tokens:
            return f"target has {pieces} target pieces (EOS included) > max_attention_tokens {max_attention_tokens}"
        cfg = translator.model.config
        values = cfg.decoder_layers * cfg.heads * pieces * source
        if values > max_attention_values:
            return (f"the attention of {cfg.decoder_layers} layers x {cfg.heads} heads x {pieces} target x {source} "
                    f"source pieces is {values} values > max_attention_values {max_attention_values}")  # fmt: skip
        return None

    errors = {413: {"model": ErrorResponse}, 422: {"model": ValidationErrorResponse}, 500: {"model": ErrorResponse}}

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True, responses=errors)
    async def translate(body: TranslateRequest) -> Any:  # type: ignore[valid-type]
        """Translate sentences (one translation per sentence, in input order); requests are batched together."""
        sentences: list[str] = body.sentences  # type: ignore[attr-defined]
        named = ((f"sentence {i}", s) for i, s in enumerate(sentences, start=1))
        if too_large := too_many("sentences", len(sentences), max_sentences) or too_long(named, max_chars):
            return too_large
        options = body.model_dump(exclude={"sentences"}, exclude_none=True)  # type: ignore[attr-defined]
        if bad := check_options(options):
            return bad
        try:
            results = await batcher.submit(sentences, options)
        except Exception as e:
            log.exception("translation failed")
            return json_error(500, f"translation failed: {type(e).__name__}: {e}")
        if "nbest" not in options:
            return TranslateResponse(translations=results)
        nbest = [[Hypothesis(text=t.text, score=t.score, log_prob=t.log_prob) for t in r] for r in results]
        return TranslateResponse(translations=[r[0].text for r in results], nbest=nbest)

    @app.post("/attention", response_model=AttentionResponse, responses=errors)
    async def attention(body: AttentionRequest) -> Any:  # type: ignore[valid-type]
        """The encoder-decoder attention of one sentence and its translation (or the given target)."""
        sentence, target = body.sentence, body.target  # type: ignore[attr-defined]
        texts = [("sentence", sentence)] + ([("target", target)] if target is not None else [])
        if too_large := too_long(texts, max_chars):
            return too_large
        options = body.model_dump(exclude={"sentence", "target"}, exclude_none=True)  # type: ignore[attr-defined]
        if bad := check_options(options):
            return bad
        try:
            if too_large := await batcher.call(attention_size, sentence, target):
                return json_error(413, too_large)
            if target is None:  # the translation /translate gives, with the same options (and batched with it)
                target = (await batcher.submit([sentence], options))[0]
                if too_large := await batcher.call(attention_size, sentence, target):
                    return json_error(413, too_large)
            lang = {"tgt_lang": options["tgt_lang"]} if "tgt_lang" in options else {}
            maps = await batcher.call(functools.partial(translator.attention, **lang), sentence, target)
        except ConfigError as e:  # an ensemble: no one model's attention to show
            return json_error(400, str(e))
        except Exception as e:
            log.exception("attention failed")
            return json_error(500, f"attention failed: {type(e).__name__}: {e}")
        return AttentionResponse(
            translation=target,
            src_pieces=maps.src_pieces,
            tgt_pieces=maps.tgt_out_pieces,
            layers=maps.cross.shape[0],
            heads=maps.cross.shape[1],
            cross=maps.cross.double().round(decimals=4).tolist(),
        )

    @app.post("/classify", include_in_schema=False)
    async def classify() -> JSONResponse:
        task = getattr(translator, "task", "translate")
        what = {"translate": "translation", "parse": "parsing"}.get(task, task)
        return json_error(404, f"this server serves a {what} model (data.task: {task}): POST /translate; /classify "
                               "needs a classifier (data.task: classify)")  # fmt: skip

    @app.get("/health", response_model=HealthResponse)
    async def health() -> Any:
        """Liveness, the task, the model, the decoding defaults, the limits and the batching counters."""
        return HealthResponse(
            status="ok",
            task=getattr(translator, "task", "translate"),
            model=model_info,
            **_target_languages(translator),
            decode=translator.decode.to_dict(),
            limits=limits,
            stats=asdict(batcher.stats),
            uptime_s=round(time.monotonic() - started, 3),
        )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    return app


def _target_languages(translator: Any) -> dict[str, Any]:
    """``tgt_langs`` and ``tgt_lang`` for /health: the model's target-language codes as its tokens spell them
    (``>>fra<<`` -> ``fra``), and the default (``decode.tgt_lang``, read now: ``serve`` sets it after loading) as its
    token spells it (``fr`` -> ``fra``), or None."""
    languages = getattr(translator, "languages", None)
    if not languages:
        return {"tgt_langs": [], "tgt_lang": None}
    default = None
    if code := getattr(getattr(translator, "decode", None), "tgt_lang", ""):
        try:
            token = languages.find(check_code(code))
        except LanguageError:
            token = None
        default = TOKEN.fullmatch(token).group(1) if token else None  # type: ignore[union-attr]
    return {"tgt_langs": languages.codes(), "tgt_lang": default}


def _model_info(translator: Any) -> dict[str, Any]:
    model = getattr(translator, "model", None)
    config = getattr(model, "config", None)
    info: dict[str, Any] = {}
    for name in ("src_vocab_size", "tgt_vocab_size", "encoder_layers", "decoder_layers", "heads", "d_model", "d_ff"):
        if hasattr(config, name):
            info[name] = getattr(config, name)
    if model is not None and hasattr(model, "parameters"):
        info["parameters"] = sum(p.numel() for p in model.parameters())  # (an ensemble's: all its members')
    if len(getattr(model, "members", ())) > 1:
        info["ensemble"] = len(model.members)  # type: ignore[union-attr]  (the shape above is the first member's)
    if hasattr(translator, "device"):
        info["device"] = str(translator.device)
    return info


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    device: str = "cpu",
    translator: Any = None,
    classifier: Any = None,
    access_log: bool = True,
    **options: Any,
) -> None:
    """Load a model and serve it until interrupted (Ctrl-C: a graceful shutdown).

    Args:
        model_path: run directory or checkpoint (ignored when ``translator`` or ``classifier`` is given); a
            classifier's (``data.task: classify``) is served by
            :func:`transduce.transfer.classify.serve.create_classifier_app`.
        translator: an already loaded translator.
        classifier: an already loaded :class:`transduce.transfer.classify.Classifier`.
        access_log: log one line per request.
        options: :func:`create_app`'s (or ``create_classifier_app``'s) limits and batching settings.
    """
    if translator is None and classifier is None:
        from transduce.transfer.classify import Classifier, is_classifier

        if is_classifier(model_path):
            classifier = Classifier.load(model_path, device)
        else:
            from transduce.search.translator import Translator

            translator = Translator.load(model_path, device)
    if classifier is not None:
        from transduce.transfer.classify.serve import create_classifier_app

        app = create_classifier_app(classifier, **options)
    else:
        app = create_app(translator, **options)
    config = uvicorn.Config(app, host=host, port=port, access_log=access_log, log_config=None, log_level="info")
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    what = "API documentation" if classifier is not None else "the page; API documentation"
    log.info("serving %s on http://%s:%d/ (%s at /docs)", model_path, shown, port, what)
    server.run()
    log.info("stopped")
