"""A mounted read/write volume: the core every kind shares, holding the kind it is.

The core (RwVolume) keeps the state, the claim, the guard and the counters; what differs
between a directory volume and a block volume is an object it holds (`kind`: a
casfs.vfs.rw.dirkind.DirKind or a casfs.vfs.rw.blockkind.BlockKind, see Kind below).
No class here inherits from another: a behaviour lives in exactly one place.

State (all owned by the trio thread; the session's lock orders mutations, see
docs/concurrency.md):

  nodes      every inode known in memory: overlay inodes (loaded at open) and base
             inodes met through lookup/readdir (dropped again on forget)
  overlay    the inos that have, or will have at the next flush, an overlay row
  chunk_ids  chunks an older casfs flushed to the overlay, ino -> {n: id} (file data
             now lives in upper files: casfs.vfs.overlay.files, casfs.vfs.overlay.upper)

Slow work is a Job (casfs.vfs.api.Job, one module each in casfs.vfs.rw.jobs): prepared
here on the trio thread (a consistent capture), run in a worker thread, then applied
or aborted here. Between a prepare and its apply (or abort) the view is *frozen*: no
mutation may run (check_mutation asserts it), and what may still arrive without the
lock (a read's atime, a forget) is deferred until the view thaws. A change stays dirty
until a flush that contains it has committed, so a failed job is simply retried.
"""

from __future__ import annotations

import contextlib
import errno
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar, Unpack

from casfs.catalog import overlay as rows
from casfs.catalog import transaction
from casfs.catalog.volumes import generation, volume_row
from casfs.errors import NotFound
from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import (
    ROOT_INO,
    Changes,
    Fetched,
    Job,
    NeedChunks,
    NeedWork,
    ReadPiece,
    RwView,
    SnapshotJob,
    Stat,
    fs_error,
    no_xattr,
    without_privileges,
)
from casfs.vfs.overlay.nodes import Node
from casfs.vfs.plan import chunk_spans
from casfs.vfs.rw.jobs.flush import FlushJob
from casfs.vfs.rw.jobs.puts import delete_inode_rows

if TYPE_CHECKING:
    from casfs.vfs.rw.kind import Kind
    from casfs.vfs.rw.names import DirNames

_DAY_NS = 86400 * 10**9
# File times come from the kernel's own clock for them (current_time(): the coarse
# one, a tick of a few ms). Under the writeback cache the kernel stamps a written file's
# mtime itself unless it already equals its clock's, and a stamp dirties the inode:
# one more SETATTR (the kernel writing its times back) per file. A finer stamp from
# here never equals the kernel's, so tar -x and cp -a paid that request for nearly
# every file they wrote. (Linux filesystems stamp with this clock too.)
_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)  # (Linux's number; Python 3.11 lacks the name)
XATTR_CREATE = 1
XATTR_REPLACE = 2
_XATTR_NAMESPACES = (b"user.", b"trusted.", b"security.")
R = TypeVar("R")
J = TypeVar("J", bound=Job)


def now_ns() -> int:
    return time.clock_gettime_ns(_COARSE)


