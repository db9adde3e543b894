"""Run a generator in a background thread behind a bounded queue.

The consumer gets the items in order; an exception raised in the thread is re-raised in the
consumer with its original traceback; closing the consumer (``break`` out of a loop, or
``close()``) stops the thread promptly and joins it, so no thread outlives its iterator.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

_DONE = object()
_POLL = 0.05  # seconds between checks of the stop flag while waiting on the queue


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


def background(make: Callable[[threading.Event], Iterator[Any]], *, maxsize: int, name: str) -> Iterator[Any]:
    """Yield the items of ``make(stop)`` produced in a daemon thread (at most `maxsize` waiting).

    `make` receives the stop event; long-running producers may check it between items.
    """
    q: queue.Queue = queue.Queue(maxsize=max(1, maxsize))
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in make(stop):
                if not put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(_Failure(exc))
            return
        put(_DONE)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = q.get(timeout=_POLL)
            except queue.Empty:
                if not thread.is_alive() and q.empty():
                    raise RuntimeError(f"background thread {name!r} ended without finishing") from None
                continue
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc.with_traceback(item.exc.__traceback__)
            yield item
    finally:
        stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                break
        thread.join(timeout=30)
