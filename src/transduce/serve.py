"""An HTTP translation server: a JSON API with dynamic batching, and a web page to explore attention.

    transduce serve --model runs/multi30k --port 8000          # then open http://127.0.0.1:8000/

    app = create_app(Translator.load("runs/multi30k"))          # a FastAPI app, for any ASGI server
    with ServerThread(app) as url:                              # uvicorn in a background thread, on a free port
        httpx.post(url + "/translate", json={"sentences": ["A dog."]}).json()   # {'translations': ['Ein Hund.']}

Endpoints (the OpenAPI schema is at ``/openapi.json``, interactive documentation at ``/docs``):

* ``POST /translate`` ``{"sentences": [...], "beam": 4, "length_penalty": 0.6, ...}`` ->
  ``{"translations": [...]}``, one per sentence in input order (``"nbest": K`` adds the K best with scores).
  Options that are left out or ``null`` take the server's defaults (the run's decoding configuration).
* ``POST /attention`` ``{"sentence": "...", "target": null, "beam": ..., "length_penalty": ...}`` -> the
  translation, the source and target subword pieces and the encoder-decoder attention
  ``cross[layer][head][target piece][source piece]``.
* ``GET /health`` -> ``{"status": "ok", ...}`` with the model's shape, the decoding defaults, the limits and the
  batching counters.
* ``GET /`` -> the page (``transduce/static/index.html``: plain HTML/CSS/JS, no build step, nothing loaded from
  elsewhere): type a sentence, read its translation, choose a layer and head of the attention, hover a target
  piece to see the source pieces it attended to.

Design. One :class:`transduce.translate.Translator` serves every request, and the model runs in a single inference
thread (torch already parallelises each operation over its intra-op threads; two batches at once would only compete
for the same cores). Requests from many clients are merged by a :class:`Batcher` on the event loop: a request's
sentences are queued with a future; the worker takes the first queued request, keeps collecting for up to
``batch_wait_ms`` (or until ``max_batch_sentences``), groups the requests by their decoding options and makes ONE
``translate`` call per group in the inference thread, then hands each request its own slice of the results. Under
load the window hardly matters: requests that arrive while a batch is being translated are all taken together by
the next one. A group whose call fails is retried request by request, so that only the request at fault gets the
error. ``/attention`` runs in the same inference thread, one sentence at a time.

Limits and errors (every error is JSON with a one-line ``"error"``; the server keeps serving after each):

* 413: more than ``max_sentences`` sentences, a sentence of more than ``max_chars`` characters, or a request body
  of more than ``max_body_bytes`` bytes (by its ``Content-Length`` and by what actually arrives, so a chunked body
  is caught too).
* 422: malformed JSON, a missing field, a wrong type, an unknown option or a value out of range (beam 1 ..
  ``max_beam``); ``"detail"`` holds the validation errors as FastAPI reports them, ``"error"`` sums them up.
* 500: an exception while translating (logged with its traceback).

An empty (or blank) sentence translates to an empty string, in place, without running the model.
"""

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transduce.config import ConfigError, LengthNorm

log = logging.getLogger(__name__)

__all__ = ["BatchStats", "Batcher", "ServerThread", "create_app", "serve"]


# ----------------------------------------------------------------------------------------------------------------------
# dynamic batching


@dataclass
class BatchStats:
    """Counters of a :class:`Batcher` (read on the event loop; shown by ``GET /health``).

    Attributes:
        requests: requests submitted (requests with no sentences never reach the batcher).
        sentences: sentences submitted.
        batches: collection windows closed (each gives one call per distinct set of decoding options).
        calls: calls of the translation function, retries of a failed group included.
        largest_call: the most sentences given to one call.
        failed_calls: calls that raised.
        busy_s: seconds spent in calls (wall clock).
    """

    requests: int = 0
    sentences: int = 0
    batches: int = 0
    calls: int = 0
    largest_call: int = 0
    failed_calls: int = 0
    busy_s: float = 0.0


