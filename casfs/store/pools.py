"""Process-wide thread pools, made at first use.

A forked child inherits a pool object but none of its threads: work submitted there
would wait for ever. So each pool is forgotten in a child and made again when it is
first used there.
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

_pools: weakref.WeakSet[SharedPool] = weakref.WeakSet()


class SharedPool:
    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        _pools.add(self)

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
            return self._pool

    def _forget(self) -> None:
        self._pool, self._lock = None, threading.Lock()


def _forget_all() -> None:
    for pool in list(_pools):
        pool._forget()


os.register_at_fork(after_in_child=_forget_all)
