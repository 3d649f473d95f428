"""Dynamic batching: the sentences of concurrent requests merged into few calls of a blocking translation function.

The core of ``transduce serve`` (:mod:`transduce.serving.server` puts HTTP in front of it), with no web framework in it:

    batcher = Batcher(lambda sentences, options: translator.translate(sentences, **options), wait_ms=5)
    await batcher.start()                                   # on the running event loop
    results = await batcher.submit(["A dog."], {"beam": 4}) # from any number of tasks
    await batcher.stop()

A request's sentences are queued with a future; the worker task takes the first queued request, keeps collecting
for up to ``wait_ms`` (or until ``max_batch_sentences``), groups the requests by their options and makes ONE call
per group in a single inference thread (torch already parallelises each operation over its intra-op threads; two
batches at once would only compete for the same cores), then hands each request its own slice of the results.
Under load the window hardly matters: requests that arrive while a batch is being translated are all taken together
by the next one. A group whose call fails is retried request by request, so that only the request at fault gets the
error; a request whose future was cancelled (its client gone) is not translated.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchStats", "Batcher"]


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
