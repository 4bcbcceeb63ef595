"""Where blob bytes live: the small backend interface and the one-file-per-blob store.

Lifecycle of a blob in a backend (containerd's content store is the model):

  stage    bytes are written under a private temporary name; invisible to get/has/list.
  publish  staged blobs become durable, then visible under their ids, all together.
           A crash before publish leaves only temporary files (swept at start-up);
           a crash during publish leaves each blob either absent or whole, never half.
  get      reads, decodes and re-hashes; wrong bytes are never returned.
  delete   idempotent: deleting an absent blob is not an error.

The backend knows nothing of refcounts: the catalog decides what is live.
"""

from __future__ import annotations

import contextlib
import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casfs.errors import Corruption, MissingBlob
from casfs.store import codec
from casfs.store.ids import ID_SIZE, BlobId, blob_id, verify_id

if TYPE_CHECKING:
    import logging


def _log() -> logging.Logger:
    import logging  # (at the first warning, not at import: see _libc)

    return logging.getLogger(__name__)


# Below this many files, fsync each one; above, one syncfs() is far cheaper.
_SYNCFS_THRESHOLD = 16
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 8)  # Linux 4.14; Python exposes it on Linux only


@functools.cache
def _libc() -> Any:
    # Loaded at the first sync, not at import: ctypes and find_library (which runs
    # ldconfig) cost a CLI command that stores nothing more than its own work.
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def syncfs(fd: int) -> None:
    import ctypes

    if _libc().syncfs(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Staging(ABC):
    """A batch of blobs on their way into a backend."""

    @abstractmethod
    def add(self, bid: BlobId, plain: bytes | memoryview) -> int:
        """Stage one blob (its id already computed); returns its stored size."""

    @abstractmethod
    def publish(self) -> None:
        """Make every staged blob durable and visible. Idempotent."""

    @abstractmethod
    def discard(self) -> None:
        """Forget staged blobs that were not published."""


class BlobStore(ABC):
    @abstractmethod
    def staging(self) -> Staging: ...

    @abstractmethod
    def get(self, bid: BlobId) -> bytes:
        """Verified plaintext. Raises MissingBlob, or Corruption naming the blob."""

    def get_if_cached(self, bid: BlobId, max_stored: int) -> bytes | None:
        """get() when it cannot wait for a disk or a network; None otherwise."""
        return None

    @abstractmethod
    def has(self, bid: BlobId) -> bool: ...

    @abstractmethod
    def stored_size(self, bid: BlobId) -> int: ...

    @abstractmethod
    def delete(self, bid: BlobId) -> None: ...

    @abstractmethod
    def list(self) -> Iterator[BlobId]: ...

    @abstractmethod
    def mark_damaged(self, bid: BlobId) -> None:
        """Record that a blob failed its check; get() does it for what it reads."""

    @abstractmethod
    def damaged(self) -> set[BlobId]:
        """Blobs recorded damaged: a writer of the same content stores it again."""

    @abstractmethod
    def clear_damaged(self, bid: BlobId) -> None:
        """A verified copy replaced the blob (idempotent)."""

    def put(self, plain: bytes) -> BlobId:
        """Store one data blob durably (convenience for small writers; takes no writer
        lock, so it is not for use while gc may run: use a ledger Batch)."""
        bid = blob_id(plain)
        st = self.staging()
        st.add(bid, plain)
        st.publish()
        return bid


class FileBlobStore(BlobStore):
    """One file per blob: blobs/ab/abcdef…, written to tmp/ and renamed into place.

    Measured against pack files: at 64 KiB chunks a file per blob imports faster than
    the disk reads (see benchmarks/import_speed.py), and deleting is a plain unlink,
    so gc needs no repacking.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blob_dir = root / "blobs"
        self._blob_dir_s = str(self.blob_dir)
        self.tmp_dir = root / "tmp"
        # damaged/<id>: a blob whose file failed its check when read. A writer storing
        # the same content again replaces the file instead of trusting it (heals it).
        self.damaged_dir = root / "damaged"

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

    def get(self, bid: BlobId) -> bytes:
        name = bid.hex()
        # os.open/os.read: three system calls, where open() makes nine (buffering, fstat, ioctl).
        try:
            fd = os.open(self.path_str(bid), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingBlob(f"blob {name} is missing") from None
        try:
            parts = []
            while True:
                part = os.read(fd, 1 << 20)
                if not part:
                    break
                parts.append(part)
        finally:
            os.close(fd)
        stored = parts[0] if len(parts) == 1 else b"".join(parts)
        return self._checked(bid, stored)

    def _checked(self, bid: BlobId, stored: bytes) -> bytes:
        try:
            return _verified(bid, stored)
        except Corruption:
            self.mark_damaged(bid)
            raise

    def mark_damaged(self, bid: BlobId) -> None:
        """Remember that this blob's file failed its check (best effort: a read-only
        store still reports the error, it only cannot remember it)."""
        try:
            self.damaged_dir.mkdir(exist_ok=True)
            (self.damaged_dir / bid.hex()).touch()
        except OSError as e:
            _log().warning("cannot record damaged blob %s: %s", bid.hex(), e)

    def damaged(self) -> set[BlobId]:
        """Blobs found damaged and not yet healed."""
        try:
            names = os.listdir(self.damaged_dir)
        except FileNotFoundError:
            return set()
        return {BlobId(bytes.fromhex(n)) for n in names if len(n) == 2 * ID_SIZE}

    def clear_damaged(self, bid: BlobId) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.damaged_dir / bid.hex()).unlink()

    def get_if_cached(self, bid: BlobId, max_stored: int) -> bytes | None:
        """get(), only when the blob's file is at most `max_stored` bytes and all of it
        is in the page cache; else None, having read nothing (RWF_NOWAIT: the read
        fails rather than wait for the disk). For callers on an event loop, where the
        hand-off to a worker thread costs more than decoding a cached chunk."""
        try:
            fd = os.open(self.path_str(bid), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingBlob(f"blob {bid.hex()} is missing") from None
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
        return self._checked(bid, bytes(buf))

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

    def sweep_tmp(self, owner_alive: Callable[[int], bool]) -> int:
        """Remove staging files whose process (the pid their name starts with) is not
        `owner_alive`; returns how many were removed."""
        removed = 0
        if not self.tmp_dir.exists():
            return 0
        for entry in os.scandir(self.tmp_dir):
            pid_text = entry.name.split("-", 1)[0]
            if pid_text.isdigit() and owner_alive(int(pid_text)):
                continue
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
        import uuid  # (here, not at import: see _libc)

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
            _remove_quietly(tmp)  # a partial file (a full disk): the error is the write's
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
                    _fsync_dir(d)
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
            _remove_quietly(entry.path)
        self._remove_dir()

    def _remove_dir(self) -> None:
        try:
            self.dir.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            _log().warning("cannot remove staging directory %s: %s", self.dir, e)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        _log().warning("cannot remove staged file %s: %s", path, e)


def _verified(bid: BlobId, stored: bytes) -> bytes:
    name = bid.hex()
    plain = codec.decode(stored, f"blob {name}")
    if not verify_id(bid, plain):
        raise Corruption(f"blob {name} is corrupt: its content hashes to {blob_id(plain).hex()}")
    return plain


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
