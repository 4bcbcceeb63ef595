"""Appending a staged pack's bytes to its file (store.packfile): plainly, or with
O_DIRECT through a page-aligned buffer.

Why O_DIRECT for a local store's packs: a buffered write copies every byte into the
page cache and leaves the kernel to write it back; on this VM that copy into fresh
page-cache pages was 45% of a fold's CPU samples (perf: copy_folio_from_iter_atomic),
and 1 GiB of 64 KiB writev + fdatasync ran at 290-480 MB/s against 1,750-1,870 MB/s
copied into a reused 1 MiB buffer and written with O_DIRECT (benchmarks/fold_speed.py,
docs/developer-notes.md). Nothing reads a pack while it is staged, and a fold's or an
import's blobs are not read back soon, so the page cache gains nothing from them.

A DirectAppender gathers whole blobs in a buffer; when the next one does not fit, the
aligned part of what it holds goes to a writer thread (the tail under a block starts
the next buffer). A failed write (a full disk) is raised by the next add that needs a
new buffer, before any byte of that blob is copied, and by the pack's publish: the
blobs of that buffer are lost, so the staging cannot be published any more (callers
discard a batch whose put failed). finish() waits for the writes, writes the rest
padded to a block, and cuts the file to its size.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future

from casfs.store.pools import SharedPool

ALIGN = 4096  # O_DIRECT's offsets, lengths and addresses: a multiple of the device's block
BUFFER = 1 << 20  # 1 MiB writes ran at the device's speed; more only holds memory
_AHEAD = 3  # buffers an appender has being written at once (then it waits for the oldest)
_KEEP = 8  # idle buffers kept for the next ones (touched pages: no faults to fill them)

_free: list[mmap.mmap] = []
_free_lock = threading.Lock()
# The writes, so that the adding threads hash and compress while the disk writes (an
# O_DIRECT write returns once the device has the data). Not store.packstore's sync
# threads: a sync waits for its pack's writes, which would queue behind it there.
_writers = SharedPool(2, "casfs-packw")


def _take(size: int) -> mmap.mmap:
    if size == BUFFER:
        with _free_lock:
            if _free:
                return _free.pop()
    # Page-aligned, as O_DIRECT needs; private (the default, shared, is a shmem file).
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _give(buf: mmap.mmap) -> None:
    """Keep a buffer for reuse, or let it go (unmapped when the last view of it goes:
    not close(), which refuses while a slice of it is alive)."""
    with _free_lock:
        if len(buf) == BUFFER and len(_free) < _KEEP:
            _free.append(buf)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _write_out(fd: int, buf: mmap.mmap, length: int, offset: int) -> None:
    try:
        _pwrite_all(fd, memoryview(buf)[:length], offset)
    finally:
        _give(buf)


class FileAppender:
    """Appends with writev at the file's end (the S3 staging reads its packs back
    for the upload: they had better be in the page cache)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def append(self, parts: Sequence[bytes | memoryview]) -> None:
        write_all(self.fd, *parts)

    def cut(self, size: int) -> None:
        """Drop what was appended past `size` (the blob whose record failed)."""
        os.ftruncate(self.fd, size)

    def finish(self) -> None:
        """Everything appended is in the file (here: it always is)."""

    def close(self) -> None:
        """Let go of the buffers, having waited for their writes (before fd closes)."""


class DirectAppender(FileAppender):
    """Appends to a file opened with O_DIRECT through aligned buffers (above), each
    written by a writer thread once full while the next one fills."""

    def __init__(self, fd: int, reserve: int = 0) -> None:
        super().__init__(fd)
        if reserve:
            # Its blocks at once: writes of 1 MiB by two threads, each allocated as it
            # came, left a 16 MiB pack in 3-5 extents (against 1-2 written back).
            with contextlib.suppress(OSError):  # (a file system without fallocate)
                os.posix_fallocate(fd, 0, reserve)
        self._buf = _take(BUFFER)
        self._closed = False
        self._failed: BaseException | None = None
        self._base = 0  # the file offset of the buffer's first byte
        self._pos = 0  # bytes in the buffer
        self._writes: deque[Future[None]] = deque()

    def append(self, parts: Sequence[bytes | memoryview]) -> None:
        n = sum(len(p) for p in parts)
        if self._pos + n > len(self._buf):
            self._spill(n)
        pos, buf = self._pos, self._buf
        for p in parts:
            buf[pos : pos + len(p)] = p
            pos += len(p)
        self._pos = pos

    def _spill(self, n: int) -> None:
        """Hand the whole blocks the buffer holds to a writer; go on in a new buffer
        (larger, for a blob larger than one). Raises the error of an earlier write
        first: then nothing of this blob is staged (the pack's publish fails too)."""
        if self._failed is not None:
            raise self._failed
        while self._writes and (self._writes[0].done() or len(self._writes) >= _AHEAD):
            self._collect()
        keep = self._pos % ALIGN
        done = self._pos - keep
        old = self._buf
        new = _take(max(BUFFER, -(-(keep + n) // BUFFER) * BUFFER))
        new[:keep] = old[done : self._pos]
        if done:
            self._writes.append(_writers.get().submit(_write_out, self.fd, old, done, self._base))
        else:
            _give(old)
        self._buf, self._base, self._pos = new, self._base + done, keep

    def cut(self, size: int) -> None:
        self._pos = size - self._base  # (what append copied is all still in the buffer)

    def finish(self) -> None:
        self._wait()
        if self._pos:
            padded = -(-self._pos // ALIGN) * ALIGN
            self._buf[self._pos : padded] = bytes(padded - self._pos)
            _pwrite_all(self.fd, memoryview(self._buf)[:padded], self._base)
        os.ftruncate(self.fd, self._base + self._pos)  # (past the padding, and the reserve)

    def close(self) -> None:
        with contextlib.suppress(BaseException):  # (the error is finish's, or the caller's)
            self._wait()
        if not self._closed:
            self._closed = True
            _give(self._buf)

    def _collect(self) -> None:
        """Wait for the oldest write; its error, if any, is this appender's for good
        (the pack has a hole where that buffer's blobs were)."""
        try:
            self._writes.popleft().result()
        except BaseException as e:
            self._failed = self._failed or e
            raise

    def _wait(self) -> None:
        """Wait for every write handed out; then raise the first that failed."""
        while self._writes:
            with contextlib.suppress(BaseException):
                self._collect()
        if self._failed is not None:
            raise self._failed


def open_direct(path: str, flags: int, mode: int) -> tuple[int, bool]:
    """os.open with O_DIRECT where the file system takes it; (fd, whether it did)."""
    try:
        return os.open(path, flags | os.O_DIRECT, mode), True
    except OSError as e:
        if e.errno != errno.EINVAL:  # (no O_DIRECT here: tmpfs before Linux 6.6, some FUSE)
            raise
        if flags & os.O_EXCL and os.path.exists(path):
            os.unlink(path)  # (the refused open created it)
        return os.open(path, flags, mode), False


def write_all(fd: int, *parts: bytes | memoryview) -> None:
    """Write the parts, joined (one writev: a short write is finished by os.write)."""
    done = os.writev(fd, parts)
    if done == sum(len(p) for p in parts):
        return
    view = memoryview(b"".join(parts))[done:]
    while view:
        view = view[os.write(fd, view) :]
