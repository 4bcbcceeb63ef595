"""A bounded on-disk cache of blobs fetched from the bucket, least recently used out.

    STORE/cache/blobs/ab/<id>   a blob's stored (encoded) bytes, as fetched and verified

Shared by every process of the store (the mount daemons, the CLI): files are written
to a temporary name and renamed, so a reader sees a whole blob or none, and every read
verifies what it gets anyway (a damaged cache file is dropped and fetched again).
Recency is the file's mtime, touched on a hit at most once a minute; when this
process has seen the cache grow past its limit it scans it and removes the oldest
files down to 90% (each process counts what it added since its last scan, so several
writers together may overshoot by what each adds between scans).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from pathlib import Path

from casfs.store.ids import BlobId

log = logging.getLogger(__name__)

_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 8)
TOUCH_AFTER_S = 60.0


class DiskCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._bytes: int | None = None  # unknown until the first scan

    def _path(self, bid: BlobId) -> str:
        h = bid.hex()
        return f"{self.root}/{h[:2]}/{h}"

    def get(self, bid: BlobId, max_size: int | None = None, nowait: bool = False) -> bytes | None:
        """The cached stored bytes, or None (not cached, larger than `max_size`, or with
        `nowait`, not all in the page cache)."""
        if self.max_bytes <= 0:
            return None
        try:
            fd = os.open(self._path(bid), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if max_size is not None and st.st_size > max_size:
                return None
            buf = bytearray(st.st_size)
            try:
                got = os.preadv(fd, [buf], 0, _RWF_NOWAIT if nowait else 0)
            except BlockingIOError:
                return None
            if got != st.st_size:
                return None
            if time.time() - st.st_mtime > TOUCH_AFTER_S:
                with contextlib.suppress(OSError):
                    os.utime(fd)
            return bytes(buf)
        finally:
            os.close(fd)

    def put(self, bid: BlobId, stored: bytes) -> None:
        """Keep a verified blob; best effort (a full disk only logs)."""
        if self.max_bytes <= 0 or len(stored) > self.max_bytes // 10:
            return
        path = self._path(bid)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
        try:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(stored)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if e.errno != errno.ENOSPC:
                log.warning("cannot cache blob %s: %s", bid.hex(), e)
            return
        with self._lock:
            if self._bytes is None:
                self._bytes = self._scan_size()
            self._bytes += len(stored)
            if self._bytes > self.max_bytes:
                self._bytes = self._evict(int(self.max_bytes * 0.9))

    def discard(self, bid: BlobId) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(bid))

    def clear(self) -> None:
        with self._lock:
            for _, _, path in self._files():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            self._bytes = 0

    def _files(self) -> list[tuple[float, int, str]]:
        out = []
        try:
            subs = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for sub in subs:
            if not sub.is_dir():
                continue
            for entry in os.scandir(sub.path):
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat()
                    out.append((st.st_mtime, st.st_size, entry.path))
        return out

    def _scan_size(self) -> int:
        return sum(size for _, size, _ in self._files())

    def _evict(self, target: int) -> int:
        """Remove the least recently used files until at most `target` bytes remain."""
        files = sorted(self._files())
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size
        return total

    @property
    def size_bytes(self) -> int:
        with self._lock:
            if self._bytes is None:
                self._bytes = self._scan_size()
            return self._bytes
