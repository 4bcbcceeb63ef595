"""PackBlobStore: a local store's blobs in pack files (store.packfile), located by an
index of the store's own (store.packindex); the only code that knows where a local
blob's bytes are on disk.

    packs/<tag>-<n>.pack    a published pack, 0444: a staging's n-th (tag: its own)
    packs/index.sqlite      blob id -> pack, offset, length (with -wal, -shm)
    tmp/<pid>-<tag>/        the staging of one batch in flight (packfile)
    damaged/<id>            a blob that failed its check when read (store.damaged)
    blobs/ab/abcdef…        a blob of a store made before packs (catalog format < 9),
                            read where it is (store.local) while the index has no row
                            for it; new writes go to packs

Why packs: a read is one pread from a cached fd instead of an open, fstat, read and
close of a small file (and, cold, an inode and directory lookup per 64 KiB chunk); a
batch writes a few large files instead of one file, one rename and one directory
entry per blob (benchmarks/import_speed.py, docs/developer-notes.md).

Why old blob files stay where they are (not moved into packs by the format 8 -> 9
step): reading them costs nothing new, moving them would rewrite the whole store at
an upgrade (time, and twice its space until done), and they leave as gc frees them.

Reading without waiting (get_if_cached, for the event loop): a blob out of the page
cache has the pack window around it brought in by a background thread (store.around).

Writing: packs are written with O_DIRECT through a reused aligned buffer where the file
system takes it (store.packwrite: the copy into the page cache and its writeback cost
more CPU than hashing and compressing the blobs).

Publishing (LocalPackStaging.publish): each pack is fdatasync'd (a full one at once, by
a sync thread, while the adding threads go on: a worker that waited for the disk
stalled the whole pipeline of a fold or an import), renamed into packs/,
the directory fsync'd, then the index rows committed (synchronous=FULL): pack data is
durable before any row names it. A crash leaves at most packs without rows: in tmp/
(recover_staging), or in packs/ under a dead staging's tag (recover_staging again), or
a pack whose last row went before its unlink (compact).

Deleting drops the blob's row; the pack goes with its last row (so plain gc reclaims
wholly dead packs), and compact(below) rewrites packs mostly dead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from casfs.errors import Corruption, MissingBlob
from casfs.store import BlobStore, Domain, codec
from casfs.store.around import ReadAround
from casfs.store.damaged import DamagedMarks
from casfs.store.fdcache import FdCache
from casfs.store.ids import BlobId
from casfs.store.local import FileBlobStore, fsync_dir, remove_quietly
from casfs.store.packfile import ENTRY, PackStaging, StagedPack, close_pack, dead_stagings
from casfs.store.packindex import Location, PackIndex
from casfs.store.packspans import SPAN_GAP, SPAN_MAX, SpanBuffers, spans
from casfs.store.pools import SharedPool
from casfs.store.verified import Stored, checked

log = logging.getLogger(__name__)

# restic's default. 4-32 MiB imported a 1 GiB image alike here (92-250 MB/s, within
# the noise of a loaded 2-core machine); compaction rewrites at this granularity.
PACK_TARGET = 16 << 20
OPEN_PACKS = 64  # fds kept open (store.fdcache)
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 8)  # Linux 4.14; Python exposes it on Linux only
_SCRATCH_MIN = 1 << 17
_COLD = 64  # cold locations kept for the get() after (about the misses in flight at once)


class PackBlobStore(DamagedMarks, BlobStore):
    span_gap, span_max = SPAN_GAP, SPAN_MAX  # get_many's reads (store.packspans)

    def __init__(self, root: Path, pack_target: int = PACK_TARGET) -> None:
        self.root = root
        self.pack_dir = root / "packs"
        self._pack_dir_s = str(self.pack_dir)
        self.tmp_dir = root / "tmp"
        self.damaged_dir = root / "damaged"
        self.pack_target = pack_target
        self.index = PackIndex(self.pack_dir / "index.sqlite")
        self.fds = FdCache(OPEN_PACKS)
        self.around = ReadAround(self.fds)
        self._buffers = SpanBuffers()
        # Where blobs get_if_cached found cold are: the blocking get() that follows each
        # (casfs.vfs.readpolicy: here, or in a worker while the trio thread takes the
        # next request) reads there without asking the index again. At most _COLD.
        self._cold: dict[BlobId, Location] = {}
        # A store made before packs: its blob files, read (and deleted) where they are.
        self.legacy = FileBlobStore(root) if (root / "blobs").is_dir() else None

    def create(self) -> None:
        self.pack_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.index.create()

    def warm(self) -> None:
        self.index.warm()

    def close(self) -> None:
        self.around.close()
        self.fds.close()
        self.index.close()

    def pack_path(self, name: str) -> str:
        return f"{self._pack_dir_s}/{name}.pack"

    def staging(self) -> LocalPackStaging:
        return LocalPackStaging(self)

    # -- reads -----------------------------------------------------------------------

    def get(self, bid: BlobId, domain: Domain | None = None) -> bytes:
        stale = False
        cold = self._cold.pop(bid, None)  # (atomic under the GIL: workers share it)
        for _ in range(3):
            where = cold if cold is not None else self.index.locate(bid)
            cold = None
            if where is None:
                break
            try:
                stored = self._read(where)
            except FileNotFoundError:  # the pack went since (compaction moved the blob):
                self.index.forget(bid)  # look again
                continue
            try:
                plain = self._checked(bid, stored, domain)
            except Corruption:
                if self.index.locate(bid) == where:
                    raise
                stale = True  # stored again elsewhere since (healed by another process)
                continue
            if stale:  # (the old copy's failure marked it damaged: the new one is sound)
                self.clear_damaged(bid)
            return plain
        if self.legacy is not None:
            return self.legacy.get(bid, domain)
        raise MissingBlob(f"blob {bid.hex()} is missing")

    def get_many(
        self, bids: Sequence[BlobId], domain: Domain | None = None
    ) -> Generator[tuple[BlobId, bytes | Exception]]:
        """BlobStore.get_many: one index query for the run, one pread per span of blobs
        side by side in a pack (store.packspans), then each blob decoded and checked on
        its own slice. What the query did not find (a blob file of a store made before
        packs, a missing blob) and a span whose read fails (its pack compacted away
        since, an I/O error) go blob by blob through get(): its errors, for that blob."""
        bids = list(dict.fromkeys(bids))
        where = self.index.locate_many(bids)
        for name, span in spans(where, bids, self.span_gap, self.span_max):
            start = span[0][1]
            with self._buffers.take(span[-1][1] + span[-1][2] - start) as view:
                try:
                    got = self._read_into(name, start, view)
                except OSError:
                    failed = True
                else:
                    failed = False
                    # (a short read leaves a blob short: it fails its check)
                    stored = [view[o - start : min(o - start + n, got)] for _, o, n in span]
                    for (bid, _, _), blob, plain in zip(span, stored, codec.decode_many(stored), strict=True):
                        try:
                            yield bid, self._checked(bid, blob, domain, plain)
                        except Corruption as e:
                            # (a copy stored again since, healed, is read by get())
                            moved = self.index.locate(bid) not in (None, where[bid])
                            yield (bid, self._get_or_error(bid, domain)) if moved else (bid, e)
            if failed:
                yield from super().get_many([b[0] for b in span], domain)
        yield from super().get_many([bid for bid in bids if bid not in where], domain)

    def _get_or_error(self, bid: BlobId, domain: Domain | None) -> bytes | Exception:
        try:
            return self.get(bid, domain)
        except (Corruption, MissingBlob) as e:
            return e

    def _read(self, where: Location) -> bytes:
        name, offset, length = where
        f = self.fds.acquire(self.pack_path(name))
        assert f is not None
        try:
            return os.pread(f.fd, length, offset)
        finally:
            self.fds.release(f)

    def _read_into(self, name: str, offset: int, view: memoryview) -> int:
        f = self.fds.acquire(self.pack_path(name))
        assert f is not None
        try:
            return os.preadv(f.fd, [view], offset)
        finally:
            self.fds.release(f)

    def get_if_cached(self, bid: BlobId, max_stored: int, domain: Domain | None = None) -> bytes | None:
        """get(), only when the blob is at most `max_stored` bytes, its pack already
        open here and all of its bytes in the page cache; else None, having read
        nothing (RWF_NOWAIT: the read fails rather than wait for the disk). For callers
        on an event loop, where the hand-off to a worker thread costs more than
        decoding a cached chunk."""
        where = self.index.locate(bid)
        if where is None:
            return None if self.legacy is None else self.legacy.get_if_cached(bid, max_stored, domain)
        name, offset, length = where
        if length > max_stored:
            return None
        path = self.pack_path(name)
        f = self.fds.acquire(path, open_missing=False)
        if f is None:
            return None
        try:
            buf = _scratch(length)
            try:
                got = os.preadv(f.fd, [buf], offset, _RWF_NOWAIT)
            except BlockingIOError:
                got = -1
        finally:
            self.fds.release(f)
        if got != length:  # (none or part of it in the page cache)
            self.around.note_cold(path, offset)
            if len(self._cold) >= _COLD:  # (misses never read after: none is wrong, only stale)
                self._cold.clear()
            self._cold[bid] = where
            return None
        return self._checked(bid, buf, domain)

    def _checked(
        self, bid: BlobId, stored: Stored, domain: Domain | None, plain: bytes | None = None
    ) -> bytes:
        """checked(); a blob that fails it is looked up in the index again next time (a
        copy stored again, healed, is elsewhere)."""
        try:
            return checked(self, bid, stored, domain, plain)
        except Corruption:
            self.index.forget(bid)
            raise

    def has(self, bid: BlobId) -> bool:
        return self.index.has(bid) or (self.legacy is not None and self.legacy.has(bid))

    def stored_size(self, bid: BlobId) -> int:
        where = self.index.locate(bid)
        if where is not None:
            return where[2]
        if self.legacy is not None:
            return self.legacy.stored_size(bid)
        raise MissingBlob(f"blob {bid.hex()} is missing")

    def list(self) -> Iterator[BlobId]:
        after = b""
        while page := self.index.page(after, 1000):
            yield from page
            after = page[-1]
        if self.legacy is not None:
            for bid in self.legacy.list():
                if not self.index.has(bid):
                    yield bid

    # -- deletes ---------------------------------------------------------------------

    def delete(self, bid: BlobId) -> None:
        emptied = self.index.delete(bid)
        if emptied is not None:
            self.unlink_pack(emptied)
        if self.legacy is not None:
            self.legacy.delete(bid)

    def delete_many(self, bids: Sequence[BlobId]) -> None:
        for emptied in self.index.delete_many(bids):
            self.unlink_pack(emptied)
        if self.legacy is not None:
            self.legacy.delete_many(bids)

    def unlink_pack(self, name: str) -> None:
        """Remove the file of a pack whose row is gone."""
        path = self.pack_path(name)
        self.fds.forget(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def compact(self, below: float) -> tuple[int, int]:
        from casfs.store.packcompact import compact

        return compact(self, below)

    # -- leftovers -------------------------------------------------------------------

    def recover_staging(self, owner_alive: Callable[[int], bool]) -> int:
        """Remove the stagings of dead processes (tmp/<pid>-<tag>/), and the packs they
        renamed into packs/ without committing their rows; returns how many staged
        blobs were removed (.ent records, and a pre-pack staging's files)."""
        removed = 0
        for entry in dead_stagings(self.tmp_dir, owner_alive):
            tag = entry.name.partition("-")[2]
            if not entry.is_dir():
                os.unlink(entry.path)
                removed += 1
                continue
            for f in os.scandir(entry.path):
                seq, _, ext = f.name.partition(".")
                if ext == "ent":
                    removed += f.stat().st_size // ENTRY.size
                    if not self.index.has_pack(f"{tag}-{seq}"):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self.pack_path(f"{tag}-{seq}"))
                elif ext != "pack":
                    removed += 1  # (a blob file of a staging made before packs)
            shutil.rmtree(entry.path)
        return removed


