"""Batches made ahead of time in a background thread (the training loop's input pipeline)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

import torch

from transduce.data.batch import Batch


class Prefetch:
    """Iterate ``source`` in a background thread, up to ``depth`` items ahead, so that reading and padding the next
    batches overlaps the device's work on this one; with a CUDA ``pin`` device, the batches are copied to pinned
    (page-locked) memory, from which the copies to that device are asynchronous. Errors of the source are raised
    here."""

    _END = object()

    def __init__(self, source: Iterable[tuple[int, int, Batch]], depth: int, pin: torch.device | None) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source, pin), name="transduce-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterable[tuple[int, int, Batch]], pin: torch.device | None) -> None:
        try:
            if pin is not None:  # (else pinning makes a CUDA context on GPU 0 in this thread, whatever the rank's GPU)
                torch.cuda.set_device(pin)
            for epoch, position, batch in source:
                if not self._put((epoch, position, batch.pin_memory() if pin is not None else batch)):
                    return
            self._put(self._END)
        except BaseException as err:  # handed to the consumer, which raises it
            self._put(err)

    def __iter__(self) -> Iterator[tuple[int, int, Batch]]:
        return self

    def __next__(self) -> tuple[int, int, Batch]:
        item = self._queue.get()
        if item is self._END:
            self._queue.put(item)  # (a later next() ends too)
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[return-value]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
