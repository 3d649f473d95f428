"""What every transduce server has, whatever it serves (translations, labels): the FastAPI app that starts and stops
its batcher, the request-body limit (413), the check that bodies are UTF-8 JSON (422), the one-line ``"error"`` of
every error response, and the limits' checks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from transduce.serving.asgi import BodySizeLimit, JsonBody, json_error
from transduce.serving.batching import Batcher


class ErrorResponse(BaseModel):
    error: str = Field(description="what is wrong, in one line")


class ValidationErrorResponse(ErrorResponse):
    detail: list[dict[str, Any]] = Field(description="the validation errors (FastAPI's format)")


def base_app(batcher: Batcher, summary: str, max_body_bytes: int) -> FastAPI:
    """A FastAPI app that starts and stops ``batcher`` with itself and has what every transduce server has: the
    request-body limit (413), the check that bodies are UTF-8 JSON and the one-line ``"error"`` of every error."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="transduce", summary=summary, version=_version(), lifespan=lifespan)
    app.state.batcher = batcher
    app.add_middleware(JsonBody)  # (inside the size limit, which is added last: the outermost)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app


def check_limits(**limits: int) -> None:
    """Raise ValueError naming the first of a server's ``limits`` (keyword: name and value) that is below 1."""
    for name, value in limits.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def too_many(what: str, count: int, max_sentences: int) -> JSONResponse | None:
    """413 for a request of ``count`` texts (``what``: "sentences", "texts") when that is over ``max_sentences``."""
    if count > max_sentences:
        return json_error(413, f"too many {what}: {count} > max_sentences {max_sentences}")
    return None


def too_long(texts: Iterable[tuple[str, str]], max_chars: int) -> JSONResponse | None:
    """413 naming the first of the ``(name, text)`` pairs whose text has more than ``max_chars`` characters, or
    None."""
    for name, text in texts:
        if len(text) > max_chars:
            return json_error(413, f"{name} is too long: {len(text)} characters > max_chars {max_chars}")
    return None


def _version() -> str:
    from transduce import __version__

    return __version__


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
