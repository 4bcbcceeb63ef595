"""A chunk being loaded (vfs.chunks's in-flight map): the part of
concurrent.futures.Future the chunk cache uses (done, result, add_done_callback,
set_result, set_exception), at a fraction of its cost to make.

Why: read-ahead makes one per chunk on the trio thread, and a Future makes a Condition
and an RLock for itself (about 5 us: 60 ms of the trio thread for each GiB read in
64 KiB chunks, four times that in 16 KiB ones). A Load holds only its outcome and its
callbacks; the few threads that block on one (a worker waiting for a chunk another
loads) share one Condition, notified at every outcome.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
_done = threading.Condition()


class Load:
    __slots__ = ("_callbacks", "_error", "_finished", "_value")

    def __init__(self) -> None:
        self._finished = False
        self._value = b""
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Load], object]] | None = None

    def done(self) -> bool:
        return self._finished

    def set_result(self, value: bytes) -> None:
        self._value = value
        self._finish()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._finish()

    def _finish(self) -> None:
        with _done:
            assert not self._finished, "a load has one outcome"
            self._finished = True
            callbacks, self._callbacks = self._callbacks, None
            _done.notify_all()
        for fn in callbacks or ():
            _call(fn, self)

    def add_done_callback(self, fn: Callable[[Load], object]) -> None:
        """fn(self) once the outcome is set (at once, here, if it is)."""
        with _done:
            if not self._finished:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        _call(fn, self)

    def result(self, timeout: float | None = None) -> bytes:
        """The chunk, waiting for it; raises the load's error. TimeoutError after
        `timeout` seconds without an outcome."""
        if not self._finished:
            with _done:
                if not _done.wait_for(self.done, timeout):
                    raise TimeoutError("the chunk is still loading")
        if self._error is not None:
            raise self._error
        return self._value


def _call(fn: Callable[[Load], object], load: Load) -> None:
    """A callback, its error logged, not raised (as Future's): the loader goes on to set
    the other chunks' outcomes."""
    try:
        fn(load)
    except Exception:
        log.exception("a chunk load's callback failed")
