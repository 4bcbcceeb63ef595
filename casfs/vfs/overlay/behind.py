"""Write-behind for upper files: the pages of a large write into an upper file are
handed to the disk by a background thread (sync_file_range SYNC_FILE_RANGE_WRITE:
writeback started, nothing waited for), so the fsync that follows finds them written
or on their way, instead of writing them all itself.

Why: a guest streaming 1 MiB writes and then fsyncing (block_bench's "seq write+fsync")
leaves up to its whole disk dirty in the page cache until that fsync, under the
kernel's background threshold (10% of memory). The fsync then allocates the blocks and
writes the pages on the thread that waits for it, while the other core idles. Started
as the writes come, the same work runs beside them. Durability does not change: a
sync still fdatasyncs the upper file before it writes the map (casfs.vfs.overlay.upper),
and a writeback error started here is reported by that fdatasync (the file's errseq).

Bounds: writes under MIN_BYTES (a guest's random 4 KiB writes) are left to the kernel
and the 5 s timer; at most _QUEUE ranges wait for the thread, and a range that finds
the queue full is skipped (a writer never waits for write-behind). A queued range holds
its upper, so its descriptor stays open until the thread is done with it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from queue import Full, Queue
from typing import Protocol

from casfs.store.local import libc

MIN_BYTES = 256 << 10  # smaller writes: no write-behind
_QUEUE = 64  # ranges waiting (64 MiB of 1 MiB writes)
_SYNC_FILE_RANGE_WRITE = 2  # (linux/fs.h)


class Writable(Protocol):
    def data_fd(self) -> int: ...


class WriteBehind:
    """Ranges of upper files whose writeback to start, by one daemon thread (made at the
    first range, again in a forked child)."""

    def __init__(self) -> None:
        self.started = 0  # ranges handed to the thread
        self._lock = threading.Lock()
        self._queue: Queue[tuple[Writable, int, int]] = Queue(_QUEUE)
        self._pid = 0  # the thread's process

    def start(self, upper: Writable, offset: int, size: int) -> None:
        """Start writing [offset, offset + size) of `upper`'s data file back (without waiting)."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._queue = Queue(_QUEUE)
                    thread = threading.Thread(
                        target=self._run, args=(self._queue,), name="casfs-behind", daemon=True
                    )
                    thread.start()
                    self._pid = os.getpid()
        try:
            self._queue.put_nowait((upper, offset, size))
        except Full:
            return  # (the sync writes it)
        self.started += 1

    def wait_idle(self) -> None:
        """Until every range handed over so far has been started (tests)."""
        self._queue.join()

    @staticmethod
    def _run(q: Queue[tuple[Writable, int, int]]) -> None:
        while True:
            upper, offset, size = q.get()
            try:
                # A hint: an error here is the sync's to report (and a closed upper's
                # descriptor cannot be reused meanwhile: the item holds the upper).
                libc().sync_file_range(
                    upper.data_fd(), ctypes.c_long(offset), ctypes.c_long(size), _SYNC_FILE_RANGE_WRITE
                )
            finally:
                del upper
                q.task_done()


BEHIND = WriteBehind()  # the process's one (upper files of every mounted volume)
