"""A read/write block volume: one regular file (ROOT_INO) of a fixed size, a base chunk
map with the upper stack over it (casfs.vfs.overlay.stack: frozen epochs, snapshots
waiting to be folded, then the epoch written; each write a pwrite into it, each fsync
an fdatasync; content addressing waits for the fold). Chunks an older casfs flushed
as overlay rows sit between the base and the epochs. No names (`names` is None)."""

from __future__ import annotations

import errno
import functools
import stat
import time

from casfs.catalog import overlay as rows
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Attrs
from casfs.store.ids import ZERO_ID
from casfs.store.uppers import remove_stale
from casfs.vfs.api import ROOT_INO, Fetched, Job, NeedChunks, ReadPiece, SnapshotJob, fs_error
from casfs.vfs.overlay.nodes import NO_LIMIT, Node
from casfs.vfs.overlay.stack import Frozen, UpperStack
from casfs.vfs.overlay.upper import BLOCK, Upper
from casfs.vfs.plan import plan_pieces
from casfs.vfs.rw.below import chunk_blocks
from casfs.vfs.rw.jobs.flush import FlushJob
from casfs.vfs.rw.jobs.fold_block import BlockFold
from casfs.vfs.rw.jobs.freeze import Freeze
from casfs.vfs.rw.jobs.frozen_fold import FrozenFold
from casfs.vfs.rw.jobs.sync import SyncJob
from casfs.vfs.rw.volume import RwVolume, finish, now_ns


