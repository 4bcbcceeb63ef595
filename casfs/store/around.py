"""Read-around for a local pack store: when a read on the event loop finds a blob out of
the page cache, the pack bytes around it are brought in by a background thread
(posix_fadvise WILLNEED: the kernel reads them asynchronously; nothing is read into
this process, and nothing it returns comes from here unverified: a later read of a
blob in that range is checked as every read is).

Why: a pack holds an import's or a fold's chunks in the order of the disk or file they
came from, so the pack bytes around a chunk are the disk's bytes around it (where a
guest's file system keeps the rest of a file, or its neighbours). A cold read costs
this VM's kernel about 15 us plus 0.45 us per KiB of system CPU on the reading thread
(page allocation, the copy, the request), and a random reader pays it per chunk on
the trio thread; read around, the same bytes cost the background thread one request
per window and no copy. This is
what the kernel does for a page fault in a mapped file (its read-around), and what it
does not do for pread. (Random 4 KiB reads of a clone after a drop of caches:
docs/developer-notes.md, "Reading".)

Bounds: windows are aligned, and one asked for recently is not asked for again; at
most _QUEUE wait for the thread, and a window that finds the queue full is skipped
(the reader never waits for read-around). A window costs the thread about 150 us of
system CPU per MiB (no copy), against 45 us per cold 64 KiB read on the trio thread.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from queue import Full, Queue

from casfs.store.fdcache import FdCache

# The window a cold read brings in, aligned: 16 chunks of 64 KiB. (A random reader of a
# 1 GiB clone, 4 KiB at a time: see the module's docstring.)
WINDOW = 1 << 20
_QUEUE = 8
_RECENT = 4096  # windows remembered as asked for (about 4 GiB of packs)


class ReadAround:
    """Windows of pack files to bring into the page cache, by one daemon thread (made at
    the first window). `fds` is the store's: a window whose pack is not open there any
    more is dropped."""

    def __init__(self, fds: FdCache, window: int = WINDOW) -> None:
        self.fds = fds
        self.window = window
        self.asked = 0  # windows handed to the thread
        self._recent: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._lock = threading.Lock()
        self._queue: Queue[tuple[str, int] | None] = Queue(_QUEUE)
        self._thread: threading.Thread | None = None
        self._pid = 0  # the thread's process (a forked child starts its own)

    def note_cold(self, path: str, offset: int) -> None:
        """A read of `path` at `offset` found it out of the page cache: bring in the
        window around it (without waiting)."""
        key = (path, offset // self.window)
        with self._lock:
            if key in self._recent:  # (first in, first out: a window evicted since is
                return  # asked for again once 4096 others have been)
            self._recent[key] = None
            if len(self._recent) > _RECENT:
                self._recent.popitem(last=False)
            if self._thread is None or self._pid != os.getpid():
                self._queue = Queue(_QUEUE)
                self._thread = threading.Thread(
                    target=self._run, args=(self._queue,), name="casfs-around", daemon=True
                )
                self._pid = os.getpid()
                self._thread.start()
            q = self._queue
        try:
            q.put_nowait(key)
        except Full:
            with self._lock:
                self._recent.pop(key, None)  # (not asked for: a later miss may ask again)
            return
        self.asked += 1

    def wait_idle(self) -> None:
        """Until every window asked for so far has been handed to the kernel (tests)."""
        self._queue.join()

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and self._pid == os.getpid():
            self._queue.put(None)
            thread.join()

    def _run(self, q: Queue[tuple[str, int] | None]) -> None:
        while True:
            item = q.get()
            try:
                if item is None:
                    return
                self._advise(*item)
            finally:
                q.task_done()

    def _advise(self, path: str, n: int) -> None:
        f = self.fds.acquire(path, open_missing=False)
        if f is None:
            return
        try:
            os.posix_fadvise(f.fd, n * self.window, self.window, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # (a hint: the reader reads for itself)
        finally:
            self.fds.release(f)
