"""The HTTP API of a classifier: what ``transduce serve --model RUN`` answers when RUN is a classifier.

    app = create_classifier_app(Classifier.load("runs/movie_reviews_finetune"))
    with ServerThread(app) as url:
        httpx.post(url + "/classify", json={"texts": ["A gripping, funny film."]}).json()
        # {'labels': ['positive'], 'probabilities': [{'negative': 0.03, 'positive': 0.97}]}

Endpoints (OpenAPI schema at ``/openapi.json``, documentation at ``/docs``):

* ``POST /classify`` ``{"texts": [...]}`` (a classifier of sentence pairs: also ``"texts2": [...]``, the second text
  of each pair) -> ``{"labels": [...], "probabilities": [{label: p, ...}, ...]}``, one of each per text in input
  order: :meth:`Classifier.classify <transduce.transfer.classify.Classifier.classify>`'s answers.
* ``GET /health`` -> ``{"status": "ok", "task": "classify", "labels": [...], ...}`` with the model's shape, the
  limits and the batching counters.
* ``POST /translate``, ``POST /attention`` and ``GET /`` (the translation page): 404, with an ``"error"`` line saying
  that this server serves a classifier.

Requests are merged by the :class:`transduce.serving.batching.Batcher` as translation requests are
(:mod:`transduce.serving.server`, which also gives the body limit and the error shapes). Errors are JSON with a one-line
``"error"``: 413 for more than ``max_sentences`` texts, a text of more than ``max_chars`` characters or a body of more
than ``max_body_bytes`` bytes; 422 for malformed JSON, a wrong type, an empty text, or ``texts2`` missing for a
classifier of pairs, given to one of single texts, or of another length than ``texts``; 500 for an exception while
classifying.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from transduce.serving.app import ErrorResponse, ValidationErrorResponse, base_app, check_limits, too_long, too_many
from transduce.serving.asgi import json_error
from transduce.serving.batching import Batcher

log = logging.getLogger(__name__)


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    texts: list[str] = Field(description="the texts to classify (none may be empty)")
    texts2: list[str] | None = Field(
        None, description="a classifier of sentence pairs: the second text of each pair, one per text"
    )


class ClassifyResponse(BaseModel):
    labels: list[str] = Field(description="the most probable label of each text, in input order")
    probabilities: list[dict[str, float]] = Field(description="each text's probability of every label")


class ClassifierHealthResponse(BaseModel):
    status: str = Field(description='"ok"')
    task: str = Field(description='"classify"')
    labels: list[str] = Field(description="the classes, in the order of the model's outputs")
    pairs: bool = Field(description="whether the classifier reads sentence pairs (texts and texts2)")
    model: dict[str, Any] = Field(description="the model's shape")
    limits: dict[str, Any]
    stats: dict[str, Any] = Field(description="batching counters since the server started")
    uptime_s: float


def create_classifier_app(
    classifier: Any,
    *,
    max_sentences: int = 64,
    max_chars: int = 1000,
    max_body_bytes: int = 1_000_000,
    batch_wait_ms: float = 5.0,
    max_batch_sentences: int = 256,
) -> FastAPI:
    """The FastAPI application serving ``classifier`` (a :class:`transduce.transfer.classify.Classifier`).

    Args:
        max_sentences: most texts in one request (413 beyond).
        max_chars: most characters in one text (413 beyond).
        max_body_bytes: largest request body (413 beyond).
        batch_wait_ms: the batching window: how long to wait for more requests after the first one.
        max_batch_sentences: most texts collected into one batch.
    """
    check_limits(max_sentences=max_sentences, max_chars=max_chars, max_body_bytes=max_body_bytes)
    limits = {"max_sentences": max_sentences, "max_chars": max_chars, "max_body_bytes": max_body_bytes,
              "batch_wait_ms": batch_wait_ms, "max_batch_sentences": max_batch_sentences}  # fmt: skip

    def classify_batch(items: list[Any], options: dict[str, Any]) -> list[Any]:
        if classifier.pairs:  # the items are (text, text2) pairs
            return classifier.classify([a for a, _ in items], [b for _, b in items])
        return classifier.classify(items)

    batcher = Batcher(classify_batch, wait_ms=batch_wait_ms, max_batch_sentences=max_batch_sentences)
    started = time.monotonic()
    app = base_app(batcher, "sentence classification with transduce's Transformer encoder", max_body_bytes)
    app.state.classifier = classifier
    model_info = _model_info(classifier)
    errors = {413: {"model": ErrorResponse}, 422: {"model": ValidationErrorResponse}, 500: {"model": ErrorResponse}}

    @app.post("/classify", response_model=ClassifyResponse, responses=errors)
    async def classify(body: ClassifyRequest) -> Any:
        """Classify texts (one label and one set of probabilities per text, in input order); requests are batched
        together."""
        texts, texts2 = body.texts, body.texts2
        named = ((f"{name}[{i}]", text) for name, given in (("texts", texts), ("texts2", texts2 or []))
                 for i, text in enumerate(given))  # fmt: skip
        if too_large := too_many("texts", len(texts), max_sentences) or too_long(named, max_chars):
            return too_large
        if problem := _problem(classifier, texts, texts2):
            loc, message = problem
            detail = [{"type": "value_error", "loc": ["body", *loc], "msg": message}]
            return JSONResponse({"error": message, "detail": detail}, status_code=422)
        items = list(zip(texts, texts2, strict=True)) if texts2 is not None else texts
        try:
            results = await batcher.submit(items)
        except Exception as e:
            log.exception("classification failed")
            return json_error(500, f"classification failed: {type(e).__name__}: {e}")
        return ClassifyResponse(labels=[r.label for r in results], probabilities=[r.probabilities for r in results])

    @app.get("/health", response_model=ClassifierHealthResponse)
    async def health() -> Any:
        """Liveness, the task and labels, the model, the limits and the batching counters."""
        return ClassifierHealthResponse(
            status="ok",
            task="classify",
            labels=classifier.labels,
            pairs=classifier.pairs,
            model=model_info,
            limits=limits,
            stats=asdict(batcher.stats),
            uptime_s=round(time.monotonic() - started, 3),
        )

    def not_here() -> JSONResponse:
        return json_error(404, "this server serves a classifier (data.task: classify): POST /classify; /translate, "
                               "/attention and the page need a translation model")  # fmt: skip

    app.add_api_route("/translate", not_here, methods=["POST"], include_in_schema=False)
    app.add_api_route("/attention", not_here, methods=["POST"], include_in_schema=False)
    app.add_api_route("/", not_here, methods=["GET"], include_in_schema=False)
    return app


def _problem(classifier: Any, texts: list[str], texts2: list[str] | None) -> tuple[list[Any], str] | None:
    """``(location, message)`` of what makes a request unanswerable (the checks of ``Classifier.classify``), or
    None."""
    if classifier.pairs and texts2 is None:
        return ["texts2"], "this classifier reads sentence pairs: give texts2, the second text of each pair"
    if not classifier.pairs and texts2 is not None:
        return ["texts2"], "this classifier reads single texts: leave texts2 out"
    if texts2 is not None and len(texts2) != len(texts):
        return ["texts2"], f"texts2: {len(texts2)} second texts for {len(texts)} texts"
    for name, given in (("texts", texts), ("texts2", texts2 or [])):
        for i, text in enumerate(given):
            if not text.strip():
                return [name, i], f"{name}[{i}] is empty: an empty text has no class"
    return None


def _model_info(classifier: Any) -> dict[str, Any]:
    config = classifier.model.config
    info = {name: getattr(config, name) for name in ("src_vocab_size", "encoder_layers", "heads", "d_model", "d_ff",
                                                     "pooling", "transfer")}  # fmt: skip
    info["parameters"] = sum(p.numel() for p in classifier.model.parameters())
    info["device"] = str(classifier.device)
    return info


__all__ = ["create_classifier_app"]