class RwVolume:
    """The read/write view of one volume (RwView), whatever its kind."""

    read_only = False
    immutable = False

    def __init__(
        self,
        repo: Repository,
        name: str,
        make_kind: Callable[[RwVolume], Kind],
        claim: Callable[[tuple[object, ...]], None] | None = None,
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
        self.generation = generation(repo.conn, name)
        row = volume_row(repo.conn, name)
        if row is None:
            raise NotFound(f"no volume named {name!r}")
        self.base = row.base
        self.chunk_size = row.chunk_size
        self.next_ino = row.next_ino
        self.logical = row.size  # bytes in regular files now (volumes.size as of the last flush)
        self.nodes: dict[InodeNo, Node] = {}
        self.overlay: set[InodeNo] = set()
        self.dirty_nodes: set[InodeNo] = set()
        self.deleted: set[InodeNo] = set()
        self.cuts: dict[InodeNo, ChunkNo] = {}
        self.dirty_bytes = 0  # data held in memory only (a directory volume's spill)
        self.dirty_since: float | None = None  # time.monotonic() of the oldest unflushed change
        self.chunk_ids: dict[InodeNo, dict[ChunkNo, BlobId]] = {}
        self.contents: dict[InodeNo, chunkmap.Content | chunkmap.ChunkMap] = {}
        # Base content id -> its data chunks (for st_blocks), shared by every inode of it.
        self.allocated: dict[BlobId, list[ChunkNo]] = {}
        self.frozen = False  # a job is between its prepare and its apply/abort
        self._deferred_atime: set[InodeNo] = set()  # reads while frozen (relatime, applied at thaw)
        self._deferred_forget: set[InodeNo] = set()  # forgets while frozen
        self.kind = make_kind(self)
        self.names: DirNames | None = self.kind.namespace  # (None: no names, one file)
        self.fixed_size = self.kind.fixed_size
        assert row.kind == self.kind.volume_kind, f"a {row.kind} volume opened as {self.kind.volume_kind}"
        self._load_overlay()
        if ROOT_INO not in self.nodes:
            self.nodes[ROOT_INO] = self.kind.base_root(row.size)
        self.kind.load()

    @property
    def rw(self) -> RwView:
        return self

    @property
    def size_bytes(self) -> int:
        """The volume's logical size now: the disk's, or its regular files' bytes."""
        return self.kind.volume_size

    @property
    def claimed(self) -> bool:
        """This view holds the volume read/write (its changes are the volume's)."""
        return self.claim is None

    def ensure_writable(self) -> None:
        """Before the first change of an unclaimed view: claim the volume, as it was
        when this view read it (the kernel holds inodes of what it read)."""
        if self.claim is None:  # (every write asks)
            return
        self.claim(self.generation)
        self.claim = None
        # Unlinked inodes a crashed mount left open: nothing names them (_load_overlay
        # deletes them when the view is claimed from the start).
        for ino in [i for i, n in self.nodes.items() if n.attrs.nlink == 0 and i in self.overlay]:
            self._drop_inode(ino)
        self.kind.on_claim()

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

    # -- state -------------------------------------------------------------------------

    def node(self, ino: InodeNo) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise fs_error(errno.ENOENT, f"inode {ino} is not known")
        return node

    def touch(self, ino: InodeNo) -> None:
        """Mark an inode changed: it (and its parent's listing) go to the overlay. Every
        mutation passes here, so the protocol's checks are here."""
        self.check_mutation()
        self.kind.copy_up(ino)
        self.dirty_nodes.add(ino)
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()

    def check_mutation(self) -> None:
        assert not self.frozen, "a mutation ran inside a flush or fold (the view lock was not held)"
        assert self.claim is None, "a change to a volume this view has not claimed (ensure_writable)"
        assert self.guard is None or self.guard(), "a mutation without the view lock"
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        assert self._owner == me, "view state changed from a thread that does not own it"

    def forget(self, ino: InodeNo) -> None:
        if self.frozen:
            self._deferred_forget.add(ino)  # the running job may hold this inode's rows
            return
        node = self.nodes.get(ino)
        if node is None or ino == ROOT_INO:
            return
        if ino not in self.overlay:
            del self.nodes[ino]  # a base inode: found again from its tree when needed
            self.contents.pop(ino, None)
        elif node.attrs.nlink == 0:
            self._drop_inode(ino)

    def _drop_inode(self, ino: InodeNo) -> None:
        self.kind.dropped(ino)
        self.nodes.pop(ino, None)
        self.overlay.discard(ino)
        self.dirty_nodes.discard(ino)
        self.deleted.add(ino)
        self.cuts.pop(ino, None)
        self.chunk_ids.pop(ino, None)
        self.contents.pop(ino, None)

    def accessed(self, ino: InodeNo) -> None:
        """A program read the file (the adapter calls this for reads through a handle
        opened for reading without O_NOATIME; read_plan alone is no access: the digest
        control, read-ahead and the kernel's read-modify-write of a page plan reads too).
        A block volume keeps no atime: a hypervisor's reads would make every sync a
        catalog transaction (the file's overlay row), for a time no one reads."""
        if not self.kind.atime:
            return
        if self.frozen:
            # A fold in flight has captured the overlay: marking an inode dirty now would
            # outlive the fold and name an inode whose parent is no longer copied up.
            self._deferred_atime.add(ino)
            return
        node = self.nodes.get(ino)
        if node is not None and node.ino in self.overlay:
            # relatime, for inodes already in the overlay: a base inode is not copied up
            # for a read (reading an image-backed volume must not make it 'changed').
            now = now_ns()
            a = node.attrs
            if a.atime_ns <= max(a.mtime_ns, a.ctime_ns) or now - a.atime_ns > _DAY_NS:
                node.set(atime_ns=now)
                self.dirty_nodes.add(node.ino)

    def freeze(self) -> None:
        """A job was prepared: no mutation until it is applied or aborted (thaw)."""
        self.frozen = True

    def thaw(self) -> None:
        """The job is done: apply what arrived while the view was frozen (reads'
        atimes, forgets)."""
        self.frozen = False
        self._apply_deferred()

    def _apply_deferred(self) -> None:
        atimes, self._deferred_atime = self._deferred_atime, set()
        forgets, self._deferred_forget = self._deferred_forget, set()
        for ino in atimes:
            self.accessed(ino)
        for ino in forgets:
            self.forget(ino)

    # -- describing (logs, and what a failed unmount could not save) -------------------

    def describe(self, ino: InodeNo) -> str:
        return f"volume {self.name}: {self.kind.path_of(ino)}"

    def unsaved(self) -> list[tuple[str, int]]:
        """What is not yet committed: (path, bytes written since the last flush) per
        changed file, symlink or device (a directory's own change is its entries',
        which these name)."""
        held: dict[InodeNo, int] = {}
        self.kind.unsaved_bytes(held)
        for ino in self.dirty_nodes | self.deleted:
            node = self.nodes.get(ino)
            if node is None or not node.is_dir:
                held.setdefault(ino, 0)
        return sorted((self.kind.path_of(ino), n) for ino, n in held.items())

    # -- reading -------------------------------------------------------------------

    def getattr(self, ino: InodeNo) -> Stat:
        return self.stat(self.node(ino))

    def stat(self, node: Node) -> Stat:
        if node.is_file:
            blocks = self.kind.blocks(node)  # (first: a block volume settles its mtime there)
            return Stat.of(node.attrs, blocks)
        return Stat.of(node.attrs, None)

    def lookup(self, parent: InodeNo, name: bytes) -> Stat:
        return self._names(parent).find(parent, name)

    def readdir(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        return self._names(ino).entries(ino, offset)

    def readlink(self, ino: InodeNo) -> bytes:
        node = self.node(ino)
        if not stat.S_ISLNK(node.attrs.mode):
            raise fs_error(errno.EINVAL)
        return node.target

    def _names(self, ino: InodeNo) -> DirNames:
        """The namespace, for a directory's calls; a volume without names has no
        directory (its one inode answers as a regular file does)."""
        names = self.names
        if names is None:
            self.node(ino)
            raise fs_error(errno.ENOTDIR)
        return names

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[ReadPiece]:
        return self.kind.plan(self.node(ino), offset, size)

    def chunk_plan(self, node: Node, offset: int, size: int) -> list[ReadPiece]:
        """A read of a file's data below its upper file, chunk by chunk."""
        if not node.is_file:
            raise fs_error(errno.EISDIR if node.is_dir else errno.EINVAL)
        end = min(offset + size, node.attrs.size)
        return [
            ReadPiece(start, stop, blob=self.chunk_ref(node, n))
            for n, start, stop in chunk_spans(offset, end, self.chunk_size)
        ]

    def getxattr(self, ino: InodeNo, name: bytes) -> bytes:
        value = self.node(ino).xattrs.get(name)
        if value is None:
            raise no_xattr(name)
        return value

    def listxattr(self, ino: InodeNo) -> list[bytes]:
        return sorted(self.node(ino).xattrs)

    def chunk_ref(self, node: Node, n: ChunkNo) -> BlobId:
        """Chunk n of a file below its upper file: flushed by an older casfs, or the base's."""
        flushed = self.chunk_ids.get(node.ino)
        if flushed is not None and n in flushed:
            return flushed[n]
        if node.base == ZERO_ID or n >= node.base_limit:
            return ZERO_ID
        return self.kind.content(node).chunk(n)

    # -- changing data and attributes ------------------------------------------------

    def write(self, ino: InodeNo, offset: int, data: bytes, fetched: Fetched | None = None) -> int:
        return self.kind.write_at(self.node(ino), offset, data, fetched)

    def setattr(self, ino: InodeNo, *, fetched: Fetched | None = None, **changes: Unpack[Changes]) -> Stat:
        self.kind.settle()  # (before: a time set explicitly wins over the last write's)
        mode, uid, gid = changes.get("mode"), changes.get("uid"), changes.get("gid")
        size, atime_ns, mtime_ns = changes.get("size"), changes.get("atime_ns"), changes.get("mtime_ns")
        node = self.node(ino)
        if size is not None and size != node.attrs.size:
            self.kind.resize(node, size, fetched or {})
        now = now_ns()
        self.touch(ino)
        a = node.attrs
        new_mode = a.mode if mode is None else stat.S_IFMT(a.mode) | stat.S_IMODE(mode)
        given_away = uid not in (None, a.uid) or gid not in (None, a.gid)
        if not node.is_dir and (given_away or changes.get("drop_privileges")):
            new_mode = without_privileges(new_mode)
            # (its file capabilities go too, as ext4's security_inode_killpriv drops them)
            node.xattrs.pop(b"security.capability", None)
        node.set(
            mode=new_mode,
            uid=a.uid if uid is None else uid,
            gid=a.gid if gid is None else gid,
            atime_ns=a.atime_ns if atime_ns is None else atime_ns,
            mtime_ns=mtime_ns if mtime_ns is not None else now if size is not None else a.mtime_ns,
            ctime_ns=now,
        )
        return self.stat(node)

    def setxattr(self, ino: InodeNo, name: bytes, value: bytes, flags: int = 0) -> None:
        if name.startswith(b"system.posix_acl_"):
            # ACLs are not enforced here (default_permissions checks mode bits only), so
            # refuse them: cp -a and tar then fall back to chmod instead of storing an
            # ACL that silently disagrees with the mode.
            raise fs_error(errno.EOPNOTSUPP, "POSIX ACLs are not supported")
        if not name.startswith(_XATTR_NAMESPACES):
            # The kernel passes every name to FUSE; ext4 refuses unknown namespaces (and
            # system.*) so a tree that cp -a accepted here can be copied back out.
            raise fs_error(errno.EOPNOTSUPP, "unsupported xattr namespace")
        node = self.node(ino)
        if flags & XATTR_CREATE and name in node.xattrs:
            raise fs_error(errno.EEXIST)
        if flags & XATTR_REPLACE and name not in node.xattrs:
            raise fs_error(errno.ENODATA)
        self.touch(ino)
        node.xattrs[name] = value
        node.set(ctime_ns=now_ns())

    def removexattr(self, ino: InodeNo, name: bytes) -> None:
        node = self.node(ino)
        if name not in node.xattrs:
            raise fs_error(errno.ENODATA)
        self.touch(ino)
        del node.xattrs[name]
        node.set(ctime_ns=now_ns())

    # -- write-back: jobs (casfs.vfs.rw.jobs) ----------------------------------------

    def prepare_flush(self) -> Job | None:
        """Capture every change not yet committed (the view is frozen until the job is
        applied or aborted). Nothing is cleared here: a change stays dirty until committed."""
        self._apply_deferred()
        self.kind.settle()
        job = self.kind.add_to_flush(FlushJob.capture(self))
        if job is not None:
            self.freeze()
        return job

    def prepare_sync(self) -> Job | None:
        """A flush that writes may go on beside (a block volume's written upper file
        alone, see casfs.vfs.rw.jobs.sync); None: flush as usual (prepare_flush)."""
        return self.kind.sync_job()

    def prepare_snapshot(self, label: str | None) -> SnapshotJob:
        """Right after a flush, with the lock held: a freeze (O(1), casfs.vfs.rw.jobs.freeze)
        where the kind can, else a fold (its `slot` set: it runs holding a job slot)."""
        return self.kind.snapshot_job(label)

    def prepare_background_fold(self) -> Job | None:
        """The oldest frozen epoch's fold into blobs, run while writes go on (None: none)."""
        return self.kind.background_fold_job()

    def write_sync(self, ino: InodeNo, offset: int, data: bytes) -> int:
        """write(), fetching needed chunks and doing needed work in this thread (tests,
        offline tools)."""
        return self._retrying(lambda fetched: self.write(ino, offset, data, fetched))

    def truncate_sync(self, ino: InodeNo, size: int) -> Stat:
        return self._retrying(lambda fetched: self.setattr(ino, size=size, fetched=fetched))

    def _retrying(self, change: Callable[[Fetched], R]) -> R:
        """A change, retried in this thread after each NeedChunks or NeedWork."""
        fetched: Fetched = {}
        while True:
            try:
                return change(fetched)
            except NeedChunks as e:
                fetched.update((i, self.repo.get(i)) for i in e.ids)
            except NeedWork as e:
                e.run()
                e.apply()

    def flush_sync(self) -> None:
        """prepare, run and apply in one go (tests, and the daemon's exit path)."""
        job = self.prepare_flush()
        if job is not None:
            finish(job)

    def snapshot_sync(self, label: str | None = None) -> SnapshotNo:
        """flush + fold in this thread; the caller holds a job slot (a fold is heavy work)."""
        return self.kind.fold_now(label)

    def close(self, snapshot: bool = True) -> SnapshotNo | None:
        """Flush; then, if anything changed since the base, take a snapshot. A view that
        never claimed its volume changed nothing and leaves it as it is."""
        if not self.claimed:
            return None
        self.kind.closing()
        self.flush_sync()
        if snapshot and self.overlay:
            from casfs.lifecycle.queue import job_slot

            with job_slot(self.repo, f"snapshot {self.name}"):
                return self.snapshot_sync()
        return None


def finish(job: J) -> J:
    """A prepared job run in this thread, then applied (or aborted: it stays dirty)."""
    try:
        job.run()
    except BaseException:
        job.abort()
        raise
    job.apply()
    return job
