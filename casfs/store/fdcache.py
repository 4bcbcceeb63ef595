"""Open read-only fds of pack files, shared by every thread of a store: a read is then
one pread, not an open, a read and a close (and, cold, no directory lookup).

At most `size` are kept; the least recently used is closed first, and an fd is closed
only once no reader holds it (a closed fd number may be reused at once by another open:
a pread on it would read another file). A pack removed while its fd is cached (gc,
compaction in this process: forget()) is closed once unused; one removed by another
process keeps its disk space until this cache lets the fd go (LRU order, or IDLE_S
after its last use, checked whenever a pack is opened)."""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from collections import OrderedDict

IDLE_S = 60.0


class CachedFd:
    __slots__ = ("dropped", "fd", "used", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.dropped = False
        self.used = time.monotonic()


class FdCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._fds: OrderedDict[str, CachedFd] = OrderedDict()
        # O_NOATIME: a read does not write the pack's inode. Refused (EPERM) where the
        # store is not the reader's own: then without it.
        self._flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOATIME
        weakref.finalize(self, _close_all, self._fds)  # (a store dropped without close())

    def acquire(self, path: str, open_missing: bool = True) -> CachedFd | None:
        """The fd of `path`, held until release(); None if it is not open and not
        `open_missing`. FileNotFoundError if it must be opened and is not there."""
        now = time.monotonic()
        with self._lock:
            f = self._fds.get(path)
            if f is not None:
                self._fds.move_to_end(path)
                f.users += 1
                f.used = now
                return f
        if not open_missing:
            return None
        fd = self._open(path)
        with self._lock:
            f = self._fds.get(path)
            if f is not None:  # opened by another thread meanwhile
                os.close(fd)
            else:
                f = self._fds[path] = CachedFd(fd)
                self._evict(now)
            f.users += 1
            return f

    def release(self, f: CachedFd) -> None:
        with self._lock:
            f.users -= 1
            if f.dropped and f.users == 0:
                os.close(f.fd)

    def forget(self, path: str) -> None:
        """`path` was removed: close its fd (once unused)."""
        with self._lock:
            f = self._fds.pop(path, None)
            if f is not None:
                self._drop(f)

    def close(self) -> None:
        """Close every fd (one in use: once released)."""
        with self._lock:
            fds = list(self._fds.values())
            self._fds.clear()
            for f in fds:
                self._drop(f)

    def _evict(self, now: float) -> None:
        while self._fds:
            path, oldest = next(iter(self._fds.items()))
            if len(self._fds) <= self.size and now - oldest.used < IDLE_S:
                return
            del self._fds[path]
            self._drop(oldest)

    def _drop(self, f: CachedFd) -> None:
        f.dropped = True
        if f.users == 0:
            os.close(f.fd)

    def _open(self, path: str) -> int:
        try:
            return os.open(path, self._flags)
        except PermissionError as e:
            if e.errno != errno.EPERM or not self._flags & os.O_NOATIME:
                raise
            self._flags &= ~os.O_NOATIME
            return os.open(path, self._flags)


def _close_all(fds: OrderedDict[str, CachedFd]) -> None:
    for f in fds.values():
        os.close(f.fd)
