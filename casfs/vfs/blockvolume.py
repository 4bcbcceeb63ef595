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
from typing import Unpack

from casfs.catalog import overlay as rows
from casfs.catalog import transaction
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Attrs
from casfs.store.ids import ZERO_ID
from casfs.store.uppers import remove_stale
from casfs.vfs.api import ROOT_INO, Changes, Fetched, NeedChunks, Piece, RwView, Stat, fs_error
from casfs.vfs.chunks import plan_pieces
from casfs.vfs.overlay.data import Data
from casfs.vfs.overlay.fold import (
    FlushJob,
    FoldJob,
    FreezeJob,
    FrozenFold,
    run_fold_block,
    run_fold_frozen,
    run_freeze,
)
from casfs.vfs.overlay.nodes import NO_LIMIT, Node
from casfs.vfs.overlay.stack import Frozen, UpperStack
from casfs.vfs.overlay.upper import BLOCK, SyncJob, Upper
from casfs.vfs.overlay.writeback import _finish, now_ns


class BlockVolume(Data, volume_kind=VolumeKind.BLOCK):
    fixed_size = True
    uppers: UpperStack  # the epochs over the base: frozen ones (snapshots to fold), then the one written
    # Chunks the epochs hold that nothing below them allocates (they add to st_blocks).
    _upper_only: int
    _folding: bool  # a background fold of the oldest frozen epoch is running
    _written_ns: int  # time of the last write not yet set as the file's mtime (0: none)
    # The mtime the disk file's catalog row holds (None: no row). Writes do not rewrite
    # the row (a catalog transaction per fsync); a snapshot and an unmount do.
    _row_mtime: int | None

    @property
    def rw(self) -> RwView:
        return self

    @property
    def upper(self) -> Upper | None:
        """The epoch writes go to (None until the first write after a snapshot)."""
        return self.uppers.active

    def _load(self) -> None:
        self.uppers = UpperStack()
        self._upper_only = 0
        self._folding = False
        self._written_ns = 0
        super()._load()
        # The disk's content is the volume's base (with the epochs over it); an overlay
        # row of the file carries its attributes only, and stays across snapshots (no
        # part of them): not a change to snapshot (the epoch written is, below). Its base
        # and size columns are what they were when the row was written: folds move the
        # base on, a resize at rest the size, without rewriting the row.
        root = self.nodes[ROOT_INO]
        self._row_mtime = root.attrs.mtime_ns if ROOT_INO in self.overlay else None
        if ROOT_INO not in self.chunk_ids:
            self.overlay.discard(ROOT_INO)
        root.base, root.base_limit = self.base, NO_LIMIT
        if root.attrs.size != self.logical:
            root.set(size=self.logical)
        found = rows.uppers(self.repo.conn, self.name)
        if self.claimed:
            remove_stale(self.repo.path, self.name, {u.epoch for u in found})
        size = self.size_bytes
        for u in found:
            upper = Upper.open(self.repo.path, self.name, u.epoch, size)
            if u.snapshot is None:
                self.uppers.active = upper
                self.overlay.add(ROOT_INO)
            else:
                self.uppers.frozen.append(Frozen(upper, u.snapshot, u.label, u.taken or time.time()))
        self._recount()

    def _recount(self) -> None:
        node = self.nodes[ROOT_INO]
        per = self.chunk_size // BLOCK
        self._upper_only = sum(self._chunk_ref(node, ChunkNo(n)) == ZERO_ID for n in self.uppers.chunks(per))

    def accessed(self, ino: InodeNo) -> None:
        """No atime for a disk image: a hypervisor's reads would make every sync a
        catalog transaction (the file's overlay row), for a time no one reads."""

    def ensure_writable(self) -> None:
        if self.claimed:  # (every write asks)
            return
        super().ensure_writable()
        remove_stale(self.repo.path, self.name, {u.epoch for u in self.uppers.layers()})

    # -- reading: the newest epoch holding a block, else what is below them --------

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[Piece]:
        if not self.uppers:
            node = self.node(ino)
            if self.chunk_ids or node.base == ZERO_ID:
                return super().read_plan(ino, offset, size)
            # The base alone (a clone not written yet): its map says it all.
            return plan_pieces(self._content(node).chunk_run, node.attrs.size, self.chunk_size, offset, size)
        node = self.node(ino)
        below = functools.partial(self._chunk_ref, node)
        return self.uppers.plan(below, node.attrs.size, self.chunk_size, offset, size)

    def _settle_mtime(self) -> None:
        """Writes stamp a time only; the file's mtime and ctime take it when looked at
        (a dataclass copy per write would be a fifth of a 4 KiB write's cost)."""
        if self._written_ns:
            self.nodes[ROOT_INO].set(mtime_ns=self._written_ns, ctime_ns=self._written_ns)
            self._written_ns = 0

    def _row_stale(self) -> bool:
        """Whether the row of the disk file's attributes lacks the last write's time."""
        self._settle_mtime()
        return self._row_mtime not in (None, self.nodes[ROOT_INO].attrs.mtime_ns)

    def _stat(self, node: Node) -> Stat:
        self._settle_mtime()
        return super()._stat(node)

    def setattr(self, ino: InodeNo, *, fetched: Fetched | None = None, **changes: Unpack[Changes]) -> Stat:
        self._settle_mtime()  # (before: a time set explicitly wins over the last write's)
        return super().setattr(ino, fetched=fetched, **changes)

    def _blocks(self, node: Node) -> int:
        return super()._blocks(node) + self._upper_only * (self.chunk_size // 512)

    # -- writing: whole blocks into the upper file ------------------------------------

    def write(self, ino: InodeNo, offset: int, data: bytes, fetched: Fetched | None = None) -> int:
        """One pwrite into the upper file. A block the write covers only partly is
        completed from below first: raises NeedChunks if that needs a chunk not in
        `fetched` (fetch it, call again)."""
        node = self.node(ino)
        end = offset + len(data)
        if not (offset | end) % BLOCK and offset < end <= node.attrs.size:
            # Whole blocks within the disk (a hypervisor's writes): nothing to complete.
            self._check_mutation()
            self._put(node, offset // BLOCK, end // BLOCK, data)
            return len(data)
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
            if self.uppers.owner(b) is None
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
        self._put(node, first, last + 1, buf)
        return len(data)

    def _put(self, node: Node, first: int, stop: int, buf: bytes | bytearray) -> None:
        """Blocks [first, stop) into the written epoch."""
        upper = self.uppers.active or self._writable_upper()
        count = stop - first
        if upper.mask(first, count) != (1 << count) - 1:  # (an overwrite allocates nothing new)
            per = self.chunk_size // BLOCK
            self._upper_only += sum(
                1
                for c in range(first // per, (stop - 1) // per + 1)
                if not self.uppers.any_in(c * per, per) and self._chunk_ref(node, ChunkNo(c)) == ZERO_ID
            )
        upper.pwrite(first * BLOCK, buf)
        self._written_ns = now_ns()  # the file's mtime, set when next looked at (_settle_mtime)
        self.overlay.add(ROOT_INO)
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()

    def _block(self, node: Node, b: int, fetched: Fetched) -> bytes:
        """Block b's current bytes (BLOCK of them)."""
        owner = self.uppers.owner(b)
        if owner is not None:
            return owner.pread(b * BLOCK, BLOCK)
        n, at = divmod(b * BLOCK, self.chunk_size)
        ref = self._chunk_ref(node, ChunkNo(n))
        chunk = fetched[ref] if ref != ZERO_ID else b""
        return chunk[at : at + BLOCK].ljust(BLOCK, b"\0")

    def _writable_upper(self) -> Upper:
        if self.uppers.active is None:
            self.uppers.active = Upper.create(self.repo.path, self.name, self.size_bytes)
        return self.uppers.active

    # -- write-back: a sync of the upper file (rows only for what else changed) -----

    def prepare_flush(self) -> FlushJob | None:
        self._settle_mtime()
        sync = self.upper.capture() if self.upper is not None else None
        job = super().prepare_flush()
        if sync is not None:
            if job is None:
                job = FlushJob([], [], {}, self.next_ino, self.logical)
                self._frozen = True
            job.upper = sync
        return job

    def prepare_sync(self) -> SyncJob | None:
        """The written epoch's sync alone, when nothing else is to flush and the catalog
        names the epoch already (not its first sync): its run touches only the epoch's
        files, so writes go on meanwhile (the view is not frozen). They set bits the
        captured map pages do not carry, and a block's bit is written only after its
        data's fdatasync: each block reads back old or new. Syncs run one at a time, in
        the order they capture (casfs.fuse.rwsession.flush): a later page written
        before an earlier one would lose bits."""
        upper = self.upper
        if upper is None or not upper.registered or self._frozen:
            return None
        if self.dirty_nodes or self.deleted or self.cuts:
            return None
        self._settle_mtime()
        sync = upper.capture()
        return None if sync is None else SyncJob(upper, sync)

    def run_sync(self, job: SyncJob) -> None:
        job.upper.sync(job.sync)

    def apply_sync(self, job: SyncJob) -> None:
        job.upper.synced(job.sync)
        still = (self.upper is not None and self.upper.dirty) or self.dirty_nodes or self.deleted
        self.dirty_since = time.monotonic() if still else None

    def abort_sync(self, job: SyncJob) -> None:
        job.upper.failed(job.sync)
        self.dirty_since = time.monotonic()  # (retried after the dirty age, as a failed flush)

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
        if ROOT_INO in job.inos:
            self._row_mtime = self.nodes[ROOT_INO].attrs.mtime_ns  # (unchanged since prepare_flush)
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

    # -- snapshots: freeze now (O(1)), fold in the background -------------------------

    def prepare_fold(self, label: str | None) -> FoldJob:
        self._settle_mtime()
        return super().prepare_fold(label)

    def prepare_freeze(self, label: str | None) -> FreezeJob | None:
        """Right after a flush: the written epoch can become the next snapshot as it
        is, unless chunks an older casfs flushed changed it too: then None, and the
        snapshot is a fold. Nothing written since the last snapshot: an empty epoch is
        frozen, so this snapshot too is O(1) instead of a fold that would wait for the
        ones queued before it. The disk file's own attributes are no part of a snapshot
        (its root is a chunk map): their row, flushed, stays over the freeze and the
        fold that follows (any fold keeps it: overlay.fold's `keep`)."""
        if self.chunk_ids:
            return None
        new = None
        if self.upper is None:
            active = self._writable_upper()
            first = active.capture()
            assert first is not None and first.first  # (a new epoch: its files to name)
            new = (active, first)
        else:
            active = self.upper
            if active.dirty:
                return None
        self._frozen = True
        root = self.nodes[ROOT_INO].row(self.name) if self._row_stale() else None
        return FreezeJob(active.epoch, label, new=new, root=root)

    def run_freeze(self, job: FreezeJob) -> None:
        run_freeze(self.repo, self.name, job)

    def apply_freeze(self, job: FreezeJob) -> None:
        self._frozen = False
        assert self.upper is not None and self.upper.epoch == job.epoch
        if job.new is not None:
            self.upper.synced(job.new[1])
        if job.root is not None:
            self._row_mtime = self.nodes[ROOT_INO].attrs.mtime_ns
        self.uppers.frozen.append(Frozen(self.upper, job.snapshot, job.label, job.taken))
        self.uppers.active = None
        self.overlay.discard(ROOT_INO)  # (what it held is the frozen epoch's now)
        self._thaw_deferred()

    def abort_freeze(self, job: FreezeJob) -> None:
        self._frozen = False
        if job.new is not None and self.upper is not None:
            self.upper.failed(job.new[1])  # (the next flush names the empty epoch)
        self._thaw_deferred()

    def prepare_background_fold(self) -> FrozenFold | None:
        """The oldest frozen epoch to fold, unless none is waiting or one is folding."""
        if not self.uppers.frozen or self._folding:
            return None
        self._folding = True
        return FrozenFold(self.uppers.frozen[0], self.base, self.size_bytes, self.next_ino)

    def run_background_fold(self, job: FrozenFold) -> None:
        run_fold_frozen(self.repo, self.name, job)

    def apply_background_fold(self, job: FrozenFold) -> None:
        self._folding = False
        assert self.uppers.frozen and self.uppers.frozen[0] is job.frozen
        self.uppers.frozen.pop(0)
        self.base = job.new_root
        root = self.nodes[ROOT_INO]
        root.base, root.base_limit = job.new_root, NO_LIMIT
        self._folded()
        self._recount()

    def abort_background_fold(self, job: FrozenFold) -> None:
        self._folding = False

    def fold_frozen_sync(self) -> SnapshotNo | None:
        """Fold every frozen epoch in this thread; the last snapshot folded, if any."""
        last = None
        while (job := self.prepare_background_fold()) is not None:
            _finish(job, self.run_background_fold, self.abort_background_fold, self.apply_background_fold)
            last = job.frozen.snapshot
        return last

    def snapshot_sync(self, label: str | None = None) -> SnapshotNo:
        last = self.fold_frozen_sync()
        if last is not None and not self.overlay and not self.dirty_nodes:
            return last  # nothing written since the last snapshot taken
        if self._row_stale():
            self.dirty_nodes.add(ROOT_INO)  # (the flush before the fold rewrites it)
        return super().snapshot_sync(label)

    def close(self, snapshot: bool = True) -> SnapshotNo | None:
        if self.claimed:
            self.fold_frozen_sync()
        return super().close(snapshot)

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
        assert not self.uppers.frozen, "frozen epochs are folded before the written one"
        run_fold_block(self.repo, self.name, self.base, self.next_ino, job, self.upper)

    def apply_fold(self, job: FoldJob) -> None:
        super().apply_fold(job)
        self.uppers.active = None  # (its files are gone; reads planned before keep it open)
        self._upper_only = 0

    @property
    def size_bytes(self) -> int:
        return self.nodes[ROOT_INO].attrs.size

    def _resize(self, node: Node, size: int, fetched: Fetched) -> None:
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
