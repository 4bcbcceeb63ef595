"""A store on disk: its catalog, its blobs and its locks, opened together.

    STORE/catalog.db    the catalog (SQLite, WAL)
    STORE/packs/        blobs in pack files, and their index (store.packstore.PackBlobStore,
                        unless another store.BlobStore is given); a store made before
                        catalog format 9 also has STORE/blobs/ab/…, one file per blob,
                        read where they are
    STORE/blobs.json    or: the blobs are in a bucket (store.s3, `casfs init --blobs`)
    STORE/tmp/          staging files of batches in flight
    STORE/lock          flock: shared by every writer batch, exclusive for gc

SQLite connections: one per thread, owned by it. `conn` is the calling thread's own
(opened on first use; catalog.OwnedConnection refuses any other thread), so a flush
committing in a worker and the event loop claiming a volume never share a
transaction. Writers on different connections are serialized by SQLite's write lock
(BEGIN IMMEDIATE, with a busy timeout). close() closes them all.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from casfs import catalog
from casfs.catalog import blobs as blob_rows
from casfs.errors import Busy, Conflict, Corruption, NotFound, UsageError
from casfs.refcount.ledger import Batch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

    from casfs.store import BlobStore
    from casfs.store.cache import LRU
    from casfs.store.ids import BlobId

ENV_STORE = "CASFS_STORE"
META_CACHE_BYTES = 64 << 20


class FileLock:
    def __init__(self, path: str, exclusive: bool, timeout: float | None) -> None:
        import fcntl  # (here: the many commands that take no lock need not load it)

        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.fd, op | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    os.close(self.fd)
                    what = "gc" if exclusive else "a write"
                    raise Busy(f"the store is locked by another process; {what} cannot start") from None
                time.sleep(0.02)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Repository:
    """A store's catalog connections, blob store and locks.

    The local blob store, the metadata cache and `path` (a Path) are made at first use:
    a command that only touches the catalog (a clone, a listing, a delete) then imports
    none of the blob store's modules, nor pathlib, which were half of its start-up."""

    def __init__(self, path: str | os.PathLike[str], blobs: BlobStore | None = None) -> None:
        self.dir = os.fspath(path)  # the store's directory, as given
        self._path: Path | None = None
        self._blobs = blobs
        self.catalog_path = os.path.join(self.dir, "catalog.db")
        self.lock_path = os.path.join(self.dir, "lock")
        if blobs is None and os.path.exists(os.path.join(self.dir, "blobs.json")):
            # Blobs in a bucket: connected now, as before, so that a wrong setting (a
            # key, an endpoint) fails every command at once, not only those reading blobs.
            self._blobs = _blob_store(self.path)
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []  # every thread's, for close()
        self._conns_lock = threading.Lock()
        self._meta_cache: LRU[BlobId, bytes] | None = None
        # Called (from any thread) with each metadata blob that failed its check.
        self.on_corrupt: Callable[[BlobId], None] | None = None

    @property
    def path(self) -> Path:
        """The store's directory."""
        if self._path is None:
            from pathlib import Path

            self._path = Path(self.dir)
        return self._path

    @property
    def blobs(self) -> BlobStore:
        """The blob store: the one given, else the one STORE/ names (made at first use)."""
        b = self._blobs
        if b is None:
            with self._conns_lock:  # (two threads' first uses make one store)
                if self._blobs is None:
                    self._blobs = _blob_store(self.path)
                b = self._blobs
        return b

    @blobs.setter
    def blobs(self, store: BlobStore) -> None:
        self._blobs = store

    @property
    def meta_cache(self) -> LRU[BlobId, bytes]:
        """Verified tree and map blobs, shared by every thread (made at first use)."""
        c = self._meta_cache
        if c is None:
            from casfs.store.cache import LRU

            with self._conns_lock:
                if self._meta_cache is None:
                    self._meta_cache = LRU(META_CACHE_BYTES)
                c = self._meta_cache
        return c

    @classmethod
    def init(
        cls,
        path: Path,
        blobs: BlobStore | None = None,
        blob_url: str | None = None,
        blob_cache: int | None = None,
    ) -> Repository:
        """A new store at `path` (an existing one is opened); `blob_url` (s3://BUCKET/PREFIX)
        keeps its blobs in a bucket, checked reachable before anything is written, with a
        local cache of `blob_cache` bytes (None: the default)."""
        from pathlib import Path

        path = Path(path)
        if (path / "catalog.db").exists():
            _same_location(path, blob_url)
            repo = cls.open(path, blobs)
            return repo
        if path.exists() and any(path.iterdir()):
            raise UsageError(f"{path} exists, is not empty and is not a casfs store")
        if blob_url is not None:
            import dataclasses

            from casfs.store.s3.location import parse_url, write_location
            from casfs.store.s3.store import connect

            loc = parse_url(blob_url)
            if blob_cache is not None:
                loc = dataclasses.replace(loc, cache_bytes=blob_cache)
            import uuid

            loc = dataclasses.replace(loc, store_id=uuid.uuid4().hex)
            s3 = connect(path, loc)  # (before anything is written)
            s3.claim(loc.store_id)
            path.mkdir(parents=True, exist_ok=True)
            write_location(path, s3.loc)
            blobs = s3
        path.mkdir(parents=True, exist_ok=True)
        repo = cls(path, blobs)
        repo.blobs.create()
        os.close(os.open(repo.lock_path, os.O_WRONLY | os.O_CREAT, 0o644))
        from casfs.catalog.schema import create_tables  # (only here: every open would pay for it)

        create_tables(repo.conn)
        return repo

    @classmethod
    def open(cls, path: str | os.PathLike[str], blobs: BlobStore | None = None) -> Repository:
        repo = cls(path, blobs)
        if not os.path.exists(repo.catalog_path):
            raise NotFound(f"no casfs store at {repo.dir} (create one with `casfs init`)")
        catalog.check_and_migrate(repo.conn, repo.dir)
        return repo

    @property
    def conn(self) -> sqlite3.Connection:
        """The calling thread's catalog connection."""
        c: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = catalog.connect(self.catalog_path)
            with self._conns_lock:
                self._conns.append(c)
        return c

    def close(self, keep_catalog: bool = False, keep_blobs: bool = False) -> None:
        """Close every thread's connection (none may be in use: the work is done), and
        what the blob store holds open (unless `keep_blobs`: a store another Repository
        of this process lent it, and still uses).

        keep_catalog: close only the blob store, for a process that ends at once (the
        `casfs` program: cli.run). The last connection to close would checkpoint the
        WAL into catalog.db and delete it (4 fsyncs, and the next process's first commit
        makes a new WAL: 2 more); left to the process's end, SQLite sees the WAL as after
        a crash, which it is made for: every commit was synced (synchronous = FULL), and
        the next process to open the catalog reads it back from the WAL."""
        if not keep_catalog:
            with self._conns_lock:
                conns, self._conns = self._conns, []
            for c in conns:
                c.close()
            self._local = threading.local()
        if self._blobs is not None and not keep_blobs:
            self._blobs.close()

    def recover_staging(self, owner_alive: Callable[[int], bool]) -> int:
        """BlobStore.recover_staging, without opening a blob store for nothing: every
        store on disk stages in STORE/tmp/, so while that is empty there is nothing to
        recover (the case of nearly every command's start)."""
        if self._blobs is None:
            try:
                with os.scandir(os.path.join(self.dir, "tmp")) as entries:
                    if next(entries, None) is None:
                        return 0
            except FileNotFoundError:
                return 0
        return self.blobs.recover_staging(owner_alive)

    # -- blobs ---------------------------------------------------------------

    def is_live(self, bid: BlobId) -> bool:
        return blob_rows.is_live(self.conn, bid)

    def get(self, bid: BlobId) -> bytes:
        """Verified plaintext of a blob."""
        return self.blobs.get(bid)

    def get_many(self, bids: Sequence[BlobId]) -> Iterator[tuple[BlobId, bytes | Exception]]:
        """Verified plaintexts of a run of blobs, each as it is ready (BlobStore.get_many)."""
        return self.blobs.get_many(bids)

    def get_if_cached(self, bid: BlobId, max_stored: int = 1 << 18) -> bytes | None:
        """Verified plaintext if the blob can be read without waiting for the disk."""
        return self.blobs.get_if_cached(bid, max_stored)

    def get_meta(self, bid: BlobId) -> bytes:
        """Verified plaintext of a tree or map blob, through a shared cache. A blob that
        fails its check is reported to `on_corrupt` (the mount counts them) first."""
        plain = self.meta_cache.get(bid)
        if plain is None:
            plain = self.read_meta(bid)
            self.meta_cache.put(bid, plain, len(plain))
        return plain

    def read_meta(self, bid: BlobId) -> bytes:
        """get_meta without its cache (a caller that keeps the decoded form instead)."""
        try:
            return self.blobs.get(bid, "meta")
        except Corruption:
            if self.on_corrupt is not None:
                self.on_corrupt(bid)
            raise

    def batch(self) -> Batch:
        return Batch(self)

    # -- locks ---------------------------------------------------------------

    def writer_lock(self) -> FileLock:
        return FileLock(self.lock_path, exclusive=False, timeout=None)

    def exclusive_lock(self, timeout: float = 30.0) -> FileLock:
        return FileLock(self.lock_path, exclusive=True, timeout=timeout)


def _blob_store(path: Path) -> BlobStore:
    """The blob store STORE/blobs.json names (connected), else the local pack store."""
    from casfs.store.packstore import PackBlobStore

    if not (path / "blobs.json").exists():
        return PackBlobStore(path)  # (without importing the S3 modules)
    from casfs.store.s3.location import read_location

    loc = read_location(path)
    if loc is None:
        return PackBlobStore(path)
    from casfs.store.s3.store import connect

    return connect(path, loc)


def _same_location(path: Path, blob_url: str | None) -> None:
    """`casfs init --blobs URL` on an existing store: it must be that store's location."""
    if blob_url is None:
        return
    from casfs.store.s3.location import parse_url, read_location

    loc = read_location(path)
    want = parse_url(blob_url)
    if loc is None or (loc.bucket, loc.prefix) != (want.bucket, want.prefix):
        have = loc.url if loc is not None else "its own directory"
        raise Conflict(f"the store at {path} keeps its blobs in {have}, not {want.url}")


def store_path(arg: str | None) -> str:
    """The store named by -s/--store, else $CASFS_STORE."""
    value = arg or os.environ.get(ENV_STORE)
    if not value:
        raise UsageError(f"no store given: pass -s/--store PATH or set {ENV_STORE}")
    return value