_local = threading.local()


def _scratch(n: int) -> memoryview:
    """n bytes of a buffer of this thread's own, reused by its next call: for stored
    bytes that are decoded (into new bytes) before then. (A fresh 64 KiB bytearray per
    read was allocated and zeroed for nothing: about 1 us of a 37 us cached read.)"""
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < n:
        buf = _local.buf = bytearray(max(n, _SCRATCH_MIN))
    return memoryview(buf)[:n]


@dataclass
class _Pack(StagedPack):
    renamed: bool = False  # in packs/ (its rows maybe not committed)
    synced: Future[None] | None = None  # its sync (the fds are closed once it is done)


# Full packs are synced here, not by the thread that filled them. Two threads: syncs of
# different files overlap in the device's queue; more would only queue in the kernel.
_syncer = SharedPool(2, "casfs-sync")


def _sync(pack: _Pack) -> None:
    try:
        pack.out.finish()
        os.fchmod(pack.fd, 0o444)
        os.fdatasync(pack.fd)
    finally:
        close_pack(pack)


class LocalPackStaging(PackStaging[_Pack]):
    direct = True  # (store.packwrite: nothing reads a staged pack; a fold's blobs are cold)

    def __init__(self, store: PackBlobStore) -> None:
        store.tmp_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(store.tmp_dir, store.pack_target, _Pack)
        self.store = store
        self.written = 0  # bytes of the packs published

    def _seal(self, pack: _Pack) -> None:
        """Start making the pack durable (publish waits for it)."""
        pack.name = f"{self.tag}-{pack.seq}"
        pack.synced = _syncer.get().submit(_sync, pack)

    def _wait_synced(self, packs: list[_Pack]) -> None:
        """Wait for every pack's sync; then raise the first that failed."""
        failed: BaseException | None = None
        for p in packs:
            if p.synced is not None:
                try:
                    p.synced.result()
                except BaseException as e:
                    failed = failed or e
        if failed is not None:
            raise failed

    def publish(self) -> None:
        if not self._seal_last():
            return
        with self._lock:
            packs = [p for p in self._sealed if not p.published]
        self._wait_synced(packs)
        if packs:
            for p in packs:
                os.rename(self._path(p, "pack"), self.store.pack_path(p.name))
                p.renamed = True
            fsync_dir(self.store.pack_dir)
            emptied = self.store.index.publish([(p.name, p.size, p.entries) for p in packs])
            for p in packs:
                p.published = True
                self.written += p.size
            for name in emptied:  # (every blob in it was stored again: healed, or repacked)
                self.store.unlink_pack(name)
        with self._lock:
            self._done = True
        shutil.rmtree(self.dir, ignore_errors=True)

    def discard(self) -> None:
        """Remove what is staged and not published. Never raises (see Staging.discard)."""
        with self._lock:
            if self._done:
                return
            self._done = True
            packs, last, self._open = list(self._sealed), self._open, None
        if last is not None:
            close_pack(last)
        with contextlib.suppress(BaseException):
            self._wait_synced(packs)  # (their fds are closed then; the error is publish's)
        for p in packs:
            if p.renamed and not p.published:
                remove_quietly(self.store.pack_path(p.name))
        try:
            shutil.rmtree(self.dir)
        except FileNotFoundError:
            pass
        except OSError as e:  # what is left, recover_staging removes
            log.warning("cannot remove staging %s: %s", self.dir, e)
