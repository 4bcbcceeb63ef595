"""FileBlobStore: one file per blob under the store's directory: the layout of every
local store made before catalog format 9, whose files the pack store (store.packstore)
reads, lists and deletes where they are. New stores write packs.

    blobs/ab/abcdef…       a published blob (one codec byte, then the payload), 0444
    tmp/<pid>-<random>/    the staging directory of one batch in flight
    damaged/<id>           a blob whose file failed its check when read (store.damaged)

Staged files are written in tmp/ and renamed into blobs/: a rename is atomic, so a
blob is either absent or whole. They are synced before the rename (fsync each file, or
one syncfs() for many) and the directories after it, so a published blob is durable.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from casfs.errors import MissingBlob
from casfs.store import BlobStore, Domain, Staging, codec
from casfs.store.damaged import DamagedMarks
from casfs.store.ids import ID_SIZE, BlobId
from casfs.store.packfile import dead_stagings
from casfs.store.verified import checked

if TYPE_CHECKING:
    import ctypes
    import logging


def _log() -> logging.Logger:
    import logging  # (at the first warning, not at import: see libc)

    return logging.getLogger(__name__)


# Below this many files, fsync each one; above, one syncfs() is far cheaper.
_SYNCFS_THRESHOLD = 16
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 8)  # Linux 4.14; Python exposes it on Linux only


@functools.cache
def libc() -> ctypes.CDLL:
    # Loaded at first use (a sync, a hole punched, a write-behind), not at import
    # (ctypes costs a CLI command that stores nothing). The process's own symbols, not
    # find_library: that forks ldconfig, and a daemon forking while it holds an fd on
    # its own mount (syncfs_path) hangs that mount for ever if it is killed then (the
    # child holds /dev/fuse, waiting for the answer to its FLUSH of the inherited fd).
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    import ctypes

    if libc().syncfs(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class FileBlobStore(DamagedMarks, BlobStore):
    """One file per blob: blobs/ab/abcdef…, written to tmp/ and renamed into place.
    (A whole BlobStore still: the conformance suite runs over it, and over the pack
    store reading a store written by it.)"""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blob_dir = root / "blobs"
        self._blob_dir_s = str(self.blob_dir)
        self.tmp_dir = root / "tmp"
        # damaged/<id>: a blob whose file failed its check when read. A writer storing
        # the same content again replaces the file instead of trusting it (heals it).
        self.damaged_dir = root / "damaged"
        # O_NOATIME: a read does not write the blob's inode (relatime updates the atime
        # at the first read after a file is made: an inode write per new blob read).
        # Refused (EPERM) where the store is not the reader's own: then without it.
        self._read_flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOATIME

    def create(self) -> None:
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        for i in range(256):
            (self.blob_dir / f"{i:02x}").mkdir(exist_ok=True)

    def path(self, bid: BlobId) -> Path:
        return Path(self.path_str(bid))

    def path_str(self, bid: BlobId) -> str:
        h = bid.hex()
        return f"{self._blob_dir_s}/{h[:2]}/{h}"

    def staging(self) -> FileStaging:
        return FileStaging(self)

    def _open(self, bid: BlobId) -> int:
        try:
            return os.open(self.path_str(bid), self._read_flags)
        except FileNotFoundError:
            raise MissingBlob(f"blob {bid.hex()} is missing") from None
        except PermissionError as e:
            if e.errno != errno.EPERM or not self._read_flags & os.O_NOATIME:
                raise
            self._read_flags &= ~os.O_NOATIME
            return self._open(bid)

    def get(self, bid: BlobId, domain: Domain | None = None) -> bytes:
        # os.open/fstat/read/close, where open() makes nine calls (buffering, ioctl). Read
        # as many bytes as the file holds: os.read(fd, 1 MiB) allocates (and faults in)
        # 1 MiB for a 64 KiB blob, and a read to EOF costs a second such call: that
        # tripled the time of a cached blob's read (70 us against 23).
        fd = self._open(bid)
        try:
            size = os.fstat(fd).st_size
            stored = os.read(fd, size)
            while len(stored) < size:  # (a short read before the end: keep reading)
                part = os.read(fd, size - len(stored))
                if not part:
                    break
                stored += part
        finally:
            os.close(fd)
        return checked(self, bid, stored, domain)

    def get_if_cached(self, bid: BlobId, max_stored: int, domain: Domain | None = None) -> bytes | None:
        """get(), only when the blob's file is at most `max_stored` bytes and all of it
        is in the page cache; else None, having read nothing (RWF_NOWAIT: the read
        fails rather than wait for the disk). For callers on an event loop, where the
        hand-off to a worker thread costs more than decoding a cached chunk."""
        fd = self._open(bid)
        try:
            size = os.fstat(fd).st_size
            if size > max_stored:
                return None
            buf = bytearray(size)
            try:
                if os.preadv(fd, [buf], 0, _RWF_NOWAIT) != size:
                    return None  # partly cached
            except BlockingIOError:
                return None
        finally:
            os.close(fd)
        return checked(self, bid, bytes(buf), domain)

    def has(self, bid: BlobId) -> bool:
        return os.path.exists(self.path_str(bid))

    def stored_size(self, bid: BlobId) -> int:
        try:
            return self.path(bid).stat().st_size
        except FileNotFoundError:
            raise MissingBlob(f"blob {bid.hex()} is missing") from None

    def delete(self, bid: BlobId) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(bid).unlink()

    def list(self) -> Iterator[BlobId]:
        for sub in sorted(self.blob_dir.iterdir()):
            for entry in os.scandir(sub):
                if len(entry.name) == 2 * ID_SIZE:
                    try:
                        yield BlobId(bytes.fromhex(entry.name))
                    except ValueError:
                        continue

    def recover_staging(self, owner_alive: Callable[[int], bool]) -> int:
        """Remove the entries of tmp/ whose process (the pid their name starts with) is
        not `owner_alive`, and anything there not named by a pid; returns how many
        files were removed."""
        removed = 0
        for entry in dead_stagings(self.tmp_dir, owner_alive):
            for sub in os.scandir(entry.path) if entry.is_dir() else []:
                os.unlink(sub.path)
                removed += 1
            if entry.is_dir():
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
                removed += 1
        return removed


class FileStaging(Staging):
    def __init__(self, store: FileBlobStore) -> None:
        import uuid  # (here, not at import: see libc)

        self.store = store
        self.dir = store.tmp_dir / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.dir.mkdir()
        self._dir_s = str(self.dir)
        self.pending: dict[BlobId, str] = {}

    def add(self, bid: BlobId, plain: bytes | memoryview) -> int:
        if bid in self.pending:
            return os.stat(self.pending[bid]).st_size
        stored = codec.encode(plain)
        tmp = os.path.join(self._dir_s, bid.hex())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
        try:
            view = memoryview(stored)
            while view:
                view = view[os.write(fd, view) :]
            if len(self.pending) < _SYNCFS_THRESHOLD:
                os.fsync(fd)
        except BaseException:
            remove_quietly(tmp)  # a partial file (a full disk): the error is the write's
            raise
        finally:
            os.close(fd)
        self.pending[bid] = tmp
        return len(stored)

    def publish(self) -> None:
        if not self.pending:
            self._remove_dir()
            return
        many = len(self.pending) > _SYNCFS_THRESHOLD
        dfd = os.open(self.store.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if many:
                syncfs(dfd)  # every staged file's data reaches disk before any rename
            touched: set[str] = set()
            for bid, tmp in self.pending.items():
                final = self.store.path_str(bid)
                os.rename(tmp, final)
                touched.add(os.path.dirname(final))
            if many:
                syncfs(dfd)
            else:
                for d in touched:
                    fsync_dir(d)
        finally:
            os.close(dfd)
        self.pending.clear()
        self._remove_dir()

    def discard(self) -> None:
        """Remove whatever is staged. Never raises: it runs on error paths, where the
        error that matters is the first one; what it cannot remove is logged (and the
        start-up sweep of a later process removes it)."""
        self.pending.clear()
        try:
            leftovers = list(os.scandir(self.dir))
        except FileNotFoundError:
            return
        except OSError as e:
            _log().warning("cannot list staging directory %s: %s", self.dir, e)
            return
        for entry in leftovers:
            remove_quietly(entry.path)
        self._remove_dir()

    def _remove_dir(self) -> None:
        try:
            self.dir.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            _log().warning("cannot remove staging directory %s: %s", self.dir, e)


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        _log().warning("cannot remove %s: %s", path, e)


def fsync_dir(path: str | Path) -> None:
    """fsync of a directory: the names made or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
