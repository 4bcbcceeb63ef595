"""What every view offers the FUSE adapter.

A view is one inode-number space: an image, a snapshot, a volume, or the synthetic
store root. Its root directory (or, for a block view, its one file) is ROOT_INO.

View methods run on the trio thread and never block for long: anything slow is
described, not done (read_plan() returns the chunk ids to fetch, which the adapter
fetches in worker threads). The whole protocol, read/write views included, is stated
once in docs/concurrency.md.

Errors are CasfsError subclasses (or OSError with an errno); the adapter maps both.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypedDict, Unpack

from casfs.ids import ROOT_INO as ROOT_INO  # (the views name it from here)
from casfs.ids import InodeNo, SnapshotNo
from casfs.snapshots.tree import AttrChanges, Attrs, copy_with, extend
from casfs.store.ids import ZERO_ID, BlobId

if TYPE_CHECKING:
    from casfs.repo import Repository


class StatChanges(AttrChanges, total=False):
    blocks: int | None


@dataclass(frozen=True, slots=True)
class Stat(Attrs):
    """An inode's attributes as the adapter replies them: the tree's Attrs (one record
    for both), plus the blocks allocated."""

    # 512-byte blocks allocated, for views that know (a sparse file's holes count
    # none, so `du` and cp's sparse detection work); None: the size rounded up.
    blocks: int | None = None

    @staticmethod
    def of(attrs: Attrs, blocks: int | None = None) -> Stat:
        return extend(attrs, Stat, blocks=blocks)

    def with_(self, **changes: Unpack[StatChanges]) -> Stat:
        return copy_with(self, changes)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class ReadPiece(NamedTuple):
    """One chunk's part of a read: bytes [start, end) of the chunk, whose content is
    `data` (already in memory; shorter than the chunk means zeros follow), `read()`
    (local bytes, read when the reply is assembled: a block volume's upper file) or
    `blob` (fetch it; ZERO_ID is a hole). A tuple, not a frozen dataclass (whose
    __init__ sets each field through object.__setattr__): the trio thread makes about
    32 per 1 MiB request of a sequential reader (the read's and read-ahead's), and a
    plan of 16 cost 25 us with those, 10 with these."""

    start: int
    end: int
    blob: BlobId = ZERO_ID
    data: bytes | bytearray | None = None
    read: Callable[[], bytes] | None = None


# Zeros to copy from (holes, and the tail of a short chunk) without allocating them for
# each read: calloc'd, its pages stay the kernel's shared zero page.
ZEROS = memoryview(bytes(1 << 20))


def _zeros(n: int) -> Iterator[memoryview]:
    while n > 0:
        part = ZEROS[: min(n, len(ZEROS))]
        n -= len(part)
        yield part


def _parts(pieces: list[ReadPiece], fetch: Callable[[BlobId], bytes]) -> Iterator[memoryview]:
    """The bytes `pieces` describe, in order, as views (nothing copied yet)."""
    for p in pieces:
        n = p.end - p.start
        if p.data is not None:
            src: bytes | bytearray = p.data
        elif p.read is not None:
            src = p.read()
        elif p.blob == ZERO_ID:
            yield from _zeros(n)
            continue
        else:
            src = fetch(p.blob)
        part = memoryview(src)[p.start : p.end]
        yield part
        if len(part) < n:
            yield from _zeros(n - len(part))


def assemble(pieces: list[ReadPiece], fetch: Callable[[BlobId], bytes]) -> bytes:
    """The bytes `pieces` describe, copied once (a read of 128 KiB through a bytearray
    cost three copies, and a page fault per page for each in a fresh allocation)."""
    return b"".join(_parts(pieces, fetch))


def assemble_into(pieces: list[ReadPiece], fetch: Callable[[BlobId], bytes], out: memoryview) -> int:
    """assemble() into `out` (at least as long as the pieces); the length written."""
    pos = 0
    for part in _parts(pieces, fetch):
        end = pos + len(part)
        out[pos:end] = part
        pos = end
    return pos


class View(Protocol):
    read_only: bool
    # True for immutable content: the adapter keeps the kernel page cache and long timeouts.
    immutable: bool

    def getattr(self, ino: InodeNo) -> Stat: ...

    def lookup(self, parent: InodeNo, name: bytes) -> Stat: ...

    def readdir(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        """(name, stat, next offset) from `offset` on; offsets are stable while the
        directory changes (an entry added or removed does not shift the others)."""
        ...

    def readlink(self, ino: InodeNo) -> bytes: ...

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[ReadPiece]: ...

    def getxattr(self, ino: InodeNo, name: bytes) -> bytes: ...

    def listxattr(self, ino: InodeNo) -> list[bytes]: ...

    def forget(self, ino: InodeNo) -> None: ...

    def describe(self, ino: InodeNo) -> str:
        """The inode's path, for logs and error messages."""
        ...

    @property
    def rw(self) -> RwView | None:
        """The view as a read/write volume (itself), or None: immutable, or synthetic."""
        ...


class NeedChunks(Exception):
    """A write or truncate needs these chunks' current bytes first (fetch, then retry)."""

    def __init__(self, ids: list[BlobId]) -> None:
        super().__init__(f"{len(ids)} chunks to fetch")
        self.ids = ids


class NeedWork(Exception):
    """A write or truncate needs slow local work first (a file's content copied into
    its upper file): run `run` in a worker thread, then `apply` on the view's thread
    (with the lock still held), then call again."""

    def __init__(self, what: str, run: Callable[[], None], apply: Callable[[], None]) -> None:
        super().__init__(what)
        self.run = run
        self.apply = apply


Fetched = dict[BlobId, bytes]


class Changes(TypedDict, total=False):
    """What a setattr may change (a name left out stays as it is)."""

    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    # Clear what a write or chown takes from a file (without_privileges), as the
    # kernel asks under FUSE_HANDLE_KILLPRIV_V2 (casfs.fuse.killpriv).
    drop_privileges: bool


def without_privileges(mode: int) -> int:
    """A non-directory's mode once written or given away (the kernel's rule for FUSE,
    fuse_setattr's): no setuid; no setgid where it means set-group-id (group exec set;
    without it, setgid marks mandatory locking and stays)."""
    mode &= ~stat.S_ISUID
    if mode & stat.S_IXGRP:
        mode &= ~stat.S_ISGID
    return mode


class Job(Protocol):
    """Slow write-back work, in three phases around a worker thread: the view prepares
    it (a consistent capture, on the trio thread, lock held: `prepare_*` below), then

      run()    in a worker thread: touches what the job captured and the store only
      apply()  on the trio thread, the job having run: the view takes its result
      abort()  on the trio thread, run() having failed: nothing it carried is lost
               (a flush's changes stay dirty, a fold's overlay stays as it was)

    apply and abort run with the view's lock held, except for the jobs that run beside
    writes (a sync, a background fold), whose apply touches only what writes do not.
    The session (casfs.fuse.rwsession) drives every job the same way: lock, slot,
    thread, apply or abort."""

    what: str  # for logs and the name of the job slot it holds
    # Heavy work (a fold): run() holds a store job slot (casfs.lifecycle.queue). The
    # session takes the slot before the lock, then prepares the job again under both.
    slot: bool
    # Bytes run() stored as new blobs (a fold's; 0 for the others): the fold metrics.
    stored_bytes: int

    def run(self) -> None: ...

    def apply(self) -> None: ...

    def abort(self) -> None: ...


class SnapshotJob(Job, Protocol):
    @property
    def snapshot(self) -> SnapshotNo:
        """The snapshot's number (given out by run())."""
        ...


class Names(Protocol):
    """A read/write volume's namespace changes (a directory volume's; a block volume,
    one file, has none: RwView.names is None). Each runs as a mutation (RwView)."""

    def mknod(self, parent: InodeNo, name: bytes, mode: int, rdev: int, uid: int, gid: int) -> Stat: ...

    def mkdir(self, parent: InodeNo, name: bytes, mode: int, uid: int, gid: int) -> Stat: ...

    def symlink(self, parent: InodeNo, name: bytes, target: bytes, uid: int, gid: int) -> Stat: ...

    def link(self, ino: InodeNo, new_parent: InodeNo, new_name: bytes) -> Stat: ...

    def unlink(self, parent: InodeNo, name: bytes) -> None: ...

    def rmdir(self, parent: InodeNo, name: bytes) -> None: ...

    def rename(
        self, old_parent: InodeNo, old_name: bytes, new_parent: InodeNo, new_name: bytes, flags: int = 0
    ) -> None: ...


class RwView(View, Protocol):
    """A mounted read/write volume (casfs.vfs.rw.volume.RwVolume), as the adapter
    (casfs.fuse.operations) and its session (casfs.fuse.rwsession) use it.

    Every method here is synchronous and runs on the trio thread. A mutation runs with
    the session's lock held (`guard` checks that); write and setattr(size=...) may raise
    NeedChunks(ids): the caller fetches those chunks and calls again with them in
    `fetched`, or NeedWork. A block volume has no names (`names` is None) and a fixed
    size (setattr(size=...) EPERM, a write past the end ENOSPC).
    """

    repo: Repository
    name: str
    # Set by the session: True when the calling task holds the view's lock (asserted on
    # every mutation; None without a session: tests and offline tools).
    guard: Callable[[], bool] | None
    dirty_bytes: int  # data held in memory only, not yet flushed
    dirty_since: float | None  # time.monotonic() of the oldest unflushed change

    @property
    def names(self) -> Names | None: ...

    @property
    def fixed_size(self) -> bool:
        """True when the volume is one regular file (ROOT_INO) whose size writes never change."""
        ...

    @property
    def claimed(self) -> bool: ...

    def ensure_writable(self) -> None: ...

    def accessed(self, ino: InodeNo) -> None: ...

    def setattr(
        self, ino: InodeNo, *, fetched: Fetched | None = None, **changes: Unpack[Changes]
    ) -> Stat: ...

    def write(self, ino: InodeNo, offset: int, data: bytes, fetched: Fetched | None = None) -> int: ...

    def setxattr(self, ino: InodeNo, name: bytes, value: bytes, flags: int = 0) -> None: ...

    def removexattr(self, ino: InodeNo, name: bytes) -> None: ...

    # Write-back: each returns a Job (see Job), or None when there is nothing to do.
    def prepare_flush(self) -> Job | None: ...

    def prepare_sync(self) -> Job | None:
        """A flush run beside writes, without the lock (None: prepare_flush instead)."""
        ...

    def prepare_snapshot(self, label: str | None) -> SnapshotJob:
        """Right after a flush: the kind's snapshot, a freeze (O(1)) or a fold (`slot`)."""
        ...

    def prepare_background_fold(self) -> Job | None:
        """A frozen snapshot's fold into blobs, run beside writes (None: none waits)."""
        ...

    def close(self, snapshot: bool = True) -> SnapshotNo | None: ...

    def unsaved(self) -> list[tuple[str, int]]: ...

    @property
    def size_bytes(self) -> int: ...


def enoent(what: str) -> OSError:
    return OSError(errno.ENOENT, what)


def fs_error(code: int, what: str = "") -> OSError:
    return OSError(code, what or errno.errorcode.get(code, "error"))


# Asked of every entry by `ls -l` (coreutils: lgetfilecon, file_has_acl), and answered
# EOPNOTSUPP for an entry that has none: ls then remembers the file system as one
# without labels or ACLs (per st_dev) and stops asking. ENODATA, the usual answer, cost
# two or three FUSE requests per entry, most of a warm `ls -lR`'s. Nothing is hidden: an
# entry with a label or an ACL still answers it (getfattr, getfacl), and casfs does not
# enforce ACLs (no FUSE_POSIX_ACL: the kernel checks the mode bits only; a volume
# refuses to set one). Only ls's `+` and `.` marks after the first unmarked entry are lost.
UNLABELLED = frozenset((b"security.selinux", b"system.posix_acl_access", b"system.posix_acl_default"))


def no_xattr(name: bytes) -> OSError:
    """The error for an extended attribute an entry does not have (see UNLABELLED)."""
    if name in UNLABELLED:
        return fs_error(errno.EOPNOTSUPP, "no SELinux label or POSIX ACL here")
    return fs_error(errno.ENODATA, "no such attribute")
