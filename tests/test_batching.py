"""The batching core of the server (``transduce.serving.batching``) alone, without HTTP or a model: requests merged into
one call per set of options, results in order, failures isolated to the request at fault, the window and the size
limit, cancelled requests skipped, the inference thread, and shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from transduce.serving.batching import Batcher


def test_batcher_groups_by_options_keeps_order_and_isolates_failures():
    calls: list[tuple[list[str], dict]] = []

    def fn(sentences, options):
        calls.append((list(sentences), options))
        if "bad" in sentences:
            raise ValueError("bad sentence")
        return [s.upper() + str(options.get("beam", "")) for s in sentences]

    async def main():
        b = Batcher(fn, wait_ms=30.0, max_batch_sentences=100)
        await b.start()
        try:
            jobs = [
                b.submit(["a", "b"]),
                b.submit(["c"], {"beam": 2}),
                b.submit([]),
                b.submit(["d"]),
                b.submit(["bad"], {"beam": 2}),
                b.submit(["e"], {"beam": 2}),
            ]
            results = await asyncio.gather(*jobs, return_exceptions=True)
            return results, b.stats
        finally:
            await b.stop()

    results, st = asyncio.run(main())
    assert results[:4] == [["A", "B"], ["C2"], [], ["D"]] and results[5] == ["E2"]
    assert isinstance(results[4], ValueError)
    # one window; one call without options, one failing call with beam 2, then the three beam-2 requests alone
    assert calls[0] == (["a", "b", "d"], {}) and calls[1] == (["c", "bad", "e"], {"beam": 2})
    assert calls[2:] == [(["c"], {"beam": 2}), (["bad"], {"beam": 2}), (["e"], {"beam": 2})]
    assert (st.requests, st.sentences, st.batches, st.calls, st.failed_calls, st.largest_call) == (5, 6, 1, 5, 2, 3)


def test_batcher_window_and_size_limit():
    calls: list[list[str]] = []

    def fn(sentences, options):
        calls.append(list(sentences))
        return sentences

    async def main():
        b = Batcher(fn, wait_ms=0.0, max_batch_sentences=3)
        await b.start()
        try:
            first = await asyncio.gather(*(b.submit([f"s{i}", f"t{i}"]) for i in range(4)))
            b.wait = 10.0  # a long window ends early when the batch is full
            t = time.perf_counter()
            second = await asyncio.gather(b.submit(["x", "y"]), b.submit(["z"]))
            return first, second, time.perf_counter() - t
        finally:
            await b.stop()

    first, second, elapsed = asyncio.run(main())
    assert first == [[f"s{i}", f"t{i}"] for i in range(4)] and second == [["x", "y"], ["z"]]
    assert calls[:2] == [["s0", "t0", "s1", "t1"], ["s2", "t2", "s3", "t3"]]  # full at 4 >= 3: no more taken
    assert calls[2] == ["x", "y", "z"] and elapsed < 5.0


def test_batcher_stop_fails_queued_requests():
    async def main():
        b = Batcher(lambda s, o: s, wait_ms=10_000.0)
        await b.start()
        task = asyncio.create_task(b.submit(["a"]))
        await asyncio.sleep(0.05)  # queued and collected; the window is still open
        await b.stop()
        return await asyncio.gather(task, return_exceptions=True)

    (result,) = asyncio.run(main())
    assert isinstance(result, (RuntimeError, asyncio.CancelledError))


def test_a_cancelled_request_is_not_translated_and_the_others_are():
    calls: list[list[str]] = []

    def fn(sentences, options):
        calls.append(list(sentences))
        return sentences

    async def main():
        b = Batcher(fn, wait_ms=50.0)
        await b.start()
        try:
            gone = asyncio.create_task(b.submit(["gone"]))
            kept = asyncio.create_task(b.submit(["kept"]))
            await asyncio.sleep(0.01)  # both collected, the window still open
            gone.cancel()
            return await kept, b.stats
        finally:
            await b.stop()

    kept, st = asyncio.run(main())
    assert kept == ["kept"] and calls == [["kept"]]
    assert (st.requests, st.calls, st.largest_call) == (2, 1, 1)


def test_calls_run_one_at_a_time_in_one_inference_thread():
    threads: set[str] = set()
    running, overlapped = [0], [False]

    def fn(sentences, options):
        threads.add(threading.current_thread().name)
        running[0] += 1
        overlapped[0] |= running[0] > 1
        time.sleep(0.01)
        running[0] -= 1
        return sentences

    async def main():
        b = Batcher(fn, wait_ms=0.0, max_batch_sentences=1)
        await b.start()
        try:
            other = b.call(lambda: threading.current_thread().name)
            results = await asyncio.gather(*(b.submit([str(i)], {"beam": i % 2}) for i in range(6)))
            return results, await other
        finally:
            await b.stop()

    results, other_thread = asyncio.run(main())
    assert results == [[str(i)] for i in range(6)]
    assert len(threads) == 1 and threads == {other_thread} and other_thread.startswith("transduce-inference")
    assert not overlapped[0]


def test_a_function_that_returns_the_wrong_number_of_results_fails_the_request():
    async def main():
        b = Batcher(lambda s, o: s[:1], wait_ms=0.0)
        await b.start()
        try:
            return await asyncio.gather(b.submit(["a", "b"]), return_exceptions=True)
        finally:
            await b.stop()

    (result,) = asyncio.run(main())
    assert isinstance(result, RuntimeError) and str(result) == "the translation function returned 1 results for 2"


def test_a_batcher_must_be_started_and_its_settings_valid():
    b = Batcher(lambda s, o: s)
    with pytest.raises(RuntimeError, match=r"the batcher is not running \(call start\(\) first\)"):
        asyncio.run(b.submit(["a"]))
    assert asyncio.run(b.submit([])) == []  # nothing to translate: no need to run
    with pytest.raises(ValueError, match="wait_ms must be >= 0, got -1"):
        Batcher(lambda s, o: s, wait_ms=-1)
    with pytest.raises(ValueError, match="max_batch_sentences must be >= 1, got 0"):
        Batcher(lambda s, o: s, max_batch_sentences=0)

    async def twice():
        b2 = Batcher(lambda s, o: s)
        await b2.start()
        try:
            with pytest.raises(RuntimeError, match="the batcher is already running"):
                await b2.start()
        finally:
            await b2.stop()
        await b2.stop()  # a second stop does nothing

    asyncio.run(twice())
