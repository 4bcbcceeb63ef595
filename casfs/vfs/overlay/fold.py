"""The blocking halves of a read/write volume's write-back (run in worker threads).

FlushJob and FoldJob are what the trio thread captures (writeback.py); run_flush stores
dirty chunks and writes overlay rows; run_fold_dir / run_fold_block turn the overlay
into new tree or map blobs, snapshot n+1 and the new base. Each ends in one catalog
transaction, after the blobs it names are durable (Batch.commit's ordering). These
functions see the job and the store, never the view.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sqlite3
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from casfs.catalog import overlay, transaction
from casfs.catalog import volumes as rows
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.kinds import BlobKind
from casfs.lifecycle.faults import fault_point
from casfs.refcount import figures, ledger
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Entry, Tree, dir_entry
from casfs.store.ids import ZERO_ID, BlobId
from casfs.store.pools import SharedPool
from casfs.vfs.api import ROOT_INO
from casfs.vfs.overlay.files import FileSync, FileUppers, Key
from casfs.vfs.overlay.nodes import NO_LIMIT, Node
from casfs.vfs.overlay.spill import SpillJob
from casfs.vfs.overlay.stack import Frozen
from casfs.vfs.overlay.upper import BLOCK, Sync, Upper

_NOT_YET = SnapshotNo(0)


@dataclass
class FlushJob:
    chunks: list[tuple[InodeNo, ChunkNo, bytes, int]]  # ino, n, data, buffer version
    rows: list[tuple[object, ...]]
    deleted: list[InodeNo]
    cuts: dict[InodeNo, ChunkNo]
    next_ino: InodeNo
    logical: int
    ids: dict[tuple[InodeNo, ChunkNo], BlobId] = field(default_factory=dict)
    inos: set[InodeNo] = field(default_factory=set)  # the dirty inodes it carries (rows, or gone)
    # Directory entries: only the changed ones, or every entry of a `whole_dirs` listing.
    listings: list[InodeNo] = field(default_factory=list)  # directories whose entries it writes
    whole_dirs: list[InodeNo] = field(default_factory=list)
    entries: list[tuple[InodeNo, bytes, int, InodeNo]] = field(default_factory=list)  # dir, name, cookie, ino
    gone: list[tuple[InodeNo, bytes]] = field(default_factory=list)  # dir, name
    upper: Sync | None = None  # a block volume's upper file to make durable
    files: FileSync | None = None  # a directory volume's upper files to make durable
    spilled: SpillJob | None = None  # writes a directory volume kept in memory, to store

    @property
    def has_rows(self) -> bool:
        """Whether it changes catalog rows (a block volume's sync alone does not)."""
        return bool(self.chunks or self.rows or self.deleted or self.cuts or self.listings)


@dataclass
class FoldJob:
    rows: dict[InodeNo, Node]
    chunk_ids: dict[InodeNo, dict[ChunkNo, BlobId]]
    label: str | None
    logical: int
    new_root: BlobId = ZERO_ID
    size: int = 0
    snapshot: SnapshotNo = _NOT_YET  # set by the fold
    bases: dict[InodeNo, BlobId] = field(default_factory=dict)  # ino -> its id in the new root
    parents: dict[InodeNo, InodeNo] = field(default_factory=dict)  # ino -> a directory naming it there
    files: FileUppers | None = None  # a directory volume's upper files
    folded_files: list[Key] = field(default_factory=list)  # upper files now in blobs


def delete_inode_rows(conn: sqlite3.Connection, volume: str, ino: InodeNo, from_chunk: int = 0) -> None:
    """Drop an inode's overlay rows (its chunks from `from_chunk` on), releasing its chunks."""
    ledger.release(conn, overlay.delete_inode(conn, volume, ino, from_chunk))


def run_flush(repo: Repository, volume: str, job: FlushJob) -> None:
    """Store the job's chunks as blobs, then write its rows in one transaction. A job
    without chunks (a directory volume's data is in its upper files) touches no blob:
    it still commits while the store refuses new blobs."""

    def write_rows(conn: sqlite3.Connection) -> None:
        for ino in job.deleted:
            delete_inode_rows(conn, volume, ino)
        for ino, cut in job.cuts.items():
            if ino not in job.deleted:
                delete_inode_rows(conn, volume, ino, from_chunk=cut)
        overlay.put_inodes(conn, job.rows)
        overlay.put_entries(conn, volume, job.whole_dirs, job.gone, job.entries)
        for (ino, n), bid in job.ids.items():
            old = overlay.put_chunk(conn, volume, ino, n, bid)
            if old is not None:
                ledger.release(conn, [old])
            ledger.retain(conn, [bid])
        overlay.flushed(conn, volume, job.next_ino, job.logical)
        if job.ids:  # chunks held by overlay rows: who shares them is not followed
            figures.changed(conn, [f"volume:{volume}"])

    if not job.chunks:
        with transaction(repo.conn) as conn:  # (releases only: no lock against gc needed)
            write_rows(conn)
        return
    with repo.batch() as batch:
        job.ids.update(_put_all(batch, (((ino, n), data) for ino, n, data, _ in job.chunks)))
        batch.commit(then=write_rows)


def _publish(
    batch: ledger.Batch,
    volume: str,
    base: BlobId,
    next_ino: InodeNo,
    job: FoldJob,
    upper: int | None = None,
    keep: InodeNo | None = None,
) -> None:
    """In one transaction make the fold's root snapshot n+1 and the new base, and
    empty the overlay but `keep`'s row (and forget the `upper` epoch it folded)."""

    def publish(conn: sqlite3.Connection) -> None:
        job.snapshot = rows.add_snapshot(conn, volume, job.new_root, job.size, next_ino, job.label)
        ledger.retain(conn, [job.new_root, job.new_root])  # the snapshot's and the base's
        ledger.release(conn, [base])
        chunks = [
            c for c in overlay.fold(conn, volume, job.new_root, job.size, next_ino, keep) if c != ZERO_ID
        ]
        ledger.release(conn, chunks)
        if upper is not None:
            overlay.drop_upper(conn, volume, upper)
        shared = batch.shared or bool(chunks)
        figures.folded(conn, volume, job.snapshot, base, job.new_root, batch.stored_bytes, shared)

    batch.commit(then=publish)


def run_fold_dir(
    repo: Repository, volume: str, base: BlobId, chunk_size: int, next_ino: InodeNo, job: FoldJob
) -> None:
    """Fold a directory volume's overlay into new tree and map blobs (the materialized
    directories, bottom-up)."""
    with repo.batch() as batch:
        folder = _Folder(repo, batch, chunk_size, job)
        folder.store_uppers()
        job.new_root = folder.fold_dir(ROOT_INO) if ROOT_INO in job.rows else base
        job.size = job.logical
        _publish(batch, volume, base, next_ino, job)


def run_fold_block(
    repo: Repository, volume: str, base: BlobId, next_ino: InodeNo, job: FoldJob, upper: Upper | None
) -> None:
    """Fold a block volume's changes into a new chunk map: chunks flushed by an older
    casfs (overlay rows), then the upper file's blocks over them. The upper's files
    are deleted once the snapshot naming their blobs has committed."""
    with repo.batch() as batch:
        root = job.rows.get(ROOT_INO)
        size = root.attrs.size if root else chunkmap.MapRoot.decode(repo.get_meta(base)).size
        changes = dict(job.chunk_ids.get(ROOT_INO, {}))
        cmap = chunkmap.ChunkMap(repo.get_meta, base)
        if upper is not None:
            changes.update(_put_all(batch, _upper_chunks(repo, cmap, changes, upper, size)))
        job.new_root = cmap.rewrite(batch.put_kind, changes, size)
        job.size = size
        fault_point("fold:before-publish")
        # The disk file's attributes stay: no part of a snapshot (a chunk map).
        _publish(batch, volume, base, next_ino, job, None if upper is None else upper.epoch, ROOT_INO)
    job.bases[ROOT_INO] = job.new_root
    if upper is not None:
        fault_point("fold:after-publish")
        upper.delete()


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


def _put_all(batch: ledger.Batch, chunks: Iterable[tuple[K, Data]]) -> dict[K, BlobId]:
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


@dataclass
class FreezeJob:
    """Freezing the upper epoch writes go to as the next snapshot (catalog only)."""

    epoch: int
    label: str | None
    snapshot: SnapshotNo = _NOT_YET  # given out by run_freeze
    taken: float = 0.0  # the time run_freeze recorded (its fold stores the snapshot with it)
    # An epoch made for this snapshot, nothing written to it (the volume is unchanged
    # since the last one): its files made durable and named here, then frozen.
    new: tuple[Upper, Sync] | None = None
    root: tuple[object, ...] | None = None  # the disk file's row, rewritten with the freeze


def run_freeze(repo: Repository, volume: str, job: FreezeJob) -> None:
    if job.new is not None:
        upper, first = job.new
        upper.sync(first)
    with transaction(repo.conn) as conn:
        if job.new is not None:
            overlay.add_upper(conn, volume, job.epoch)
        if job.root is not None:
            overlay.put_inodes(conn, [job.root])
        job.taken = time.time()
        job.snapshot = overlay.freeze_upper(conn, volume, job.epoch, job.label, job.taken)


@dataclass
class FrozenFold:
    """Folding the oldest frozen epoch into blobs over `base` (runs while writes go on
    into the epoch above it: it reads only what no one writes any more)."""

    frozen: Frozen
    base: BlobId
    size: int
    next_ino: InodeNo
    new_root: BlobId = ZERO_ID


def run_fold_frozen(repo: Repository, volume: str, job: FrozenFold) -> None:
    """Store a frozen epoch's chunks, then in one transaction add its snapshot (the
    number and time it was taken with), make it the base and forget the epoch; its
    files go after the commit."""
    upper, frozen = job.frozen.upper, job.frozen
    with repo.batch() as batch:
        cmap = chunkmap.ChunkMap(repo.get_meta, job.base)
        changes = _put_all(batch, _upper_chunks(repo, cmap, {}, upper, job.size))
        job.new_root = cmap.rewrite(batch.put_kind, changes, job.size)
        fault_point("fold:before-publish")

        def publish(conn: sqlite3.Connection) -> None:
            taken = (frozen.snapshot, frozen.taken)
            rows.add_snapshot(conn, volume, job.new_root, job.size, job.next_ino, frozen.label, taken)
            ledger.retain(conn, [job.new_root, job.new_root])  # the snapshot's and the base's
            ledger.release(conn, [job.base])
            rows.set_base(conn, volume, job.new_root, job.size, job.next_ino)
            overlay.drop_upper(conn, volume, upper.epoch)
            stored, shared = batch.stored_bytes, batch.shared
            figures.folded(conn, volume, frozen.snapshot, job.base, job.new_root, stored, shared)

        batch.commit(then=publish)
    fault_point("fold:after-publish")
    upper.delete()


def _upper_chunks(
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


class _Folder:
    """Builds the new tree bottom-up from the materialized directories."""

    def __init__(self, repo: Repository, batch: ledger.Batch, chunk_size: int, job: FoldJob) -> None:
        self.repo = repo
        self.batch = batch
        self.cs = chunk_size
        self.job = job
        self._upper_ids: dict[tuple[InodeNo, int, ChunkNo], BlobId] = {}

    def store_uppers(self) -> None:
        """Every upper file's chunks, stored at once before the walk: one pool keeps
        both cores busy across files (most are a chunk or two, too few to share)."""
        files = self.job.files
        if files is None:
            return
        rows = self.job.rows.values()
        keys = [(n.ino, n.upper) for n in rows if n.is_file and n.upper is not None and n.attrs.nlink]
        sizes = {ino: self.job.rows[ino].attrs.size for ino, _ in keys}

        def chunks() -> Iterator[tuple[tuple[InodeNo, int, ChunkNo], bytes]]:
            for ino, gen in keys:
                with open(files.path((ino, gen)), "rb", buffering=0) as f:
                    for n, data in UpperReader(f.fileno(), sizes[ino], self.cs).chunks():
                        yield (ino, gen, n), data

        self._upper_ids = _put_all(self.batch, chunks())

    def fold_dir(self, ino: InodeNo) -> BlobId:
        node = self.job.rows[ino]
        if node.listing is None:
            # Copied up with its parent, never entered: same entries, maybe new attrs.
            tree = Tree.decode(self.repo.get_meta(node.base))
            tree.attrs = node.tree_attrs()
        else:
            entries = [self._entry(ino, name, child) for name, (_, child) in node.listing.entries.items()]
            tree = Tree(node.tree_attrs(), self.cs, entries)
        bid = self.batch.put(tree.encode(), BlobKind.TREE)
        self.job.bases[ino] = bid
        return bid

    def _entry(self, parent: InodeNo, name: bytes, ino: InodeNo) -> Entry:
        node = self.job.rows[ino]
        self.job.parents[ino] = parent
        if node.is_dir:
            return dir_entry(name, node.attrs.mode, ino, self.fold_dir(ino))
        if node.is_file:
            content = self._content(node)
            self.job.bases[ino] = content
            return Entry(name, node.tree_attrs(), content)
        return Entry(name, node.tree_attrs(), node.target if stat.S_ISLNK(node.attrs.mode) else b"")

    def _content(self, node: Node) -> BlobId:
        if node.upper is not None:
            return self._upper_content(node, node.upper)
        changes = dict(self.job.chunk_ids.get(node.ino, {}))
        count = chunkmap.n_chunks(node.attrs.size, self.cs)
        for n in map(ChunkNo, range(min(node.base_limit, count), count)):
            changes.setdefault(n, ZERO_ID)
        if node.base == ZERO_ID:
            ids = [changes.get(ChunkNo(n), ZERO_ID) for n in range(count)]
            return chunkmap.build_content(self.batch.put_kind, ids, node.attrs.size, self.cs)
        mapped = overlay.blob_kind(self.repo.conn, node.base) == BlobKind.MAP_ROOT
        content = chunkmap.Content(self.repo.get_meta, node.base, node.attrs.size, self.cs, mapped)
        # Unchanged content keeps its id, unless a truncate cut it (base_limit): the old
        # id still names the bytes past the cut, which a later grow would bring back.
        uncut = node.base_limit >= NO_LIMIT
        if not changes and uncut and mapped == chunkmap.is_mapped(node.base, node.attrs.size, self.cs):
            return node.base
        return content.rewrite(self.batch.put_kind, changes, node.attrs.size)

    def _upper_content(self, node: Node, gen: int) -> BlobId:
        """A file whose content is its upper file: its chunks holding data stored as
        blobs (holes read nothing), then its map."""
        size, cs = node.attrs.size, self.cs
        ids = [
            self._upper_ids.get((node.ino, gen, ChunkNo(n)), ZERO_ID)
            for n in range(chunkmap.n_chunks(size, cs))
        ]
        self.job.folded_files.append((node.ino, gen))
        return chunkmap.build_content(self.batch.put_kind, ids, size, cs)


@dataclass
class UpperReader:
    """The chunks of an upper file that hold data, in canonical form (whole, or to the
    end of the file for the last: equal data dedups with what an import stores)."""

    fd: int
    size: int
    chunk_size: int

    def chunks(self) -> Iterator[tuple[ChunkNo, bytes]]:
        cs = self.chunk_size
        last = -1
        for start, end in _data_ranges(self.fd, self.size):
            for n in range(max(start // cs, last + 1), -(-end // cs)):
                want = min(cs, self.size - n * cs)
                data = os.pread(self.fd, want, n * cs)
                yield ChunkNo(n), data + bytes(want - len(data))
                last = n


def _data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """[start, end) of each run of data below `size` (SEEK_DATA/SEEK_HOLE: a sparse
    file folds in time for what it holds, not for its size)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: no data past pos
            return
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        pos = end
