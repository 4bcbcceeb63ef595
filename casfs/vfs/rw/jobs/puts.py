"""Storing a job's chunks and publishing a fold: what the fold jobs share (worker side).

Chunks are hashed, compressed and written by a pool of threads; each job ends in one
catalog transaction, after the blobs it names are durable (Batch.commit's ordering).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from casfs.catalog import overlay
from casfs.catalog import volumes as rows
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.refcount import figures, ledger
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.store.ids import ZERO_ID, BlobId
from casfs.store.pools import SharedPool
from casfs.vfs.overlay.upper import BLOCK, Upper

NOT_YET = SnapshotNo(0)  # a snapshot number before the job's run gives one out


def delete_inode_rows(conn: sqlite3.Connection, volume: str, ino: InodeNo, from_chunk: int = 0) -> None:
    """Drop an inode's overlay rows (its chunks from `from_chunk` on), releasing its chunks."""
    ledger.release(conn, overlay.delete_inode(conn, volume, ino, from_chunk))


def publish_fold(
    batch: ledger.Batch,
    volume: str,
    base: BlobId,
    next_ino: InodeNo,
    new_root: BlobId,
    size: int,
    label: str | None,
    upper: int | None = None,
    keep: InodeNo | None = None,
) -> SnapshotNo:
    """In one transaction make the fold's root snapshot n+1 and the new base, and
    empty the overlay but `keep`'s row (and forget the `upper` epoch it folded)."""
    made: list[SnapshotNo] = []

    def publish(conn: sqlite3.Connection) -> None:
        made.append(rows.add_snapshot(conn, volume, new_root, size, next_ino, label))
        ledger.retain(conn, [new_root, new_root])  # the snapshot's and the base's
        ledger.release(conn, [base])
        chunks = [c for c in overlay.fold(conn, volume, new_root, size, next_ino, keep) if c != ZERO_ID]
        ledger.release(conn, chunks)
        if upper is not None:
            overlay.drop_upper(conn, volume, upper)
        shared = batch.shared or bool(chunks)
        figures.folded(conn, volume, made[-1], base, new_root, batch.stored_bytes, shared)

    batch.commit(then=publish)
    return made[-1]


# Chunks hashed, compressed and written at once by a pool of threads (BLAKE3 and zstd
# release the GIL), in tasks of `_GROUP` chunks (a future and a hand-off per chunk cost
# as much as hashing it; a group is one Batch.put_many: one catalog lookup, one staging
# lock and one write of pack records), a bounded number in flight so memory stays a
# few MiB whatever was written. Small jobs (an fsync of one file) stay in the calling thread.
_PUT_THREADS = max(2, os.cpu_count() or 2)
_GROUP = 16
_IN_FLIGHT = 2 * _PUT_THREADS
_SERIAL_BELOW = 4
_putters = SharedPool(_PUT_THREADS, "casfs-put")

K = TypeVar("K")
T = TypeVar("T")


@dataclass(frozen=True)
class Span:
    """A chunk wholly in an upper file: `length` bytes at `offset`, read by the worker
    into its reused buffer, consecutive ones at once."""

    upper: Upper
    offset: int
    length: int


# A chunk, or how to read it (in the worker: reading runs in parallel too).
Data = bytes | Callable[[], bytes] | Span

# Each put worker's buffer for the chunks of a group (kept: new memory for each chunk
# read cost page faults, and on this VM the host's too: 15% of a daemon fold's samples,
# copying into fresh pages). A group's chunks are stored in parts of at most this.
_BUFFER = 1 << 20
_local = threading.local()


def _put_group(batch: ledger.Batch, group: list[tuple[K, Data]]) -> list[tuple[K, BlobId]]:
    return list(zip((key for key, _ in group), _Group(batch).put(data for _, data in group), strict=True))