class BlockKind:
    volume_kind = VolumeKind.BLOCK
    fixed_size = True
    atime = False  # (RwVolume.accessed says why)
    namespace = None

    def __init__(self, vol: RwVolume) -> None:
        self.vol = vol
        self.uppers = (
            UpperStack()
        )  # the epochs over the base: frozen ones (snapshots to fold), then the one written
        # Chunks the epochs hold that nothing below them allocates (they add to st_blocks).
        self.upper_only = 0
        self.folding = False  # a background fold of the oldest frozen epoch is running
        self.written_ns = 0  # time of the last write not yet set as the file's mtime (0: none)
        # The mtime the disk file's catalog row holds (None: no row). Writes do not rewrite
        # the row (a catalog transaction per fsync); a snapshot and an unmount do.
        self.row_mtime: int | None = None

    @property
    def upper(self) -> Upper | None:
        """The epoch writes go to (None until the first write after a snapshot)."""
        return self.uppers.active

    @property
    def volume_size(self) -> int:
        return self.vol.nodes[ROOT_INO].attrs.size

    def load(self) -> None:
        # The disk's content is the volume's base (with the epochs over it); an overlay
        # row of the file carries its attributes only, and stays across snapshots (no
        # part of them): not a change to snapshot (the epoch written is, below). Its base
        # and size columns are what they were when the row was written: folds move the
        # base on, a resize at rest the size, without rewriting the row.
        vol = self.vol
        root = vol.nodes[ROOT_INO]
        self.row_mtime = root.attrs.mtime_ns if ROOT_INO in vol.overlay else None
        if ROOT_INO not in vol.chunk_ids:
            vol.overlay.discard(ROOT_INO)
        root.base, root.base_limit = vol.base, NO_LIMIT
        if root.attrs.size != vol.logical:
            root.set(size=vol.logical)
        found = rows.uppers(vol.repo.conn, vol.name)
        if vol.claimed:
            remove_stale(vol.repo.path, vol.name, {u.epoch for u in found})
        size = self.volume_size
        for u in found:
            upper = Upper.open(vol.repo.path, vol.name, u.epoch, size)
            if u.snapshot is None:
                self.uppers.active = upper
                vol.overlay.add(ROOT_INO)
            else:
                self.uppers.frozen.append(Frozen(upper, u.snapshot, u.label, u.taken or time.time()))
        self.recount()

    def recount(self) -> None:
        node = self.vol.nodes[ROOT_INO]
        per = self.vol.chunk_size // BLOCK
        ref = self.vol.chunk_ref
        self.upper_only = sum(ref(node, ChunkNo(n)) == ZERO_ID for n in self.uppers.chunks(per))

    def on_claim(self) -> None:
        remove_stale(self.vol.repo.path, self.vol.name, {u.epoch for u in self.uppers.layers()})

    def base_root(self, size: int) -> Node:
        vol = self.vol
        st = vol.repo.path.stat()
        # A block volume's mtime until it is written: when its base was made (the fold
        # that ended the last writes, or the volume's creation).
        changed = int(rows.base_time(vol.repo.conn, vol.name, vol.base) * 1e9)
        attrs = Attrs(
            stat.S_IFREG | 0o644, st.st_uid, st.st_gid, 0, size, changed, changed, changed, ROOT_INO
        )
        return Node(attrs, base=vol.base, parent=ROOT_INO)

    def content(self, node: Node) -> chunkmap.Content | chunkmap.ChunkMap:
        content = self.vol.contents.get(node.ino)
        if content is None:
            content = self.vol.contents[node.ino] = chunkmap.ChunkMap(self.vol.repo.get_meta, node.base)
        return content

    def copy_up(self, ino: InodeNo) -> None:
        self.vol.node(ino)
        self.vol.overlay.add(ino)

    def path_of(self, ino: InodeNo) -> str:
        return "/" if ino == ROOT_INO else f"<inode {ino}>"

    def dropped(self, ino: InodeNo) -> None:
        """(Never: the one inode is the root.)"""

    def folded(self) -> None:
        """(Nothing of the old base is kept beside the core's.)"""

    # -- reading: the newest epoch holding a block, else what is below them --------

    def plan(self, node: Node, offset: int, size: int) -> list[ReadPiece]:
        vol = self.vol
        if not self.uppers:
            if vol.chunk_ids or node.base == ZERO_ID:
                return vol.chunk_plan(node, offset, size)
            # The base alone (a clone not written yet): its map says it all.
            return plan_pieces(self.content(node).chunk_run, node.attrs.size, vol.chunk_size, offset, size)
        below = functools.partial(vol.chunk_ref, node)
        return self.uppers.plan(below, node.attrs.size, vol.chunk_size, offset, size)

    def settle(self) -> None:
        """Writes stamp a time only; the file's mtime and ctime take it when looked at
        (a dataclass copy per write would be a fifth of a 4 KiB write's cost)."""
        if self.written_ns:
            self.vol.nodes[ROOT_INO].set(mtime_ns=self.written_ns, ctime_ns=self.written_ns)
            self.written_ns = 0

    def row_stale(self) -> bool:
        """Whether the row of the disk file's attributes lacks the last write's time."""
        self.settle()
        return self.row_mtime not in (None, self.vol.nodes[ROOT_INO].attrs.mtime_ns)

    def blocks(self, node: Node) -> int:
        self.settle()
        return chunk_blocks(self.vol, node) + self.upper_only * (self.vol.chunk_size // 512)

    # -- writing: whole blocks into the upper file ------------------------------------

    def write_at(self, node: Node, offset: int, data: bytes, fetched: Fetched | None) -> int:
        """One pwrite into the upper file. A block the write covers only partly is
        completed from below first: raises NeedChunks if that needs a chunk not in
        `fetched` (fetch it, call again)."""
        end = offset + len(data)
        if not (offset | end) % BLOCK and offset < end <= node.attrs.size:
            # Whole blocks within the disk (a hypervisor's writes): nothing to complete.
            self.vol.check_mutation()
            self._put(node, offset // BLOCK, end // BLOCK, data)
            return len(data)
        if offset >= node.attrs.size and data:
            raise fs_error(errno.ENOSPC, "write past the end of a block volume")
        data = data[: node.attrs.size - offset]
        if not data:
            return 0
        end = offset + len(data)
        first, last = offset // BLOCK, (end - 1) // BLOCK
        head, tail = offset - first * BLOCK, (last + 1) * BLOCK - end
        edges = ([first] if head else []) + ([last] if tail and (last != first or not head) else [])
        fetched = fetched or {}
        cs = self.vol.chunk_size
        missing = [
            ref
            for b in edges
            if self.uppers.owner(b) is None
            for ref in [self.vol.chunk_ref(node, ChunkNo(b * BLOCK // cs))]
            if ref != ZERO_ID and ref not in fetched
        ]
        if missing:
            raise NeedChunks(list(dict.fromkeys(missing)))
        self.vol.check_mutation()
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
        upper = self.uppers.active or self.writable_upper()
        count = stop - first
        if upper.mask(first, count) != (1 << count) - 1:  # (an overwrite allocates nothing new)
            per = self.vol.chunk_size // BLOCK
            self.upper_only += sum(
                1
                for c in range(first // per, (stop - 1) // per + 1)
                if not self.uppers.any_in(c * per, per) and self.vol.chunk_ref(node, ChunkNo(c)) == ZERO_ID
            )
        upper.pwrite(first * BLOCK, buf)
        self.written_ns = now_ns()  # the file's mtime, set when next looked at (settle)
        vol = self.vol
        vol.overlay.add(ROOT_INO)
        if vol.dirty_since is None:
            vol.dirty_since = time.monotonic()

    def _block(self, node: Node, b: int, fetched: Fetched) -> bytes:
        """Block b's current bytes (BLOCK of them)."""
        owner = self.uppers.owner(b)
        if owner is not None:
            return owner.pread(b * BLOCK, BLOCK)
        n, at = divmod(b * BLOCK, self.vol.chunk_size)
        ref = self.vol.chunk_ref(node, ChunkNo(n))
        chunk = fetched[ref] if ref != ZERO_ID else b""
        return chunk[at : at + BLOCK].ljust(BLOCK, b"\0")

    def writable_upper(self) -> Upper:
        if self.uppers.active is None:
            vol = self.vol
            self.uppers.active = Upper.create(vol.repo.path, vol.name, self.volume_size)
        return self.uppers.active

    def resize(self, node: Node, size: int, fetched: Fetched) -> None:
        raise fs_error(errno.EPERM, "resize a block volume with the casfs CLI")

    def unsaved_bytes(self, held: dict[InodeNo, int]) -> None:
        if self.upper is not None and self.upper.dirty:
            held[ROOT_INO] = self.upper.unsynced_bytes

    # -- write-back: a sync of the upper file (rows only for what else changed) -----

    def add_to_flush(self, job: FlushJob | None) -> FlushJob | None:
        sync = self.upper.capture() if self.upper is not None else None
        if sync is None:
            return job
        assert self.upper is not None
        job = job or FlushJob.capture(self.vol, always=True)
        assert job is not None
        job.upper = (self.upper, sync)
        return job

    def flushed(self, job: FlushJob) -> None:
        if ROOT_INO in job.inos:
            self.row_mtime = self.vol.nodes[ROOT_INO].attrs.mtime_ns  # (unchanged since the capture)
        if job.upper is not None:
            job.upper[0].synced(job.upper[1])

    def flush_failed(self, job: FlushJob) -> None:
        if job.upper is not None:
            job.upper[0].failed(job.upper[1])

    def sync_job(self) -> Job | None:
        """The written epoch's sync alone (casfs.vfs.rw.jobs.sync), when nothing else is
        to flush and the catalog names the epoch already (not its first sync)."""
        upper, vol = self.upper, self.vol
        if upper is None or not upper.registered or vol.frozen:
            return None
        if vol.dirty_nodes or vol.deleted or vol.cuts:
            return None
        self.settle()
        sync = upper.capture()
        return None if sync is None else SyncJob(vol, upper, sync)

    # -- snapshots: freeze now (O(1)), fold in the background -------------------------

    def snapshot_job(self, label: str | None) -> SnapshotJob:
        return Freeze.capture(self, label) or BlockFold.capture(self, label)

    def background_fold_job(self) -> Job | None:
        return FrozenFold.capture(self)

    def fold_frozen_sync(self) -> SnapshotNo | None:
        """Fold every frozen epoch in this thread; the last snapshot folded, if any."""
        last = None
        while (job := FrozenFold.capture(self)) is not None:
            finish(job)
            last = job.frozen.snapshot
        return last

    def fold_now(self, label: str | None) -> SnapshotNo:
        """The frozen epochs folded, then the written one (a fold, not a freeze: a
        volume at rest keeps no epoch)."""
        vol = self.vol
        last = self.fold_frozen_sync()
        if last is not None and not vol.overlay and not vol.dirty_nodes:
            return last  # nothing written since the last snapshot taken
        if self.row_stale():
            vol.dirty_nodes.add(ROOT_INO)  # (the flush before the fold rewrites it)
        vol.flush_sync()
        return finish(BlockFold.capture(self, label)).snapshot

    def closing(self) -> None:
        self.fold_frozen_sync()
