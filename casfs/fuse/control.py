"""The xattr control plane: `user.casfs.*` names, as a table.

    name                       on                              get / set       who
    user.casfs.phase           a volume or image               get             owner
    user.casfs.origin          a volume                        get             owner
    user.casfs.size            a volume, image or snapshot     get             owner
    user.casfs.unique          a volume, image or snapshot     get             owner
    user.casfs.snapshots       a volume                        get             owner
    user.casfs.snapshot        a volume                        set [label]     owner
    user.casfs.release         a volume of a whole-store mount set             owner
    user.casfs.clone           an image or a snapshot          set NAME        owner
    user.casfs.digest          any regular file                get             anyone who may read it
    user.casfs.corrupt_reads   the mount root                  get             owner
    user.casfs.corrupt_ids     the mount root                  get             owner
    user.casfs.flush           the mount root                  set             owner
    user.casfs.passthrough     the mount root                  get             anyone
    user.casfs.file_cache      the mount root                  get             anyone

"A volume" is a volume's root: the mount root of a single-volume mount (the file, for
a block volume), or volumes/<name> in a whole-store mount. The owner is root or the
user who mounted. Control names are never listed by listxattr (cp -a, rsync -aX and
tar --xattrs would replay them). Unknown `user.casfs.*` names: ENODATA on get, EINVAL
on set; a name asked of something it does not apply to: ENODATA; a bad value: EINVAL.

Slow work (usage walks, digests, catalog writes, syncfs) runs in worker threads;
catalog writes go through one CatalogWriter (its own connection, one thread at a time).
No SQL here: getters read through casfs.volumes, casfs.images and casfs.refcount.accounts.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TypeVar

import blake3
import trio

from casfs import images, volumes
from casfs.errors import Busy, NotFound, UsageError
from casfs.fuse import rwsession
from casfs.ids import InodeNo, SnapshotNo
from casfs.lifecycle.phases import ImagePhase, VolumePhase
from casfs.repo import Repository
from casfs.store import BlobStore
from casfs.store.ids import BlobId
from casfs.store.local import syncfs
from casfs.vfs.api import ReadPiece, View, assemble
from casfs.vfs.chunks import ChunkCache
from casfs.vfs.storeview import Shown, Subject
from casfs.volumes.settle import FOLD_WAIT_S, pending

PREFIX = b"user.casfs."
_DIGEST_STEP = 16 << 20
_MAX_LABEL = 200

T = TypeVar("T")


class Who(Enum):
    ANYONE = "anyone"
    OWNER = "owner"


@dataclass(frozen=True)
class Target:
    """What a control name is asked of."""

    view: View
    ino: InodeNo
    is_mount_root: bool
    subject: Subject | None  # set when ino is the root of an image, volume or snapshot view


Getter = Callable[[Target], Awaitable[bytes]]
Setter = Callable[[Target, bytes], Awaitable[None]]


@dataclass(frozen=True)
class Control:
    get: Getter | None
    set: Setter | None
    who: Who


def is_control(name: bytes) -> bool:
    return name.startswith(PREFIX)


def nodata() -> OSError:
    return OSError(errno.ENODATA, "no such attribute")


class CatalogWriter:
    """Catalog writes off the trio thread: one connection, used by one thread at a time."""

    def __init__(self, store: Path, blobs: BlobStore | None = None) -> None:
        # (the daemon's blob store, shared: on S3 another would list the bucket again)
        self.repo = Repository.open(store, blobs)
        self._limiter = trio.CapacityLimiter(1)

    async def run(self, fn: Callable[[Repository], T]) -> T:
        return await trio.to_thread.run_sync(fn, self.repo, limiter=self._limiter)

    def close(self) -> None:
        self.repo.close()


class ControlPlane:
    def __init__(
        self,
        repo: Repository,
        writer: CatalogWriter,
        chunks: ChunkCache,
        mountpoint: str,
        owner_uid: int,
        held: set[str],
        on_file: bool = False,
    ) -> None:
        self.repo = repo  # reads, on the trio thread
        self.writer = writer
        self.chunks = chunks
        self.mountpoint = mountpoint
        self.owner_uid = owner_uid
        self.held = held  # volumes this daemon holds read/write (phase mounted)
        self.on_file = on_file  # mounted on a file (a block volume): no writeback cache to sync
        self.table: dict[bytes, Control] = {
            PREFIX + b"phase": Control(self._phase, None, Who.OWNER),
            PREFIX + b"origin": Control(self._origin, None, Who.OWNER),
            PREFIX + b"size": Control(self._size, None, Who.OWNER),
            PREFIX + b"unique": Control(self._unique, None, Who.OWNER),
            PREFIX + b"snapshots": Control(self._snapshots, None, Who.OWNER),
            PREFIX + b"snapshot": Control(None, self._take_snapshot, Who.OWNER),
            PREFIX + b"clone": Control(None, self._clone, Who.OWNER),
            PREFIX + b"release": Control(None, self._release, Who.OWNER),
            PREFIX + b"digest": Control(self._digest, None, Who.ANYONE),
            PREFIX + b"corrupt_reads": Control(self._corrupt_reads, None, Who.OWNER),
            PREFIX + b"corrupt_ids": Control(self._corrupt_ids, None, Who.OWNER),
            PREFIX + b"flush": Control(None, self._flush, Who.OWNER),
            PREFIX + b"passthrough": Control(self._passthrough, None, Who.ANYONE),
            PREFIX + b"file_cache": Control(self._file_cache, None, Who.ANYONE),
        }
        # "on", or "off: why" (the daemon sets it at the kernel's INIT).
        self.passthrough_mode: Callable[[], str] = lambda: "off: not started"
        # Passthrough's whole-file cache: its disk cost and its background fills' pace.
        self.file_cache_status: Callable[[], str] = lambda: "off (no passthrough)"

        # Saves every read/write volume of this mount (the daemon sets it): `casfs umount`
        # asks for it before unmounting, and refuses to unmount if it fails.
        self.flush_all: Callable[[], Awaitable[None]] | None = None
        # Lets go of a volume of a whole-store mount (the daemon sets it there): the
        # containerd snapshotter's commit and removal, without an unmount.
        self.release_volume: Callable[[str], Awaitable[None]] | None = None

    async def get(self, name: bytes, target: Target, uid: int) -> bytes:
        control = self.table.get(name)
        if control is None or control.get is None:
            raise nodata()
        self._check(control, uid)
        return await control.get(target)

    async def set(self, name: bytes, value: bytes, target: Target, uid: int) -> None:
        control = self.table.get(name)
        if control is None or control.set is None:
            raise OSError(errno.EINVAL, f"{name.decode(errors='replace')} cannot be set")
        self._check(control, uid)
        await control.set(target, value)

    def _check(self, control: Control, uid: int) -> None:
        if control.who is Who.OWNER and uid not in (0, self.owner_uid):
            raise OSError(errno.EPERM, "control operations need root or the mount's owner")

    # -- getters -----------------------------------------------------------------

    @staticmethod
    def _subject(t: Target, *shown: Shown) -> Subject:
        if t.subject is None or t.subject.what not in shown:
            raise nodata()
        return t.subject

    def _volume(self, name: str) -> volumes.VolumeInfo:
        try:
            return volumes.get_volume(self.repo, name)
        except NotFound:
            raise nodata() from None

    def _image(self, name: str) -> images.ImageInfo:
        try:
            return images.get_image(self.repo, name)
        except NotFound:
            raise nodata() from None

    def _snapshot(self, volume: str, n: SnapshotNo | None) -> volumes.SnapshotInfo:
        try:
            found = [snap for snap in volumes.list_snapshots(self.repo, volume) if snap.n == n]
        except NotFound:
            found = []
        if not found:
            raise nodata()
        return found[0]

    async def _phase(self, t: Target) -> bytes:
        """The phase; "mounted by pid N" when another process holds it (this mount's
        own holds read plain "mounted")."""
        s = self._subject(t, "volume", "image")
        info = self._volume(s.name) if s.what == "volume" else self._image(s.name)
        phase, pid = info.phase, info.owner_pid
        at_rest = (VolumePhase.READY, ImagePhase.READY, ImagePhase.FAILED)
        elsewhere = pid is not None and pid != os.getpid() and phase not in at_rest
        return f"{phase} by pid {pid}".encode() if elsewhere else str(phase).encode()

    async def _origin(self, t: Target) -> bytes:
        return str(self._volume(self._subject(t, "volume").name).origin).encode()

    async def _size(self, t: Target) -> bytes:
        s = self._subject(t, "volume", "image", "snapshot")
        rw = t.view.rw
        if s.what == "volume" and rw is not None:
            # A read/write view knows its current size (the catalog has its base's): for
            # a directory volume its files' bytes, not the root directory's st_size.
            return str(rw.size_bytes).encode()
        if s.what == "volume":
            size = self._volume(s.name).size
        elif s.what == "image":
            size = self._image(s.name).size
        else:
            size = self._snapshot(s.name, s.n).size
        return str(size).encode()

    async def _unique(self, t: Target) -> bytes:
        s = t.subject
        if s is None:
            raise nodata()
        from casfs.refcount import accounts as a

        def work(repo: Repository) -> int:
            # The kept figure, settled first within the budget if pending (a write
            # transaction then: a worker thread's own connection).
            if s.what == "volume":
                return a.volume_figures(repo, s.name).unique
            if s.what == "image":
                return a.image_figures(repo, s.name).unique
            assert s.n is not None
            return a.snapshot_figures(repo, s.name, s.n).unique

        # The reader's repository: per-thread connections.
        unique = await trio.to_thread.run_sync(work, self.repo)
        return str(unique).encode()

    async def _snapshots(self, t: Target) -> bytes:
        s = self._subject(t, "volume")
        try:
            numbers = volumes.get_volume(self.repo, s.name).snapshots
        except NotFound:
            numbers = []  # removed meanwhile: it has none
        return " ".join(str(n) for n in numbers).encode()

    async def _digest(self, t: Target) -> bytes:
        st = t.view.getattr(t.ino)
        if not stat.S_ISREG(st.mode):
            raise nodata()
        hasher = blake3.blake3()
        offset = 0
        while offset < st.size:
            # Plan on the trio thread (views are not thread-safe), read and hash in a worker.
            pieces = t.view.read_plan(t.ino, offset, min(_DIGEST_STEP, st.size - offset))
            if not pieces:
                break
            await trio.to_thread.run_sync(_hash_into, hasher, pieces, self.chunks.fetch_uncached)
            offset += sum(p.end - p.start for p in pieces)
        return f"blake3:{hasher.hexdigest()}".encode()

    async def _corrupt_reads(self, t: Target) -> bytes:
        if not t.is_mount_root:
            raise nodata()
        return str(self.chunks.corrupt_reads).encode()

    async def _passthrough(self, t: Target) -> bytes:
        if not t.is_mount_root:
            raise nodata()
        return self.passthrough_mode().encode()

    async def _file_cache(self, t: Target) -> bytes:
        if not t.is_mount_root:
            raise nodata()
        return (await trio.to_thread.run_sync(self.file_cache_status)).encode()

    async def _corrupt_ids(self, t: Target) -> bytes:
        if not t.is_mount_root:
            raise nodata()
        return " ".join(BlobId(b).hex() for b in list(self.chunks.last_corrupt)).encode()

    # -- setters -----------------------------------------------------------------

    async def _flush(self, t: Target, value: bytes) -> None:
        if not t.is_mount_root:
            raise OSError(errno.EINVAL, "flush is asked of the mount root")
        await self._sync_kernel()
        if self.flush_all is not None:
            await self.flush_all()

    async def _take_snapshot(self, t: Target, value: bytes) -> None:
        s = t.subject
        if s is None or s.what != "volume":
            raise OSError(errno.EINVAL, "snapshots are taken of volumes")
        label = parse_label(value)
        rw = t.view.rw
        if rw is not None:
            await self._sync_kernel()  # (as S3QL's s3qlcp does)
            await rwsession.take_snapshot(rw, label)
            return
        held = s.name in self.held
        await self.writer.run(lambda repo: volumes.snapshot_at_rest(repo, s.name, label, held))

    async def _release(self, t: Target, value: bytes) -> None:
        """The mount lets go of the volume: its changes saved (flushed, no snapshot),
        its claim released; the view it served refuses changes from now on (ESTALE), a
        new lookup gets a new one. A volume it does not hold: nothing to do."""
        s = t.subject
        if s is None or s.what != "volume" or self.release_volume is None:
            raise OSError(errno.EINVAL, "release is asked of volumes/NAME of a whole-store mount")
        await self._sync_kernel()
        await self.release_volume(s.name)

    async def _sync_kernel(self) -> None:
        """Writes still in the kernel's writeback cache reach the views first: syncfs
        from a worker, while the loop serves them. A mount on a file has the writeback cache
        off (daemon.py; a shared mapping's dirty pages are its writer's to msync) and
        syncfs_path nothing to do: no trip through a worker thread."""
        if not self.on_file:
            await trio.to_thread.run_sync(syncfs_path, self.mountpoint)

    async def _clone(self, t: Target, value: bytes) -> None:
        """A new read/write volume NAME from the image or snapshot asked, as `casfs
        volume create NAME --from ...` makes it (one transaction, O(1)), without a
        Python start-up: `setfattr` is what a script calls beside `qemu-img create -b`."""
        s = t.subject
        if s is None or s.what == "volume":
            raise OSError(errno.EINVAL, "clones are made of images and snapshots")
        try:
            name = value.decode()
        except UnicodeDecodeError:
            raise UsageError("a volume name is UTF-8 text") from None
        if s.what == "image":
            source = volumes.Source(image=s.name)
        else:
            assert s.n is not None
            source = volumes.Source(snapshot=str(s))
            # Not in the writer's thread: a fold this daemon runs may need that thread.
            await self._folded(s.name, s.n)
        await self.writer.run(lambda repo: volumes.create_volume(repo, name, source))

    async def _folded(self, volume: str, n: SnapshotNo) -> None:
        """Until a snapshot taken while mounted is stored as blobs, as `wait_folded`
        waits; a volume at rest (its daemon gone) is left to it, which folds it."""
        deadline = trio.current_time() + FOLD_WAIT_S
        while pending(self.repo, volume, n):
            if trio.current_time() > deadline:
                raise Busy(f"snapshot {volume}@{n} is still being folded")
            await trio.sleep(0.05)


def _hash_into(hasher: blake3.blake3, pieces: list[ReadPiece], fetch: Callable[[BlobId], bytes]) -> None:
    hasher.update(assemble(pieces, fetch))


def parse_label(value: bytes) -> str | None:
    """A snapshot label: empty for none, else printable UTF-8 text."""
    try:
        text = value.decode()
    except UnicodeDecodeError:
        raise UsageError("a snapshot label must be UTF-8 text") from None
    text = text.strip()
    if len(text) > _MAX_LABEL or not text.isprintable():
        raise UsageError(f"a snapshot label is printable text of at most {_MAX_LABEL} characters")
    return text or None


def syncfs_path(path: str) -> None:
    """syncfs of the daemon's own mount at `path`: its kernel writeback cache reaches it.
    Only where the root is a directory: a mount on a file has no writeback cache
    (daemon.py), and the daemon must never hold a regular file of its own mount open.
    Killed then, its exit closes the file, FUSE sends FLUSH to the dying daemon and
    waits for ever, with /dev/fuse still open: the mount hangs until aborted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_DIRECTORY)
    except NotADirectoryError:
        return
    try:
        syncfs(fd)
    finally:
        os.close(fd)
