"""A mounted block volume's upper file: the blocks written since its base, kept as
qcow2, dm-snapshot and overlayfs keep theirs, in local files, not blobs.

Two files per epoch, under STORE/upper/<volume>/:

  <epoch>.data  sparse, the volume's size: each written 4 KiB block at its own offset,
                allocated a CLUSTER at a time (zeros around a new cluster's first write)
  <epoch>.map   a 4 KiB header, then one bit per block (bit b of byte b // 8, least
                significant first): set = that block's current bytes are in .data

A write is one pwrite of whole blocks into .data (a partly written block is completed
from below first; the first write into an empty cluster is one pwritev of the whole
cluster, zeros around it) and sets bits in memory. A sync makes them durable in this order:
fdatasync .data, write the map pages whose bits changed, fdatasync .map. Bits are only
ever set within an epoch, so a torn map page can only miss bits whose blocks were
never acknowledged: each block reads back its old bytes or its new ones, and every
block a sync acknowledged reads back new.

An epoch's files count only once the catalog names them (catalog.overlay.add_upper,
after the first sync); the fold that turns them into blobs forgets them in the
transaction that publishes its snapshot, and the files go after it. Files the catalog
does not name are left-overs (of a crash before the first sync, or after a fold):
casfs.store.uppers.remove_stale deletes them.

Trio-free; the writing view calls pwrite/pread on its thread, and sync from a worker
beside its writes (casfs.vfs.rw.jobs.sync: capture() takes the pages to write).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from casfs.store.local import fsync_dir, libc
from casfs.store.uppers import upper_dir
from casfs.vfs.overlay.behind import BEHIND, MIN_BYTES

BLOCK = 4096
_HEADER = struct.Struct("<12sIIQ")  # magic, format, block size, volume size
_MAGIC = b"casfs-upper\0"
_FORMAT = 1
_MAP_AT = BLOCK  # the bitmap starts after the header's block
_NONZERO = re.compile(rb"[^\x00]")
_PAGE = BLOCK  # the map is kept and written back in pages of this many bytes
_PAGE_BLOCKS = _PAGE * 8  # blocks a map page covers (128 MiB of disk)
CLUSTER = 32 << 10  # the upper file is allocated in aligned runs of this many bytes (Upper._cluster_empty)
_CLUSTER_BLOCKS = CLUSTER // BLOCK  # (a multiple of 8: a cluster is whole bytes of a map page)


class UpperError(OSError):
    """An upper file that is not what its catalog row says (damaged or foreign)."""


@dataclass
class Sync:
    """What one sync makes durable, captured on the writing thread: the map pages
    changed since the last sync (index -> bytes) and the write count it covers."""

    pages: dict[int, bytes]
    writes: int
    first: bool  # the epoch's first sync: the catalog does not name it yet
    punched: bool  # holes were punched: their extents are metadata, fsync them
    unsynced_bytes: int = 0  # written before the capture (writes may go on during the sync)


class Upper:
    """One epoch's upper files, open. The present-map in memory is authoritative and
    paged: a page (4 KiB, 128 MiB of disk) exists once a block in it is written, so
    memory follows what was written, not the volume's size. The map file trails it by
    what the last sync wrote."""

    def __init__(
        self, folder: Path, epoch: int, size: int, data_fd: int, map_fd: int, pages: dict[int, bytearray]
    ):
        self.folder = folder
        self.epoch = epoch
        self.size = size
        self._data = data_fd
        self._map = map_fd
        self._pages = pages
        self._dirty_pages: set[int] = set()
        self.writes = 0  # pwrites so far
        self.synced_writes = 0  # pwrites covered by the last completed sync
        self.registered = False  # the catalog names this epoch
        self.unsynced_bytes = 0
        self.punched = False  # holes punched since the last sync (fsync, not fdatasync)
        # Closed when the last holder lets go: a read planned before a fold retired this
        # epoch may still read it (the fold's blobs hold the same bytes).
        weakref.finalize(self, _close_later, data_fd, map_fd)

    @classmethod
    def create(cls, store: Path, volume: str, size: int) -> Upper:
        """A new, empty epoch (not yet named by the catalog)."""
        folder = upper_dir(store, volume)
        folder.mkdir(parents=True, exist_ok=True)
        epoch = time.time_ns()
        data = os.open(folder / f"{epoch}.data", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.ftruncate(data, size)
        map_fd = os.open(folder / f"{epoch}.map", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        header = _HEADER.pack(_MAGIC, _FORMAT, BLOCK, size).ljust(BLOCK, b"\0")
        os.pwrite(map_fd, header, 0)
        return cls(folder, epoch, size, data, map_fd, {})

    @classmethod
    def open(cls, store: Path, volume: str, epoch: int, size: int, writable: bool = True) -> Upper:
        """An epoch the catalog names, as its last sync left it. Not `writable`: a frozen
        epoch read by a view of its snapshot (casfs.vfs.frozenview), perhaps in another
        process than the one folding it; FileNotFoundError then if its fold deleted it."""
        folder = upper_dir(store, volume)
        mode = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        try:
            data = os.open(folder / f"{epoch}.data", mode)
            try:
                map_fd = os.open(folder / f"{epoch}.map", mode)
            except BaseException:
                os.close(data)
                raise
        except FileNotFoundError as e:
            if not writable:
                raise
            raise UpperError(f"upper file of volume {volume!r} missing: {e.filename}") from e
        header = os.pread(map_fd, _HEADER.size, 0)
        if len(header) < _HEADER.size or _HEADER.unpack(header) != (_MAGIC, _FORMAT, BLOCK, size):
            raise UpperError(f"upper map {folder / f'{epoch}.map'} does not match its volume ({size} bytes)")
        upper = cls(folder, epoch, size, data, map_fd, _read_pages(map_fd))
        upper.registered = True
        return upper

    def delete(self) -> None:
        """Remove the files (after the fold that made them blobs committed). Reads
        already planned keep the open descriptors, so they still see the bytes."""
        for suffix in ("data", "map"):
            (self.folder / f"{self.epoch}.{suffix}").unlink(missing_ok=True)

    def deleted(self) -> bool:
        """Whether the files were deleted (their fold committed), by any process."""
        return os.fstat(self._data).st_nlink == 0

    # -- the present-map ---------------------------------------------------------

    def mask(self, first: int, count: int) -> int:
        """Bits of blocks [first, first + count): bit i set = block first + i present."""
        if count == 1:
            return int(self.present(first))
        p, at = divmod(first, _PAGE_BLOCKS)
        if at + count > _PAGE_BLOCKS:  # across a page boundary (a chunk never is)
            part = _PAGE_BLOCKS - at
            return self.mask(first, part) | self.mask(first + part, count - part) << part
        page = self._pages.get(p)
        if page is None:
            return 0
        lo, hi = at >> 3, (at + count + 7) >> 3
        return (int.from_bytes(page[lo:hi], "little") >> (at & 7)) & ((1 << count) - 1)

    def present(self, block: int) -> bool:
        page = self._pages.get(block // _PAGE_BLOCKS)
        at = block % _PAGE_BLOCKS
        return page is not None and bool(page[at >> 3] >> (at & 7) & 1)

    def any_in(self, first: int, count: int) -> bool:
        return self.mask(first, count) != 0

    def _set(self, first: int, stop: int) -> int:
        """Set the bits of blocks [first, stop); returns how many were new."""
        if stop == first + 1:  # (one block: a 4 KiB write's)
            p, at = divmod(first, _PAGE_BLOCKS)
            page = self._pages.get(p)
            if page is None:
                page = self._pages[p] = bytearray(_PAGE)
            byte, bit = at >> 3, 1 << (at & 7)
            if page[byte] & bit:
                return 0
            page[byte] |= bit
            self._dirty_pages.add(p)
            return 1
        new_bits = 0
        while first < stop:
            p, at = divmod(first, _PAGE_BLOCKS)
            end = min(stop, (p + 1) * _PAGE_BLOCKS)
            page = self._pages.get(p)
            if page is None:
                page = self._pages[p] = bytearray(_PAGE)
            lo, hi = at >> 3, (at + end - first + 7) >> 3
            old = int.from_bytes(page[lo:hi], "little")
            new = old | (((1 << (end - first)) - 1) << (at & 7))
            if new != old:
                page[lo:hi] = new.to_bytes(hi - lo, "little")
                self._dirty_pages.add(p)
                new_bits += (new ^ old).bit_count()
            first = end
        return new_bits

    def chunks(self, blocks_per_chunk: int) -> list[int]:
        """Numbers of the chunks holding at least one upper block, ascending (the
        regex skips runs of zero bytes at C speed)."""
        out: list[int] = []
        for p in sorted(self._pages):
            for m in _NONZERO.finditer(self._pages[p]):
                block = p * _PAGE_BLOCKS + m.start() * 8
                for c in range(block // blocks_per_chunk, (block + 7) // blocks_per_chunk + 1):
                    if (not out or c > out[-1]) and self.any_in(c * blocks_per_chunk, blocks_per_chunk):
                        out.append(c)
        return out

    # -- data ----------------------------------------------------------------------

    def pwrite(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Write whole blocks at a block-aligned offset; returns how many blocks were
        new to the upper. Zeros are not written but punched (a hole in .data reads as
        zeros): a guest zeroing its disk frees space instead of taking it."""
        size = len(data)
        assert not (offset | size) % BLOCK, "upper writes are whole blocks"
        if _is_zero(data):
            # Punched even where no bit is set: after a crash, .data may hold bytes of
            # writes whose bits were never synced (a block without its bit is not a hole).
            _punch(self._data, offset, size)
            self.punched = True
        else:
            start = offset - offset % CLUSTER
            tail = min(start + CLUSTER, self.size) - offset - size  # (< 0: across its end)
            if tail >= 0 and size < CLUSTER and self._cluster_empty(start):
                self._fill(start, offset, data, tail)
            else:
                _write_all(self._data, [data], offset)
            self.unsynced_bytes += size  # (the guest's bytes: what a crash could lose)
            if size >= MIN_BYTES:
                BEHIND.start(self, offset, size)  # (a stream of large writes: see behind.py)
        self.writes += 1
        first = offset // BLOCK
        return self._set(first, first + size // BLOCK)

    def _fill(self, start: int, offset: int, data: bytes | bytearray | memoryview, tail: int) -> None:
        """The cluster's first write takes all of it (see _cluster_empty); where the
        disk has no room for the zeros, the data alone, as a write without the fill
        (a nearly full store must take what fits: the zeros only spare ext4 work)."""
        end = offset + len(data)
        try:
            _write_all(self._data, [_CLUSTER_ZEROS[: offset - start], data, _CLUSTER_ZEROS[:tail]], start)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # The zeros that did land go again (their blocks are absent: nothing to keep),
            # so their space serves the data and the map's page.
            for at, length in ((start, offset - start), (end, tail)):
                if length:
                    _punch(self._data, at, length)
            _write_all(self._data, [data], offset)

    def _cluster_empty(self, start: int) -> bool:
        """No block of the cluster at `start` is present. A write into such a cluster
        writes all of it, zeros around the data (their bits stay clear: the zeros are
        never read, and a block with a clear bit holds nothing acknowledged), so the
        file is allocated a cluster at a time, as qcow2's is, without its copy of the
        cluster from below. Random 4 KiB writes into a sparse file otherwise leave it
        allocated block by block, and ext4 pays for that at every later write and
        writeback over the range (docs/developer-notes.md, "The block write path")."""
        p, at = divmod(start // BLOCK, _PAGE_BLOCKS)
        page = self._pages.get(p)
        return page is None or not any(page[at >> 3 : (at + _CLUSTER_BLOCKS) >> 3])

    def data_fd(self) -> int:
        return self._data

    def pread(self, offset: int, size: int) -> bytes:
        data = os.pread(self._data, size, offset)
        return data if len(data) == size else data + bytes(size - len(data))

    def pread_into(self, offset: int, buf: memoryview) -> None:
        """pread() into `buf`, all of it (a fold's reused buffer: no new memory)."""
        done = 0
        while done < len(buf):
            n = os.preadv(self._data, [buf[done:]], offset + done)
            if n == 0:
                buf[done:] = bytes(len(buf) - done)  # (past the file's end: zeros)
                return
            done += n

    # -- durability ------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return self.writes != self.synced_writes or not self.registered

    def capture(self) -> Sync | None:
        """What a sync now would make durable (writing thread), or None: nothing new."""
        if not self.dirty:
            return None
        pages = {p: bytes(self._pages[p]) for p in self._dirty_pages}
        self._dirty_pages.clear()  # (given back by failed() if the sync fails)
        sync = Sync(pages, self.writes, not self.registered, self.punched, self.unsynced_bytes)
        self.punched = False
        return sync

    def sync(self, job: Sync) -> None:
        """Make the captured state durable (a worker thread): data first, then the map."""
        (os.fsync if job.punched else os.fdatasync)(self._data)
        if job.pages or job.first:
            for page, raw in sorted(job.pages.items()):
                os.pwrite(self._map, raw, _MAP_AT + page * _PAGE)
            os.fdatasync(self._map)
        if job.first:
            fsync_dir(self.folder)
            fsync_dir(self.folder.parent)

    def synced(self, job: Sync) -> None:
        self.synced_writes = job.writes
        self.registered = True
        self.unsynced_bytes -= job.unsynced_bytes  # (what was written since stays counted)

    def failed(self, job: Sync) -> None:
        """The sync failed: its pages are still to be written."""
        self._dirty_pages.update(job.pages)
        self.punched = self.punched or job.punched


def _read_pages(map_fd: int) -> dict[int, bytearray]:
    """The map file's pages that hold a set bit (holes skipped: SEEK_DATA)."""
    pages: dict[int, bytearray] = {}
    pos = _MAP_AT
    while True:
        try:
            pos = os.lseek(map_fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data past pos
                return pages
            raise
        p = (pos - _MAP_AT) // _PAGE
        raw = os.pread(map_fd, _PAGE, _MAP_AT + p * _PAGE)
        if raw.count(0) != len(raw):
            pages[p] = bytearray(raw.ljust(_PAGE, b"\0"))
        pos = _MAP_AT + (p + 1) * _PAGE


_ZEROS = bytes(1 << 20)
_ZERO_BLOCK = bytes(BLOCK)
_CLUSTER_ZEROS = memoryview(_ZEROS)[:CLUSTER]
_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


def _is_zero(data: bytes | bytearray | memoryview) -> bool:
    if len(data) == BLOCK:
        return data == _ZERO_BLOCK  # (no slice of _ZEROS to make)
    if len(data) <= len(_ZEROS):
        return data == _ZEROS[: len(data)]
    return bytes(data).count(0) == len(data)


def _write_all(fd: int, buffers: list[bytes | bytearray | memoryview], offset: int) -> None:
    if len(buffers) == 1:
        done, total = os.pwrite(fd, buffers[0], offset), len(buffers[0])
    else:
        done, total = os.pwritev(fd, buffers, offset), sum(len(b) for b in buffers)
    if done < total:
        view = memoryview(b"".join(buffers))
        while done < total:
            done += os.pwrite(fd, view[done:], offset + done)


def _punch(fd: int, offset: int, length: int) -> None:
    if libc().fallocate(fd, _FALLOC_PUNCH, ctypes.c_long(offset), ctypes.c_long(length)) != 0:
        err = ctypes.get_errno()
        if err != errno.EOPNOTSUPP:
            raise OSError(err, os.strerror(err))
        os.pwrite(fd, _ZEROS[:length] if length <= len(_ZEROS) else bytes(length), offset)


def _close_later(*fds: int) -> None:
    """Close an epoch's files in a thread of their own: the last close of a deleted
    1 GiB upper frees its extents and page cache, 140 ms measured, which on the trio
    thread (where a fold's apply lets go of it) would stall every request meanwhile."""
    try:
        threading.Thread(target=_close_all, args=fds, name="casfs-close-upper", daemon=True).start()
    except RuntimeError:  # (at interpreter shutdown: no new threads)
        _close_all(*fds)


def _close_all(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