@dataclass
class _Job:
    sentences: list[str]
    key: tuple[tuple[str, Any], ...]
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Merges the sentences of concurrent requests into few calls of a blocking translation function.

    Args:
        fn: ``fn(sentences, options) -> results``, one result per sentence in order; blocking (it runs in the
            inference thread). Requests with equal ``options`` (a dict of hashable values) share a call.
        wait_ms: how long to keep collecting after the first request of a batch arrives.
        max_batch_sentences: stop collecting once a batch holds this many sentences (a batch may exceed it by
            less than one request).

    Use from one event loop: ``await start()``, then ``await submit(sentences, options)`` from any number of
    tasks, ``await stop()`` at the end. :meth:`call` runs any other function in the same inference thread.
    """

    def __init__(
        self,
        fn: Callable[[list[str], dict[str, Any]], Sequence[Any]],
        *,
        wait_ms: float = 5.0,
        max_batch_sentences: int = 256,
    ) -> None:
        if wait_ms < 0:
            raise ValueError(f"wait_ms must be >= 0, got {wait_ms}")
        if max_batch_sentences < 1:
            raise ValueError(f"max_batch_sentences must be >= 1, got {max_batch_sentences}")
        self.fn = fn
        self.wait = wait_ms / 1000.0
        self.max_batch_sentences = max_batch_sentences
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Job] | None = None
        self._getter: asyncio.Future[_Job] | None = None  # a pending queue.get() kept across windows: loses nothing
        self._worker: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._unanswered: set[asyncio.Future] = set()  # futures of submitted requests, until answered

    async def start(self) -> None:
        """Start the worker task and the inference thread (on the running event loop)."""
        if self._worker is not None:
            raise RuntimeError("the batcher is already running")
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transduce-inference")
        self._worker = asyncio.create_task(self._run(), name="transduce-batcher")

    async def stop(self) -> None:
        """Stop the worker; requests still queued fail with ``RuntimeError``. Waits for a running call to end."""
        if self._worker is None:
            return
        self._worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._worker
        if self._getter is not None:
            self._getter.cancel()
        for future in list(self._unanswered):  # queued, being collected or being translated
            if not future.done():
                future.set_exception(RuntimeError("the server is shutting down"))
        assert self._executor is not None
        self._executor.shutdown(wait=True)
        self._worker = self._getter = self._queue = self._executor = None

    async def submit(self, sentences: list[str], options: dict[str, Any] | None = None) -> list[Any]:
        """Queue a request and wait for its results (one per sentence, in order)."""
        if not sentences:
            return []
        if self._queue is None:
            raise RuntimeError("the batcher is not running (call start() first)")
        options = options or {}
        job = _Job(list(sentences), tuple(sorted(options.items())), asyncio.get_running_loop().create_future())
        self.stats.requests += 1
        self.stats.sentences += len(job.sentences)
        self._unanswered.add(job.future)
        job.future.add_done_callback(self._unanswered.discard)
        self._queue.put_nowait(job)
        return await job.future

    def call(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """Run ``fn(*args)`` in the inference thread (after the call running now) and await its result."""
        if self._executor is None:
            raise RuntimeError("the batcher is not running (call start() first)")
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ------------------------------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            jobs = await self._collect()
            self.stats.batches += 1
            groups: dict[tuple, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            for key, group in groups.items():
                await self._translate(dict(key), group)

    async def _collect(self) -> list[_Job]:
        """The first queued request, plus whatever arrives within the window (up to ``max_batch_sentences``)."""
        first = await self._next(None)
        assert first is not None
        jobs, count = [first], len(first.sentences)
        deadline = asyncio.get_running_loop().time() + self.wait
        while count < self.max_batch_sentences:
            job = self._next_nowait()
            if job is None:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                job = await self._next(remaining)
                if job is None:
                    break
            jobs.append(job)
            count += len(job.sentences)
        return jobs

    async def _next(self, timeout: float | None) -> _Job | None:
        assert self._queue is not None
        if self._getter is None:
            self._getter = asyncio.ensure_future(self._queue.get())
        done, _ = await asyncio.wait({self._getter}, timeout=timeout)
        if not done:
            return None  # the getter stays pending and brings the next request to the next window
        job, self._getter = self._getter.result(), None
        return job

    def _next_nowait(self) -> _Job | None:
        assert self._queue is not None
        if self._getter is not None:
            if not self._getter.done():
                return None  # queue empty (a waiting getter means nothing was left to take)
            job, self._getter = self._getter.result(), None
            return job
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def _translate(self, options: dict[str, Any], jobs: list[_Job]) -> None:
        jobs = [j for j in jobs if not j.future.done()]  # a cancelled request (client gone) is not translated
        if not jobs:
            return
        sentences = [s for j in jobs for s in j.sentences]
        self.stats.calls += 1
        self.stats.largest_call = max(self.stats.largest_call, len(sentences))
        began = time.perf_counter()
        try:
            results = await self.call(self.fn, sentences, options)
            if len(results) != len(sentences):
                raise RuntimeError(f"the translation function returned {len(results)} results for {len(sentences)}")
        except Exception as e:
            self.stats.busy_s += time.perf_counter() - began
            self.stats.failed_calls += 1
            if len(jobs) > 1:  # find the request at fault: each alone
                for job in jobs:
                    await self._translate(options, [job])
            elif not jobs[0].future.done():
                jobs[0].future.set_exception(e)
            return
        self.stats.busy_s += time.perf_counter() - began
        start = 0
        for job in jobs:
            end = start + len(job.sentences)
            if not job.future.done():
                job.future.set_result(list(results[start:end]))
            start = end


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
    model: dict[str, Any] = Field(description="the model's shape")
    decode: dict[str, Any] = Field(description="the decoding defaults (DecodeConfig)")
    limits: dict[str, Any]
    stats: dict[str, Any] = Field(description="batching counters since the server started")
    uptime_s: float


class ErrorResponse(BaseModel):
    error: str = Field(description="what is wrong, in one line")


class ValidationErrorResponse(ErrorResponse):
    detail: list[dict[str, Any]] = Field(description="the validation errors (FastAPI's format)")


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

    class AttentionRequest(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")

        sentence: str = Field(description="the source sentence")
        target: str | None = Field(None, description="its translation (default: the model's, with these options)")
        beam: int | None = Field(None, ge=1, le=max_beam)
        length_penalty: float | None = Field(None, ge=0, allow_inf_nan=False)
        length_norm: LengthNorm | None = None

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
) -> FastAPI:
    """The FastAPI application serving ``translator`` (a :class:`transduce.translate.Translator`).

    Args:
        max_sentences: most sentences in one request (413 beyond).
        max_chars: most characters in one sentence (413 beyond).
        max_body_bytes: largest request body (413 beyond).
        batch_wait_ms: the batching window: how long to wait for more requests after the first one.
        max_batch_sentences: most sentences collected into one batch.
        max_beam: largest beam (and nbest) a request may ask for (422 beyond).
    """
    positive = [("max_sentences", max_sentences), ("max_chars", max_chars), ("max_body_bytes", max_body_bytes)]
    for name, value in [*positive, ("max_beam", max_beam)]:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    limits = {
        "max_sentences": max_sentences,
        "max_chars": max_chars,
        "max_body_bytes": max_body_bytes,
        "max_beam": max_beam,
        "batch_wait_ms": batch_wait_ms,
        "max_batch_sentences": max_batch_sentences,
    }
    model_info = _model_info(translator)
    page = resources.files("transduce").joinpath("static/index.html").read_text(encoding="utf-8")
    TranslateRequest, AttentionRequest = _request_models(max_beam)

    def translate_batch(sentences: list[str], options: dict[str, Any]) -> list[Any]:
        options = dict(options)
        nbest = options.pop("nbest", None)
        if nbest is None:
            return translator.translate(sentences, **options)
        return translator.translate_nbest(sentences, nbest=nbest, **options)

    batcher = Batcher(translate_batch, wait_ms=batch_wait_ms, max_batch_sentences=max_batch_sentences)
    started = time.monotonic()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(
        title="transduce",
        summary="Transformer machine translation with dynamic batching",
        version=_version(),
        lifespan=lifespan,
    )
    app.state.batcher = batcher
    app.state.translator = translator
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)

    def check_options(options: dict[str, Any]) -> JSONResponse | None:
        """422 if DecodeConfig rejects the options as the request will use them (``Translator.search_config``). The
        request models already check every field's type and range, so this is a guard for DecodeConfig rules they
        do not repeat (none at present)."""
        try:
            translator.search_config(**options)
            return None
        except ConfigError as e:
            message = str(e)
        detail = [{"type": "value_error", "loc": ["body"], "msg": message, "input": options}]
        return JSONResponse({"error": message, "detail": detail}, status_code=422)

    def check_sizes(sentences: list[tuple[str, str]]) -> JSONResponse | None:
        for what, text in sentences:
            if len(text) > max_chars:
                return _error(413, f"{what} is too long: {len(text)} characters > max_chars {max_chars}")
        return None

    errors = {413: {"model": ErrorResponse}, 422: {"model": ValidationErrorResponse}, 500: {"model": ErrorResponse}}

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True, responses=errors)
    async def translate(body: TranslateRequest) -> Any:  # type: ignore[valid-type]
        """Translate sentences (one translation per sentence, in input order); requests are batched together."""
        sentences: list[str] = body.sentences  # type: ignore[attr-defined]
        if len(sentences) > max_sentences:
            return _error(413, f"too many sentences: {len(sentences)} > max_sentences {max_sentences}")
        if too_long := check_sizes([(f"sentence {i}", s) for i, s in enumerate(sentences, start=1)]):
            return too_long
        options = body.model_dump(exclude={"sentences"}, exclude_none=True)  # type: ignore[attr-defined]
        if bad := check_options(options):
            return bad
        try:
            results = await batcher.submit(sentences, options)
        except Exception as e:
            log.exception("translation failed")
            return _error(500, f"translation failed: {type(e).__name__}: {e}")
        if "nbest" not in options:
            return TranslateResponse(translations=results)
        nbest = [[Hypothesis(text=t.text, score=t.score, log_prob=t.log_prob) for t in r] for r in results]
        return TranslateResponse(translations=[r[0].text for r in results], nbest=nbest)

    @app.post("/attention", response_model=AttentionResponse, responses=errors)
    async def attention(body: AttentionRequest) -> Any:  # type: ignore[valid-type]
        """The encoder-decoder attention of one sentence and its translation (or the given target)."""
        sentence, target = body.sentence, body.target  # type: ignore[attr-defined]
        texts = [("sentence", sentence)] + ([("target", target)] if target is not None else [])
        if too_long := check_sizes(texts):
            return too_long
        options = body.model_dump(exclude={"sentence", "target"}, exclude_none=True)  # type: ignore[attr-defined]
        if bad := check_options(options):
            return bad
        try:
            if target is None:  # the translation /translate gives, with the same options (and batched with it)
                target = (await batcher.submit([sentence], options))[0]
            maps = await batcher.call(translator.attention, sentence, target)
        except Exception as e:
            log.exception("attention failed")
            return _error(500, f"attention failed: {type(e).__name__}: {e}")
        return AttentionResponse(
            translation=target,
            src_pieces=maps.src_pieces,
            tgt_pieces=maps.tgt_out_pieces,
            layers=maps.cross.shape[0],
            heads=maps.cross.shape[1],
            cross=maps.cross.double().round(decimals=4).tolist(),
        )

    @app.get("/health", response_model=HealthResponse)
    async def health() -> Any:
        """Liveness, the model, the decoding defaults, the limits and the batching counters."""
        return HealthResponse(
            status="ok",
            model=model_info,
            decode=translator.decode.to_dict(),
            limits=limits,
            stats=asdict(batcher.stats),
            uptime_s=round(time.monotonic() - started, 3),
        )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    return app


def _model_info(translator: Any) -> dict[str, Any]:
    model = getattr(translator, "model", None)
    config = getattr(model, "config", None)
    info: dict[str, Any] = {}
    for name in ("src_vocab_size", "tgt_vocab_size", "encoder_layers", "decoder_layers", "heads", "d_model", "d_ff"):
        if hasattr(config, name):
            info[name] = getattr(config, name)
    if model is not None and hasattr(model, "parameters"):
        info["parameters"] = sum(p.numel() for p in model.parameters())
    if hasattr(translator, "device"):
        info["device"] = str(translator.device)
    return info


def _version() -> str:
    from transduce import __version__

    return __version__


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 with FastAPI's list of errors plus a one-line summary of them."""
    assert isinstance(exc, RequestValidationError)
    errors = jsonable_encoder(exc.errors())
    for e in errors:
        e.pop("url", None)
    return JSONResponse({"error": _summary(errors), "detail": errors}, status_code=422)