class _Group:
    """batch.put_many of a group's chunks, in parts of at most _BUFFER bytes: spans
    read into the worker's buffer (consecutive ones by one preadv), the rest as given."""

    def __init__(self, batch: ledger.Batch) -> None:
        self.batch = batch
        self.ids: list[BlobId] = []
        self.chunks: list[bytes | memoryview] = []
        self.held = 0  # bytes in chunks and run
        self.used = 0  # of buf, by chunks
        self.run: list[Span] = []  # spans to read next, at buf[used:]

    def put(self, items: Iterable[Data]) -> list[BlobId]:
        for data in items:
            if isinstance(data, Span) and data.length <= _BUFFER:
                if self.held + data.length > _BUFFER:
                    self._flush()
                last = self.run[-1] if self.run else None
                if last is not None and (
                    last.upper is not data.upper or last.offset + last.length != data.offset
                ):
                    self._read_run()
                self.run.append(data)
                self.held += data.length
                continue
            self._read_run()
            if isinstance(data, Span):
                chunk = data.upper.pread(data.offset, data.length)
            else:
                chunk = data() if callable(data) else data
            self.chunks.append(chunk)
            self.held += len(chunk)
            if self.held >= _BUFFER:
                self._flush()
        self._flush()
        return self.ids

    def _read_run(self) -> None:
        if not self.run:
            return
        buf: memoryview | None = getattr(_local, "buf", None)
        if buf is None:  # (made at a thread's first span: a directory fold reads none)
            buf = _local.buf = memoryview(bytearray(_BUFFER))
        first, at = self.run[0], self.used
        self.used += sum(s.length for s in self.run)
        first.upper.pread_into(first.offset, buf[at : self.used])
        for s in self.run:
            self.chunks.append(buf[at : at + s.length])
            at += s.length
        self.run.clear()

    def _flush(self) -> None:
        self._read_run()
        if self.chunks:
            self.ids += self.batch.put_many(self.chunks)
        self.chunks, self.held, self.used = [], 0, 0


def put_all(batch: ledger.Batch, chunks: Iterable[tuple[K, Data]]) -> dict[K, BlobId]:
    """batch.put of every chunk; {key: id}."""
    items = iter(chunks)
    first = list(itertools.islice(items, _SERIAL_BELOW))
    if len(first) < _SERIAL_BELOW:
        return dict(_put_group(batch, first))
    done: dict[K, BlobId] = {}
    pending: deque[Future[list[tuple[K, BlobId]]]] = deque()
    try:
        for group in _groups(itertools.chain(first, items), _GROUP):
            pending.append(_putters.get().submit(_put_group, batch, group))
            if len(pending) >= _IN_FLIGHT:
                done.update(pending.popleft().result())
        while pending:
            done.update(pending.popleft().result())
    finally:
        for fut in pending:  # (after a failure: nothing of this job left running)
            fut.cancel()
            with contextlib.suppress(BaseException):
                fut.result()
    return done


def _groups(items: Iterator[T], size: int) -> Iterator[list[T]]:
    while group := list(itertools.islice(items, size)):
        yield group


def upper_chunks(
    repo: Repository, cmap: chunkmap.ChunkMap, below: dict[ChunkNo, BlobId], upper: Upper, size: int
) -> Iterator[tuple[ChunkNo, Data]]:
    """Each chunk the upper file touches, whole: its upper blocks over what was below
    them (an older overlay chunk, or the base's). Yields how to read each, not its
    bytes: the put workers read them, so neither the reads of the upper file nor the
    base chunks under partly written ones wait in this one thread."""
    cs = cmap.chunk_size
    per = cs // BLOCK
    for c in upper.chunks(per):
        n = ChunkNo(c)
        want = min(cs, size - n * cs)
        if want <= 0:
            break
        mask = upper.mask(n * per, per)
        if mask == (1 << per) - 1:
            yield n, Span(upper, n * cs, want)
        else:
            ref = below[n] if n in below else cmap.chunk(n)
            yield n, functools.partial(_merged, repo, upper, ref, n * cs, want, mask, per)


def _merged(repo: Repository, upper: Upper, ref: BlobId, at: int, want: int, mask: int, per: int) -> bytes:
    """A partly written chunk at `at`: its upper blocks (`mask`) over chunk `ref`."""
    buf = bytearray(repo.get(ref)) if ref != ZERO_ID else bytearray()
    buf.extend(bytes(want - len(buf)))
    for first, stop in _runs(mask, per):
        lo, hi = first * BLOCK, min(stop * BLOCK, want)
        buf[lo:hi] = upper.pread(at + lo, hi - lo)
    return bytes(buf[:want])


def _runs(mask: int, count: int) -> Iterator[tuple[int, int]]:
    """[first, stop) of each run of set bits in the low `count` bits of mask."""
    i = 0
    while i < count:
        if mask >> i & 1:
            j = i
            while j < count and mask >> j & 1:
                j += 1
            yield i, j
            i = j
        else:
            i += 1
