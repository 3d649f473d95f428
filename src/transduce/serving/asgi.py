"""ASGI pieces that know nothing of translation: a request-body size limit, a check that bodies are UTF-8 JSON, and
uvicorn in a background thread.

app.add_middleware(JsonBody)                            # 422 for a body that is not sent as UTF-8 JSON
app.add_middleware(BodySizeLimit, max_bytes=1_000_000)  # 413 for larger bodies, chunked ones included (outermost)
with ServerThread(app) as url:                           # a free port on 127.0.0.1, for tests and notebooks
    httpx.get(url + "/health")
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

__all__ = ["BodySizeLimit", "JsonBody", "ServerThread", "json_error"]


def json_error(status: int, message: str) -> JSONResponse:
    """``{"error": message}`` with the status code: the shape of every error the server answers."""
    return JSONResponse({"error": message}, status_code=status)


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
            await json_error(413, message)(scope, receive, send)
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
                await json_error(413, text)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message_in.get("more_body", False):
                break
        body = b"".join(chunks)
        await self.app(scope, _replaying(body, receive), send)

    async def _drain(self, receive: Receive, size: int = 0) -> None:
        while size <= self.drain_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


class JsonBody:
    """ASGI middleware: answer 422 in one line to a request with a body (POST, PUT, PATCH) that is not sent as JSON
    (its ``Content-Type`` is not ``application/json`` or ``*/*+json``; FastAPI would otherwise read the body as a
    string and report a missing object) or is not UTF-8 (FastAPI would answer a bare 400). The answer is
    ``{"error": ..., "detail": [{"type", "loc", "msg"}]}``, the shape of FastAPI's validation errors."""

    def __init__(self, app: ASGIApp, methods: tuple[str, ...] = ("POST", "PUT", "PATCH")) -> None:
        self.app = app
        self.methods = methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:  # (read whole: the size limit, outside this middleware, bounds it)
            message_in = await receive()
            if message_in["type"] == "http.disconnect":
                return
            chunks.append(message_in.get("body", b""))
            if not message_in.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = _json_body_problem(dict(scope["headers"]).get(b"content-type"), body)
        if problem is not None:
            kind, message = problem
            detail = [{"type": kind, "loc": ["body"], "msg": message}]
            await JSONResponse({"error": message, "detail": detail}, status_code=422)(scope, receive, send)
            return
        await self.app(scope, _replaying(body, receive), send)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the already-read ``body`` as one message, then defers to ``receive``."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _json_body_problem(content_type: bytes | None, body: bytes) -> tuple[str, str] | None:
    """``(error type, one-line message)`` for a body that is not UTF-8 JSON by its header and bytes, else None."""
    media = (content_type or b"").split(b";")[0].strip().lower().decode("latin-1")
    if media != "application/json" and not media.endswith("+json"):
        got = "this request has no Content-Type" if not media else f"this request's is {media}"
        return "content_type", f"the request body must be JSON, sent with Content-Type: application/json ({got})"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return (
            "utf8",
            f"the request body is not UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start}): JSON must be "
            "sent as UTF-8",
        )
    return None


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
