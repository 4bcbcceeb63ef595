"""A mounted read/write volume's state and write-back: what every volume kind shares.

State (all owned by the trio thread; the session's lock orders mutations, see
docs/developer-notes.md, "Concurrency protocol of the daemon"):

  nodes      every inode known in memory: overlay inodes (loaded at open) and base
             inodes met through lookup/readdir (dropped again on forget)
  overlay    the inos that have, or will have at the next flush, an overlay row
  chunk_ids  chunks an older casfs flushed to the overlay, ino -> {n: id} (file data
             now lives in upper files: casfs.vfs.overlay.files, casfs.vfs.overlay.upper)

Slow work is split so the trio thread never blocks: prepare_flush() captures a
consistent FlushJob (trio thread), run_flush() hashes, stores and commits it (worker
thread; blob data durable before the catalog transaction that names it), and
apply_flush() records the resulting chunk ids (trio thread). The fold is the same
with FoldJob. Between a prepare and its apply (or abort) the view is *frozen*: no
mutation may run (_touch asserts it), and what may still arrive without the lock (a
read's atime, a forget) is deferred until the view thaws.

A change stays dirty until a flush that contains it has committed: prepare_flush
captures the dirty sets without clearing them, apply_flush clears what the job
carried, abort_flush (after a failed run) changes nothing, so the next flush retries
it all. A flush's catalog writes are idempotent, so a retry is always safe.

The kinds (casfs.vfs.dirvolume, casfs.vfs.blockvolume) add how a base is read, copied
up and folded. casfs.vfs.volume.open_volume opens the class of the volume's kind.
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, TypeVar

from casfs.catalog import overlay as rows
from casfs.catalog import transaction
from casfs.catalog.volumes import generation, volume_row
from casfs.errors import CasfsError
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.store.ids import BlobId
from casfs.vfs.api import ROOT_INO, fs_error
from casfs.vfs.overlay.fold import FlushJob, FoldJob, FreezeJob, FrozenFold, delete_inode_rows, run_flush
from casfs.vfs.overlay.nodes import NO_LIMIT, Node
from casfs.vfs.overlay.upper import SyncJob

_DAY_NS = 86400 * 10**9
# File times come from the kernel's own clock for them (current_time(): the coarse
# one, a tick of a few ms). Under the writeback cache the kernel stamps a written file's
# mtime itself unless it already equals its clock's, and a stamp dirties the inode:
# one more SETATTR (the kernel writing its times back) per file. A finer stamp from
# here never equals the kernel's, so tar -x and cp -a paid that request for nearly
# every file they wrote. (Linux filesystems stamp with this clock too.)
_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)  # (Linux's number; Python 3.11 lacks the name)


def now_ns() -> int:
    return time.clock_gettime_ns(_COARSE)


class RwVolume(ABC):
    read_only = False
    immutable = False
    fixed_size = False
    volume_kind: ClassVar[VolumeKind]  # what the class opens (the volume row's kind)

    def __init_subclass__(cls, volume_kind: VolumeKind | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if volume_kind is not None:
            cls.volume_kind = volume_kind

    def __init__(
        self, repo: Repository, name: str, claim: Callable[[tuple[object, ...]], None] | None = None
    ) -> None:
        """A view of volume `name`. With `claim`, the caller has not claimed the volume:
        the view reads it as the catalog had it when loaded, and its first change calls
        `claim(generation)` (ensure_writable), which refuses if the volume has changed
        hands or content since (Stale) or another process holds it (Busy)."""
        self.repo = repo
        self.name = name
        self.claim = claim
        self.guard: Callable[[], bool] | None = None  # the session's "my task holds the lock"
        self._owner: int | None = None  # the thread that changes this view (the trio thread)
        self._load()

    def _load(self) -> None:
        self.generation = generation(self.repo.conn, self.name)
        row = volume_row(self.repo.conn, self.name)
        if row is None:
            raise CasfsError(f"no volume named {self.name!r}")
        assert row.kind == self.volume_kind, f"a {row.kind} volume opened as {self.volume_kind}"
        self.base = row.base
        self.chunk_size = row.chunk_size
        self.next_ino = row.next_ino
        self.logical = row.size  # bytes in regular files now (volumes.size as of the last flush)
        self.nodes: dict[InodeNo, Node] = {}
        self.overlay: set[InodeNo] = set()
        self.dirty_nodes: set[InodeNo] = set()
        self.deleted: set[InodeNo] = set()
        self.cuts: dict[InodeNo, ChunkNo] = {}
        self.dirty_bytes = 0
        self.dirty_since: float | None = None
        self.chunk_ids: dict[InodeNo, dict[ChunkNo, BlobId]] = {}
        self._contents: dict[InodeNo, chunkmap.Content | chunkmap.ChunkMap] = {}
        self._frozen = False  # a flush or fold is between its prepare and its apply/abort
        self._deferred_atime: set[InodeNo] = set()  # reads while frozen (relatime, applied at thaw)
        self._deferred_forget: set[InodeNo] = set()  # forgets while frozen
        self._load_overlay()
        if ROOT_INO not in self.nodes:
            self.nodes[ROOT_INO] = self._base_root(row.size)

    @property
    def claimed(self) -> bool:
        """This view holds the volume read/write (its changes are the volume's)."""
        return self.claim is None

    def ensure_writable(self) -> None:
        """Before the first change of an unclaimed view: claim the volume, as it was
        when this view read it (the kernel holds inodes of what it read)."""
        if self.claim is not None:
            self.claim(self.generation)
            self.claim = None
            # Unlinked inodes a crashed mount left open: nothing names them (_load_overlay
            # deletes them when the view is claimed from the start).
            for ino in [i for i, n in self.nodes.items() if n.attrs.nlink == 0 and i in self.overlay]:
                self._drop_inode(ino)

    def _load_overlay(self) -> None:
        conn = self.repo.conn
        with transaction(conn) if self.claimed else contextlib.nullcontext(conn):
            # Unlinked inodes that were still open when the daemon died: nothing names them.
            for ino in rows.orphans(conn, self.name) if self.claimed else ():  # (unclaimed: no writes)
                delete_inode_rows(conn, self.name, ino)
        loaded = rows.load(conn, self.name)
        for row in loaded.inodes:
            node = Node.from_row(row, loaded.entries.get(row[1]))
            self.nodes[node.ino] = node
            self.overlay.add(node.ino)
        self.chunk_ids = loaded.chunks

    # -- what a kind adds ------------------------------------------------------------

    @abstractmethod
    def _base_root(self, size: int) -> Node:
        """The root inode as the base has it (no overlay row)."""

    @abstractmethod
    def _content(self, node: Node) -> chunkmap.Content | chunkmap.ChunkMap:
        """A file's base content, to find its base chunks."""

    @abstractmethod
    def run_fold(self, job: FoldJob) -> None:
        """The fold's blocking half (a worker thread, holding a store job slot)."""

    @property
    @abstractmethod
    def size_bytes(self) -> int:
        """The volume's logical size now: the disk's, or its regular files' bytes."""

    def _copy_up(self, ino: InodeNo) -> None:
        """Give a changing inode an overlay row (a directory volume copies its parents up)."""
        self.node(ino)
        self.overlay.add(ino)

    def path_of(self, ino: InodeNo) -> str:
        """A path naming the inode now, or <inode N> if it has none (unlinked)."""
        return "/" if ino == ROOT_INO else f"<inode {ino}>"

    # -- state -------------------------------------------------------------------------

    def node(self, ino: InodeNo) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise fs_error(errno.ENOENT, f"inode {ino} is not known")
        return node

    def _touch(self, ino: InodeNo) -> None:
        """Mark an inode changed: it (and its parent's listing) go to the overlay. Every
        mutation passes here, so the protocol's checks are here."""
        self._check_mutation()
        self._copy_up(ino)
        self.dirty_nodes.add(ino)
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()

    def _check_mutation(self) -> None:
        assert not self._frozen, "a mutation ran inside a flush or fold (the view lock was not held)"
        assert self.claim is None, "a change to a volume this view has not claimed (ensure_writable)"
        assert self.guard is None or self.guard(), "a mutation without the view lock"
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        assert self._owner == me, "view state changed from a thread that does not own it"

    def forget(self, ino: InodeNo) -> None:
        if self._frozen:
            self._deferred_forget.add(ino)  # the running job may hold this inode's rows
            return
        node = self.nodes.get(ino)
        if node is None or ino == ROOT_INO:
            return
        if ino not in self.overlay:
            del self.nodes[ino]  # a base inode: found again from its tree when needed
            self._contents.pop(ino, None)
        elif node.attrs.nlink == 0:
            self._drop_inode(ino)

    def _drop_inode(self, ino: InodeNo) -> None:
        self.nodes.pop(ino, None)
        self.overlay.discard(ino)
        self.dirty_nodes.discard(ino)
        self.deleted.add(ino)
        self.cuts.pop(ino, None)
        self.chunk_ids.pop(ino, None)
        self._contents.pop(ino, None)

    def accessed(self, ino: InodeNo) -> None:
        """A program read the file (the adapter calls this for reads through a handle
        opened for reading without O_NOATIME; read_plan alone is no access: the digest
        control, read-ahead and the kernel's read-modify-write of a page plan reads too)."""
        if self._frozen:
            # A fold in flight has captured the overlay: marking an inode dirty now would
            # outlive the fold and name an inode whose parent is no longer copied up.
            self._deferred_atime.add(ino)
            return
        node = self.nodes.get(ino)
        if node is not None:
            self._relatime(node)

    def _relatime(self, node: Node) -> None:
        """relatime, for inodes already in the overlay: atime moves when it is older
        than mtime or ctime, or a day old. A base inode is not copied up for a read:
        reading an image-backed volume must not make it 'changed' (and snapshotted)."""
        if node.ino not in self.overlay:
            return
        now = now_ns()
        if (
            node.attrs.atime_ns <= max(node.attrs.mtime_ns, node.attrs.ctime_ns)
            or now - node.attrs.atime_ns > _DAY_NS
        ):
            node.set(atime_ns=now)
            self.dirty_nodes.add(node.ino)

    # -- describing (logs, and what a failed unmount could not save) -------------------

    def describe(self, ino: InodeNo) -> str:
        return f"volume {self.name}: {self.path_of(ino)}"

    def unsaved(self) -> list[tuple[str, int]]:
        """What is not yet committed: (path, bytes written since the last flush) per
        changed file, symlink or device (a directory's own change is its entries',
        which these name)."""
        held = self._unsaved_bytes()
        for ino in self.dirty_nodes | self.deleted:
            node = self.nodes.get(ino)
            if node is None or not node.is_dir:
                held.setdefault(ino, 0)
        return sorted((self.path_of(ino), n) for ino, n in held.items())

    def _unsaved_bytes(self) -> dict[InodeNo, int]:
        """Bytes not yet committed, per inode (a kind with upper files adds theirs)."""
        return {}

    # -- flushing: prepare (trio thread) / run (worker) / apply (trio thread) ----------

    @property
    def changed(self) -> bool:
        return bool(self.overlay or self.dirty_nodes or self.deleted)

    def prepare_flush(self) -> FlushJob | None:
        """Capture every change not yet committed (the view is frozen until apply_flush
        or abort_flush). Nothing is cleared here: a change stays dirty until committed."""
        self._thaw_deferred()
        if not (self.dirty_nodes or self.deleted or self.cuts):
            return None
        inos = sorted(i for i in self.dirty_nodes if i in self.nodes)
        node_rows = [self.nodes[i].row(self.name) for i in inos]
        job = FlushJob(node_rows, sorted(self.deleted), dict(self.cuts), self.next_ino, self.logical)
        job.inos = set(self.dirty_nodes)
        for ino in inos:  # a changed listing's directory is always dirty (_touch of the parent)
            listing = self.nodes[ino].listing
            if listing is not None:
                whole, present, gone = listing.pending()
                job.listings.append(ino)
                if whole:
                    job.whole_dirs.append(ino)
                job.entries += [(ino, name, cookie, child) for name, cookie, child in present]
                job.gone += [(ino, name) for name in gone]
        self._frozen = True
        return job

    def prepare_sync(self) -> SyncJob | None:
        """A flush that writes may go on beside, where all there is to make durable is
        the written upper file of an epoch the catalog names (a block volume's); None:
        flush as usual (prepare_flush)."""
        return None

    def run_sync(self, job: SyncJob) -> None:
        """A worker thread, without the view's lock: the job's upper files only."""
        raise NotImplementedError

    def apply_sync(self, job: SyncJob) -> None:
        raise NotImplementedError

    def abort_sync(self, job: SyncJob) -> None:
        raise NotImplementedError

    def run_flush(self, job: FlushJob) -> None:
        run_flush(self.repo, self.name, job)

    def apply_flush(self, job: FlushJob) -> None:
        """The job committed: what it carried is clean, unless changed again since."""
        self._frozen = False
        self.dirty_nodes -= job.inos
        for ino in job.listings:
            node = self.nodes.get(ino)
            if node is not None and node.listing is not None:
                node.listing.committed()
        self.deleted.difference_update(job.deleted)
        for ino, cut in job.cuts.items():
            if self.cuts.get(ino) == cut:
                del self.cuts[ino]
        self.dirty_since = time.monotonic() if self.dirty_nodes or self.deleted else None
        self._thaw_deferred()

    def abort_flush(self, job: FlushJob) -> None:
        """The job failed: everything it carried is still dirty (the next flush retries).
        The age clock restarts, so the timer retries after the dirty age, not every tick."""
        self._frozen = False
        self.dirty_since = time.monotonic()
        self._thaw_deferred()

    def _thaw_deferred(self) -> None:
        """Apply what arrived while the view was frozen (reads' atimes, forgets), once
        it no longer is."""
        atimes, self._deferred_atime = self._deferred_atime, set()
        forgets, self._deferred_forget = self._deferred_forget, set()
        for ino in atimes:
            self.accessed(ino)
        for ino in forgets:
            self.forget(ino)

    def flush_sync(self) -> None:
        """prepare, run and apply in one go (tests, and the daemon's exit path)."""
        job = self.prepare_flush()
        if job is not None:
            _finish(job, self.run_flush, self.abort_flush, self.apply_flush)

    # -- snapshots ---------------------------------------------------------------------

    def prepare_fold(self, label: str | None) -> FoldJob:
        """Call right after a flush, with the lock held: the catalog then matches memory.
        The view is frozen until apply_fold or abort_fold."""
        node_rows = {i: self.nodes[i].copy() for i in self.overlay if i in self.nodes}
        chunk_ids = {i: dict(c) for i, c in self.chunk_ids.items() if i in node_rows}
        self._frozen = True
        return FoldJob(node_rows, chunk_ids, label, self.logical)

    def abort_fold(self, job: FoldJob) -> None:
        """The fold failed: its transaction did not commit, the overlay stays as it was."""
        self._frozen = False
        self._thaw_deferred()

    def apply_fold(self, job: FoldJob) -> None:
        self._frozen = False
        self.base = job.new_root
        for ino in list(self.overlay):
            node = self.nodes.get(ino)
            if node is None:
                continue
            if node.attrs.nlink == 0:
                continue  # unlinked but open: stays in memory only, its data still buffered below
            node.base = job.bases.get(ino, node.base)
            # A file's parent goes stale when it moves or loses a name (only a directory's
            # is kept up to date); the next copy-up must materialize where it is now.
            node.parent = job.parents.get(ino, node.parent)
            node.base_limit = NO_LIMIT
            node.listing = None
        self.overlay = {i for i in self.overlay if i in self.nodes and self.nodes[i].attrs.nlink == 0}
        self.chunk_ids = {i: c for i, c in self.chunk_ids.items() if i in self.overlay}
        self._folded()
        self._thaw_deferred()  # (a read during the fold is now of a base inode: no atime)

    def _folded(self) -> None:
        """Forget what described the old base (a kind adds its own)."""
        self._contents.clear()

    # -- O(1) snapshots: only block volumes freeze (casfs.vfs.blockvolume) -------------

    def prepare_freeze(self, label: str | None) -> FreezeJob | None:
        return None

    def run_freeze(self, job: FreezeJob) -> None:
        raise NotImplementedError

    def apply_freeze(self, job: FreezeJob) -> None:
        raise NotImplementedError

    def abort_freeze(self, job: FreezeJob) -> None:
        raise NotImplementedError

    def prepare_background_fold(self) -> FrozenFold | None:
        return None

    def run_background_fold(self, job: FrozenFold) -> None:
        raise NotImplementedError

    def apply_background_fold(self, job: FrozenFold) -> None:
        raise NotImplementedError

    def abort_background_fold(self, job: FrozenFold) -> None:
        raise NotImplementedError

    def snapshot_sync(self, label: str | None = None) -> SnapshotNo:
        """flush + fold in this thread; the caller holds a job slot (a fold is heavy work)."""
        self.flush_sync()
        return _finish(self.prepare_fold(label), self.run_fold, self.abort_fold, self.apply_fold).snapshot

    def close(self, snapshot: bool = True) -> SnapshotNo | None:
        """Flush; then, if anything changed since the base, take a snapshot. A view that
        never claimed its volume changed nothing and leaves it as it is."""
        if not self.claimed:
            return None
        self.flush_sync()
        if snapshot and self.overlay:
            from casfs.lifecycle.queue import job_slot

            with job_slot(self.repo, f"snapshot {self.name}"):
                return self.snapshot_sync()
        return None


J = TypeVar("J")


def _finish(job: J, run: Callable[[J], None], abort: Callable[[J], None], apply: Callable[[J], None]) -> J:
    """A prepared job run in this thread, then applied (or aborted: it stays dirty)."""
    try:
        run(job)
    except BaseException:
        abort(job)
        raise
    apply(job)
    return job
