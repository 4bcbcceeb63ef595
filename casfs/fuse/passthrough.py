"""FUSE passthrough: an open file whose bytes are one plain local file is given to the
kernel, which then reads it itself; the daemon sees none of those reads.

It needs libfuse >= 3.17 and casfs's pyfuse3 patch (scripts/build-pyfuse3.sh:
FileInfo.backing_id, pyfuse3.passthrough_granted), a kernel with passthrough (6.9 on),
and CAP_SYS_ADMIN: the kernel lets only that register a backing file. The kernel also
refuses, measured on 6.18:
  - passthrough on a connection that has the writeback cache (registering fails EPERM),
    so a writable mount that asks for it goes without that cache (casfs.fuse.upperpass:
    a directory volume's changed files are then written by the kernel itself);
  - two backing files for one inode, and a passthrough open of an inode beside a cached
    one (that open fails EIO): an inode's handles are all passthrough, sharing one
    backing id, or none are (Backings, Operations);
  - keep_cache with passthrough (EIO): the kernel's page cache of the backing file
    serves instead.
Where any of this is missing, reads are served as before and the log says once why.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
from collections.abc import Callable, Hashable
from pathlib import Path

import blake3
import pyfuse3
import trio

from casfs.errors import CasfsError
from casfs.fuse.fastwait import fuse_fd
from casfs.ids import InodeNo
from casfs.metrics import FileCacheReading
from casfs.store.filecache import MAX_FILE_BYTES, FileCache, FillProgress, Part
from casfs.store.filefill import BackgroundFills, GetMany
from casfs.store.ids import BlobId
from casfs.vfs.api import ReadPiece, View

log = logging.getLogger("casfs.daemon")

# The kernel's /dev/fuse ioctls (include/uapi/linux/fuse.h): register an open file as
# a backing file (struct fuse_backing_map {s32 fd; u32 flags; u64 padding}), giving its
# id; and drop an id (u32). The kernel keeps its own reference to the file.
_BACKING_OPEN = 0x4010E501  # _IOW(229, 1, 16 bytes)
_BACKING_CLOSE = 0x4004E502  # _IOW(229, 2, 4 bytes)


def built_in() -> bool:
    """Whether this pyfuse3 can reply an open with a backing file."""
    return hasattr(pyfuse3.FileInfo(), "backing_id")


def refusal(asked: bool) -> str | None:
    """Why this mount cannot have passthrough, before it asks the kernel; None: it can."""
    if not asked:
        return "turned off (--no-passthrough)"
    if not built_in():
        return "pyfuse3 is built without it (scripts/install.sh builds it against libfuse 3.17+)"
    if os.geteuid() != 0:
        return "not root (registering a backing file needs CAP_SYS_ADMIN)"
    return None


def content_key(size: int, pieces: list[ReadPiece]) -> str | None:
    """The whole-file cache's key of a file whose read plan is `pieces`: the BLAKE3 of
    its size and each piece's chunk id and range (the same bytes under the same chunking,
    the same key); None when its bytes are not all in blobs (an upper file's, memory)."""
    h = blake3.blake3(size.to_bytes(8, "little"))
    for p in pieces:
        if p.data is not None or p.read is not None:
            return None
        h.update(p.blob)
        h.update(p.start.to_bytes(4, "little") + p.end.to_bytes(4, "little"))
    return h.hexdigest()


class Backings:
    """This session's backing files: one id per key (an inode) while any handle of it is
    open, registered at its first open and dropped at its last release."""

    def __init__(self, session_fd: int) -> None:
        self._fd = session_fd
        self._ids: dict[Hashable, list[int]] = {}  # key -> [backing id, handles]

    def holds(self, key: Hashable) -> bool:
        return key in self._ids

    def acquire(self, key: Hashable, path: Path | str | None = None, writable: bool = False) -> int:
        """The backing id of `key` for one more handle; `path` registers it if none is
        (opened read/write if `writable`: the kernel writes through that file)."""
        held = self._ids.get(key)
        if held is None:
            assert path is not None, "a first open names its backing file"
            held = self._ids[key] = [self._register(path, writable), 0]
        held[1] += 1
        return held[0]

    def release(self, key: Hashable) -> None:
        held = self._ids[key]
        held[1] -= 1
        if held[1] == 0:
            del self._ids[key]
            fcntl.ioctl(self._fd, _BACKING_CLOSE, struct.pack("I", held[0]))

    def _register(self, path: Path | str, writable: bool) -> int:
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        try:
            # (a mutable buffer, so that ioctl returns the call's result, the id)
            return int(fcntl.ioctl(self._fd, _BACKING_OPEN, bytearray(struct.pack("iIQ", fd, 0, 0)), True))
        finally:
            os.close(fd)


class PassthroughOpens:
    """Which opens are answered with a backing file: a regular file of immutable content
    (an image, a snapshot, a block image), from the whole-file cache: filled at its first
    open up to `open_fill_max` bytes, larger ones in the background (casfs.store.filefill:
    served by the daemon until an open finds them cached). Anything that fails on the way
    (a full disk, a damaged chunk) is logged and the open is served by the daemon, as
    without passthrough (a damaged chunk then fails the reads of its range with EIO, not
    the open)."""

    def __init__(
        self,
        cache: FileCache,
        fetch: Callable[[BlobId], bytes],
        open_fill_max: int = MAX_FILE_BYTES,
        fetch_many: GetMany | None = None,
    ) -> None:
        self.cache = cache
        self.fetch = fetch
        self.open_fill_max = open_fill_max
        self.fills = BackgroundFills(cache, fetch, fetch_many)
        # The cache keys of large files opened: (view, key), by (id(view), ino); the view
        # held so that its id is not reused while its entry stands.
        self._keys: dict[tuple[int, InodeNo], tuple[View, str | None]] = {}
        self._filling: dict[str, trio.Lock] = {}
        self._backings: Backings | None = None
        self._mode: str | None = None
        self.open_fills = self.open_fill_bytes = 0  # files filled while their open waited

    def mode(self) -> str:
        """ "on", or "off: why". Found out at the first use, by registering a probe file:
        the kernel takes backing files only once it has this daemon's answer to INIT,
        which pyfuse3 sends after the operations' init()."""
        if self._mode is None:
            self._backings, why_not = _probe(self.cache)
            self._mode = "on" if self._backings is not None else f"off: {why_not}"
            log.info("passthrough %s", self._mode)
        return self._mode

    def backings(self) -> Backings | None:
        """The session's backing files, None where the kernel takes none."""
        return self._backings if self.mode() == "on" else None

    async def backing_id(self, view: View, ino: InodeNo, cached_open: Callable[[], bool]) -> int:
        """The backing id to open (view, ino) with, or 0: served by the daemon.
        `cached_open` tells whether the inode has a handle served by the daemon (then
        the kernel would refuse a backing file for it)."""
        key = (id(view), ino)
        backings = self._backings if self.mode() == "on" else None
        if backings is None:
            return 0
        if backings.holds(key):
            return backings.acquire(key)
        if not view.immutable or cached_open():
            return 0
        st = view.getattr(ino)
        if st.is_dir or st.size <= 0:
            return 0
        try:
            if st.size > self.open_fill_max:
                path = self._filled_in_background(view, ino, st.size)
            else:
                path = await self._cached_file(view, ino, st.size)
            if path is None or cached_open():
                return 0
            return backings.acquire(key, path)
        except (CasfsError, OSError) as e:
            log.warning("passthrough: %s served by the daemon: %s", view.describe(ino), e)
            return 0

    async def _cached_file(self, view: View, ino: InodeNo, size: int) -> Path | None:
        pieces = view.read_plan(ino, 0, size)
        key = content_key(size, pieces)
        if key is None:
            return None
        lock = self._filling.setdefault(key, trio.Lock())
        try:
            async with lock:  # one fill of a file at a time, the others then find it
                path = self.cache.lookup(key)
                if path is None:
                    parts: list[Part] = [(p.blob, p.start, p.end) for p in pieces]
                    path = await trio.to_thread.run_sync(self.cache.fill, key, parts, self.fetch)
                    self.open_fills += 1
                    self.open_fill_bytes += size
                return path
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._filling.pop(key, None)

    def _filled_in_background(self, view: View, ino: InodeNo, size: int) -> Path | None:
        """A large file's cache file if its fill is done; else its fill is queued, once
        (again if the file was trimmed or evicted since)."""
        held = self._keys.get((id(view), ino))
        if held is not None and held[0] is view:
            key = held[1]
            if key is None or self.fills.pending(key):
                return None
            if (path := self.cache.lookup(key)) is not None:
                return path
        pieces = view.read_plan(ino, 0, size)
        key = content_key(size, pieces)
        if len(self._keys) >= _KEYS_KEPT:
            self._keys.clear()
        self._keys[(id(view), ino)] = (view, key)
        if key is None:
            return None
        path = self.cache.lookup(key)
        if path is None:
            self.fills.want(key, size, [(p.blob, p.start, p.end) for p in pieces])
        return path

    def filling(self, view: View, ino: InodeNo) -> FillProgress | None:
        """For an open served by the daemon: the background fill of its file, while one is
        queued or running (its reader is served from what the fill has written: a pread,
        not the packs; detach() it at release)."""
        held = self._keys.get((id(view), ino))
        if held is None or held[0] is not view or held[1] is None:
            return None
        return self.fills.progress(held[1])

    def status(self) -> str:
        """The cache's disk cost and the background fills' pace, one line."""
        files, used = self.cache.usage()
        disk = f"{files} files, {used >> 20} MiB of {self.cache.limit >> 20} MiB"
        return f"{disk}; background fills: {self.fills.status()}"

    def figures(self) -> FileCacheReading:
        """The cache's and the fills' figures, for metrics (read on the scraper's thread)."""
        files, used = self.cache.usage()
        s = self.fills.stats
        return FileCacheReading(
            files=files,
            disk_bytes=used,
            limit_bytes=self.cache.limit,
            fills={"open": self.open_fills, "background": s.files},
            fill_bytes={"open": self.open_fill_bytes, "background": s.bytes},
            fill_failures=s.failed,
            too_large=s.too_large,
            queued=s.queued,
            served_from_fills_bytes=s.served_bytes,
        )

    def release(self, view: View, ino: InodeNo) -> None:
        assert self._backings is not None, "only a backed handle is released here"
        self._backings.release((id(view), ino))


_KEYS_KEPT = 1024  # large files' keys remembered (dropped all at once past it)


def _probe(cache: FileCache) -> tuple[Backings | None, str]:
    """The session's backing files, or None and why the kernel takes none."""
    fd = fuse_fd()
    if fd is None:
        return None, "the session's /dev/fuse was not found"
    backings = Backings(fd)
    probe = cache.root.parent / "passthrough-probe"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.touch(mode=0o400)
        backings.acquire(probe, probe)
        backings.release(probe)
    except OSError as e:
        return None, f"the kernel refused a backing file ({errno.errorcode.get(e.errno or 0, e)})"
    return backings, ""