def _summary(errors: list[dict[str, Any]], most: int = 3) -> str:
    parts = []
    for e in errors[:most]:
        loc = [str(x) for x in e.get("loc", ())]
        if e.get("type") == "json_invalid":
            reason = (e.get("ctx") or {}).get("error", "")
            parts.append(f"invalid JSON at character {loc[-1] if len(loc) > 1 else '?'}: {reason}".rstrip(": "))
            continue
        where = ".".join(loc[1:] if loc[:1] == ["body"] and len(loc) > 1 else loc)
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    if len(errors) > most:
        parts.append(f"and {len(errors) - most} more")
    return "; ".join(parts) or "invalid request"


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's HTTP errors (404, 405, ...) with an ``"error"`` line besides FastAPI's ``"detail"``."""
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(
        {"error": f"{exc.status_code}: {exc.detail}", "detail": exc.detail},
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


class BodySizeLimit:
    """ASGI middleware: answer 413 to a request whose body exceeds ``max_bytes``, by its ``Content-Length`` or by
    the bytes that arrive (chunked bodies). The body is read here and handed on in one piece."""

    def __init__(self, app: ASGIApp, max_bytes: int, drain_bytes: int = 8 << 20) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.drain_bytes = drain_bytes  # read and drop up to this much of a too-large body before answering

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                with contextlib.suppress(ValueError):
                    declared = int(value)
        if declared is not None and declared > self.max_bytes:
            message = f"request body too large: {declared} bytes > max_body_bytes {self.max_bytes}"
            if declared <= self.drain_bytes:
                await self._drain(receive)  # so that the client reads the answer rather than a reset connection
            await _error(413, message)(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message_in = await receive()
            if message_in["type"] == "http.disconnect":
                return
            chunk = message_in.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message_in.get("more_body", False):
                    await self._drain(receive, size)
                text = f"request body too large: more than max_body_bytes {self.max_bytes} bytes"
                await _error(413, text)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message_in.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive, size: int = 0) -> None:
        while size <= self.drain_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


# ----------------------------------------------------------------------------------------------------------------------
# running it


class ServerThread:
    """Serve an ASGI app with uvicorn in a background thread, for tests, benchmarks and notebooks.

        with ServerThread(app) as url:          # port 0: a free port on 127.0.0.1, bound before the thread starts
            httpx.get(url + "/health")

    Args:
        app: the ASGI application.
        host, port: where to listen (port 0: any free port; :attr:`url` tells which).
        config: more ``uvicorn.Config`` arguments (default: no access log, warnings only, logging left alone).
    """

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.config = {"log_config": None, "log_level": "warning", "access_log": False, **config}
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 60.0) -> str:
        """Start serving; returns the base URL once the server accepts connections (after the app's startup)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=self.host, port=self.port, **self.config))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="transduce-server", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                sock.close()
                raise RuntimeError(f"the server on {self.url} did not start (see the log)")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        """Shut down gracefully (the app's shutdown runs) and wait for the thread."""
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("the server thread did not stop within %.0f s", timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    device: str = "cpu",
    translator: Any = None,
    access_log: bool = True,
    **options: Any,
) -> None:
    """Load a model and serve it until interrupted (Ctrl-C: a graceful shutdown).

    Args:
        model_path: run directory or checkpoint (ignored when ``translator`` is given).
        translator: an already loaded translator.
        access_log: log one line per request.
        options: :func:`create_app`'s limits and batching settings.
    """
    if translator is None:
        from transduce.translate import Translator

        translator = Translator.load(model_path, device)
    app = create_app(translator, **options)
    config = uvicorn.Config(app, host=host, port=port, access_log=access_log, log_config=None, log_level="info")
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    log.info("serving %s on http://%s:%d/ (the page; API documentation at /docs)", model_path, shown, port)
    server.run()
    log.info("stopped")
