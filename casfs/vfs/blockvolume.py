"""A mounted read/write block volume: one regular file (ROOT_INO) of a fixed size, a
base chunk map with an upper file over it (casfs.vfs.overlay.upper: each write is a
pwrite there, each fsync an fdatasync; content addressing waits for the fold). Chunks
an older casfs flushed as overlay rows sit between the two. No names: the namespace
calls are refused as a regular file refuses them. Synchronous and trio-free, like
casfs.vfs.dirvolume."""

from __future__ import annotations

import errno
import functools
import stat
import time
from collections.abc import Iterator

from casfs.catalog import overlay as rows
from casfs.catalog import transaction
from casfs.ids import ChunkNo, InodeNo
from casfs.kinds import VolumeKind
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Attrs
from casfs.store.ids import ZERO_ID
from casfs.store.uppers import remove_stale
from casfs.vfs.api import ROOT_INO, Fetched, NeedChunks, Piece, RwView, Stat, fs_error
from casfs.vfs.overlay.data import Data
from casfs.vfs.overlay.fold import FlushJob, FoldJob, run_fold_block
from casfs.vfs.overlay.nodes import Node
from casfs.vfs.overlay.upper import BLOCK, Upper
from casfs.vfs.overlay.writeback import now_ns


class BlockVolume(Data, volume_kind=VolumeKind.BLOCK):
    fixed_size = True
    upper: Upper | None  # the current epoch's upper file; None until the first write
    # Chunks the upper holds that nothing below it allocates (they add to st_blocks).
    _upper_only: int

    @property
    def rw(self) -> RwView:
        return self

    def _load(self) -> None:
        self.upper = None
        self._upper_only = 0
        super()._load()
        epochs = rows.uppers(self.repo.conn, self.name)
        if self.claimed:
            remove_stale(self.repo.path, self.name, set(epochs))
        if epochs:
            # One epoch at a time: a snapshot folds the upper before the next begins.
            self.upper = Upper.open(self.repo.path, self.name, epochs[-1], self.size_bytes)
            self.overlay.add(ROOT_INO)
            node = self.nodes[ROOT_INO]
            per = self.chunk_size // BLOCK
            self._upper_only = sum(
                self._chunk_ref(node, ChunkNo(n)) == ZERO_ID for n in self.upper.chunks(per)
            )

    def ensure_writable(self) -> None:
        claiming = not self.claimed
        super().ensure_writable()
        if claiming:
            remove_stale(self.repo.path, self.name, set() if self.upper is None else {self.upper.epoch})

    # -- reading: the upper's blocks, else what is below them ------------------------

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[Piece]:
        upper = self.upper
        if upper is None:
            return super().read_plan(ino, offset, size)
        node = self.node(ino)
        end = min(offset + size, node.attrs.size)
        cs = self.chunk_size
        per = cs // BLOCK
        pieces = []
        pos = offset
        while pos < end:
            q, start = divmod(pos, cs)
            n = ChunkNo(q)
            stop = min(cs, end - n * cs)
            mask = upper.mask(n * per, per)
            if not mask:
                pieces.append(Piece(start, stop, blob=self._chunk_ref(node, n)))
            else:
                at = start
                while at < stop:
                    b = at // BLOCK
                    up = mask >> b & 1
                    e = b + 1
                    while e * BLOCK < stop and (mask >> e & 1) == up:
                        e += 1
                    until = min(stop, e * BLOCK)
                    if up:
                        read = functools.partial(upper.pread, n * cs + at, until - at)
                        pieces.append(Piece(0, until - at, read=read))
                    else:
                        pieces.append(Piece(at, until, blob=self._chunk_ref(node, n)))
                    at = until
            pos = n * cs + stop
        return pieces

    def _blocks(self, node: Node) -> int:
        return super()._blocks(node) + self._upper_only * (self.chunk_size // 512)

    # -- writing: whole blocks into the upper file ------------------------------------

    def write(self, ino: InodeNo, offset: int, data: bytes, fetched: Fetched | None = None) -> int:
        """One pwrite into the upper file. A block the write covers only partly is
        completed from below first: raises NeedChunks if that needs a chunk not in
        `fetched` (fetch it, call again)."""
        node = self.node(ino)
        data = self._within_size(node, offset, data)
        if not data:
            return 0
        end = offset + len(data)
        first, last = offset // BLOCK, (end - 1) // BLOCK
        head, tail = offset - first * BLOCK, (last + 1) * BLOCK - end
        edges = ([first] if head else []) + ([last] if tail and (last != first or not head) else [])
        fetched = fetched or {}
        missing = [
            ref
            for b in edges
            if not (self.upper and self.upper.present(b))
            for ref in [self._chunk_ref(node, ChunkNo(b * BLOCK // self.chunk_size))]
            if ref != ZERO_ID and ref not in fetched
        ]
        if missing:
            raise NeedChunks(list(dict.fromkeys(missing)))
        self._check_mutation()
        buf: bytes | bytearray = data
        if head or tail:
            whole = bytearray(head + len(data) + tail)
            if head:
                whole[:head] = self._block(node, first, fetched)[:head]
            if tail:
                whole[-tail:] = self._block(node, last, fetched)[BLOCK - tail :]
            whole[head : head + len(data)] = data
            buf = whole
        upper = self._writable_upper()
        per = self.chunk_size // BLOCK
        fresh = [
            c
            for c in range(first // per, last // per + 1)
            if not upper.any_in(c * per, per) and self._chunk_ref(node, ChunkNo(c)) == ZERO_ID
        ]
        upper.pwrite(first * BLOCK, buf)
        self._upper_only += len(fresh)
        now = now_ns()
        node.set(mtime_ns=now, ctime_ns=now)
        self.overlay.add(ROOT_INO)
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()
        return len(data)

    def _block(self, node: Node, b: int, fetched: Fetched) -> bytes:
        """Block b's current bytes (BLOCK of them)."""
        if self.upper is not None and self.upper.present(b):
            return self.upper.pread(b * BLOCK, BLOCK)
        n, at = divmod(b * BLOCK, self.chunk_size)
        ref = self._chunk_ref(node, ChunkNo(n))
        chunk = fetched[ref] if ref != ZERO_ID else b""
        return chunk[at : at + BLOCK].ljust(BLOCK, b"\0")

    def _writable_upper(self) -> Upper:
        if self.upper is None:
            self.upper = Upper.create(self.repo.path, self.name, self.size_bytes)
        return self.upper

    # -- write-back: a sync of the upper file (rows only for what else changed) -----

    def prepare_flush(self) -> FlushJob | None:
        sync = self.upper.capture() if self.upper is not None else None
        job = super().prepare_flush()
        if sync is not None:
            if job is None:
                job = FlushJob([], [], [], {}, self.next_ino, self.logical)
                self._frozen = True
            job.upper = sync
        return job

    def run_flush(self, job: FlushJob) -> None:
        if job.upper is not None:
            assert self.upper is not None
            self.upper.sync(job.upper)
            if job.upper.first:
                with transaction(self.repo.conn) as conn:
                    rows.add_upper(conn, self.name, self.upper.epoch)
        if job.has_rows:
            super().run_flush(job)

    def apply_flush(self, job: FlushJob) -> None:
        super().apply_flush(job)
        if job.upper is not None and self.upper is not None:
            self.upper.synced(job.upper)
            if self.upper.dirty:
                self.dirty_since = time.monotonic()

    def abort_flush(self, job: FlushJob) -> None:
        if job.upper is not None and self.upper is not None:
            self.upper.failed(job.upper)
        super().abort_flush(job)

    def unsaved(self) -> list[tuple[str, int]]:
        held = super().unsaved()
        if self.upper is not None and self.upper.dirty:
            held = [(p, n) for p, n in held if p != "/"] + [("/", self.upper.unsynced_bytes)]
        return sorted(held)

    def _base_root(self, size: int) -> Node:
        st = self.repo.path.stat()
        # A block volume's mtime until it is written: when its base was made (the fold
        # that ended the last writes, or the volume's creation).
        changed = int(rows.base_time(self.repo.conn, self.name, self.base) * 1e9)
        attrs = Attrs(
            stat.S_IFREG | 0o644, st.st_uid, st.st_gid, 0, size, changed, changed, changed, ROOT_INO
        )
        return Node(attrs, base=self.base, parent=ROOT_INO)

    def _content(self, node: Node) -> chunkmap.Content | chunkmap.ChunkMap:
        content = self._contents.get(node.ino)
        if content is None:
            content = self._contents[node.ino] = chunkmap.ChunkMap(self.repo.get_meta, node.base)
        return content

    def run_fold(self, job: FoldJob) -> None:
        run_fold_block(self.repo, self.name, self.base, self.next_ino, job, self.upper)

    def apply_fold(self, job: FoldJob) -> None:
        super().apply_fold(job)
        self.upper = None  # (its files are gone; reads planned before keep it open)
        self._upper_only = 0

    @property
    def size_bytes(self) -> int:
        return self.nodes[ROOT_INO].attrs.size

    def _resize(self, node: Node, size: int) -> None:
        raise fs_error(errno.EPERM, "resize a block volume with the casfs CLI")

    def _within_size(self, node: Node, offset: int, data: bytes) -> bytes:
        if offset >= node.attrs.size and data:
            raise fs_error(errno.ENOSPC, "write past the end of a block volume")
        return data[: node.attrs.size - offset]

    # -- no names: what a regular file answers --------------------------------------

    def lookup(self, parent: InodeNo, name: bytes) -> Stat:
        self.node(parent)
        raise fs_error(errno.ENOTDIR)

    def readdir(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        self.node(ino)
        raise fs_error(errno.ENOTDIR)

    def readlink(self, ino: InodeNo) -> bytes:
        self.node(ino)
        raise fs_error(errno.EINVAL)

    def mknod(self, parent: InodeNo, name: bytes, mode: int, rdev: int, uid: int, gid: int) -> Stat:
        raise fs_error(errno.EPERM)

    def mkdir(self, parent: InodeNo, name: bytes, mode: int, uid: int, gid: int) -> Stat:
        raise fs_error(errno.EPERM)

    def symlink(self, parent: InodeNo, name: bytes, target: bytes, uid: int, gid: int) -> Stat:
        raise fs_error(errno.EPERM)

    def link(self, ino: InodeNo, new_parent: InodeNo, new_name: bytes) -> Stat:
        self.node(new_parent)
        raise fs_error(errno.ENOTDIR)

    def unlink(self, parent: InodeNo, name: bytes) -> None:
        self.node(parent)
        raise fs_error(errno.ENOTDIR)

    def rmdir(self, parent: InodeNo, name: bytes) -> None:
        self.node(parent)
        raise fs_error(errno.ENOTDIR)

    def rename(
        self, old_parent: InodeNo, old_name: bytes, new_parent: InodeNo, new_name: bytes, flags: int = 0
    ) -> None:
        self.node(old_parent)
        raise fs_error(errno.ENOTDIR)
