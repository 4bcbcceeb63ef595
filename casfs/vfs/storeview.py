"""The synthetic top level of a whole-store mount.

    /images/<name>              an image's TreeView or BlockView
    /volumes/<name>             a volume: its read/write view (claimed at its first change, not
                                at lookup), or its base read-only while another process holds it
    /snapshots/<volume>/<n>     snapshot n of a volume, read-only (one taken while mounted
                                is read before its fold commits: casfs.vfs.frozenview)

The directories here are made up (mode 0555) and follow the catalog: listings are
re-read at most once per LISTING_TTL_S, so images imported, volumes created and
snapshots taken by other processes appear. Each named entry is a junction into a child
view: `resolve()` and `entries()` say which (view, inode) a name leads to, and the
adapter gives every view its own inode-number space.

Child views are made once per (what, name, root): a rolled-back volume or a recreated
image gets a new view, while inodes the kernel still holds keep the old one.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

from casfs.catalog import views
from casfs.catalog.images import image_row
from casfs.catalog.overlay import pending_snapshot
from casfs.catalog.volumes import snapshot_row, volume_row
from casfs.errors import CasfsError
from casfs.ids import InodeNo, SnapshotNo
from casfs.kinds import VolumeKind
from casfs.lifecycle.phases import ImagePhase, VolumePhase
from casfs.lifecycle.pids import alive
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.vfs.api import ROOT_INO, ReadPiece, RwView, Stat, View, enoent, no_xattr
from casfs.vfs.blockview import BlockView
from casfs.vfs.frozenview import FrozenBlockView
from casfs.vfs.treeview import TreeView

log = logging.getLogger(__name__)

LISTING_TTL_S = 1.0
IMAGES_INO, VOLUMES_INO, SNAPSHOTS_INO = InodeNo(2), InodeNo(3), InodeNo(4)
_FIRST_DYNAMIC_INO = 16  # a snapshot directory's: this + a serial
_TOP = ((b"images", IMAGES_INO), (b"volumes", VOLUMES_INO), (b"snapshots", SNAPSHOTS_INO))


# What a store mount's entry shows (casfs.fuse.control's getters differ by it).
Shown = Literal["image", "volume", "snapshot"]


@dataclass(frozen=True)
class Subject:
    """What a view shows, for the control plane: an image, a volume or snapshot n of one."""

    what: Shown
    name: str
    n: SnapshotNo | None = None

    def __str__(self) -> str:
        return f"{self.name}@{self.n}" if self.n is not None else self.name


# Opens the read/write view of a volume, which claims it at its first change (Busy then
# if another process has it); the daemon provides it for read/write mounts.
OpenRw = Callable[[str], View]


def static_view(
    repo: Repository,
    kind: VolumeKind,
    root: BlobId,
    chunk_size: int,
    next_ino: InodeNo,
    created: float,
    label: str,
    block_mode: int = 0o444,
) -> View:
    """A read-only view of a root: a tree or a disk."""
    if kind == VolumeKind.DIR:
        return TreeView(repo, root, chunk_size, next_ino, label=label)
    return BlockView(repo, root, mode=block_mode, mtime_ns=int(created * 1e9), label=label)


class Root(NamedTuple):
    """A root served read-only: an image's, a snapshot's, or a volume's base."""

    kind: VolumeKind
    root: BlobId
    chunk_size: int
    next_ino: InodeNo
    created: float


def _static(repo: Repository, row: Root, label: str) -> View:
    return static_view(repo, row.kind, row.root, row.chunk_size, row.next_ino, row.created, label)


class StoreView:
    read_only = True
    immutable = False
    rw = None  # not a read/write volume

    def __init__(self, repo: Repository, open_rw: OpenRw | None = None) -> None:
        self.repo = repo
        self.open_rw = open_rw
        self._now = time.time_ns()
        self._uid, self._gid = os.getuid(), os.getgid()
        self._views: dict[tuple[object, ...], View] = {}
        self._rw: dict[str, RwView] = {}  # volume -> its read/write view
        self._subjects: dict[int, Subject] = {}
        # Stable readdir offsets: each name gets the next serial of its directory for
        # the daemon's lifetime, so entries come and go without shifting the others.
        self._serials: dict[InodeNo, dict[str, int]] = {}
        self._listings: dict[InodeNo, tuple[float, list[str]]] = {}
        self._snapdir_ino: dict[str, InodeNo] = {}
        self._snapdir_name: dict[InodeNo, str] = {}
        self._rw_generation: dict[str, tuple[BlobId, int]] = {}  # an unclaimed rw view's
        # Snapshots read before their fold commits (casfs.vfs.frozenview), until it does.
        self._frozen_views: dict[tuple[str, SnapshotNo], FrozenBlockView] = {}

    # -- junctions: which (view, inode) a name leads to ------------------------------

    def resolve(self, parent: InodeNo, name: bytes) -> tuple[View, InodeNo]:
        if parent == ROOT_INO:
            for top, ino in _TOP:
                if top == name:
                    return self, ino
            raise enoent(name.decode(errors="replace"))
        text = _name(name)
        if parent == IMAGES_INO:
            return self._image(text), ROOT_INO
        if parent == VOLUMES_INO:
            return self._volume(text), ROOT_INO
        if parent == SNAPSHOTS_INO:
            if text not in self._listing(SNAPSHOTS_INO):
                raise enoent(text)
            return self, self._snapdir(text)
        volume = self._snapdir_name.get(parent)
        if volume is None:
            raise OSError(errno.ENOTDIR, "not a directory")
        if not text.isdigit():
            raise enoent(text)
        return self._snapshot(volume, SnapshotNo(int(text))), ROOT_INO

    def entries(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, View, InodeNo, int]]:
        """(name, view, inode, next offset) from `offset` on."""
        if ino == ROOT_INO:
            for i, (top, child) in enumerate(_TOP):
                if i >= offset:
                    yield top, self, child, i + 1
            return
        self._dir_check(ino)
        serials = self._serials.setdefault(ino, {})
        for text in self._listing(ino):
            serials.setdefault(text, len(serials) + 1)
        for text, serial in sorted(serials.items(), key=lambda kv: kv[1]):
            if serial <= offset or text not in self._listing(ino):
                continue
            try:
                view, child = self.resolve(ino, text.encode())
            except CasfsError as e:  # one bad entry must not hide the others
                log.error("%s: %s", text, e)
                continue
            except OSError as e:
                if e.errno != errno.ENOENT:
                    log.error("%s: %s", text, e)
                continue
            yield text.encode(), view, child, serial

    def release_folded(self) -> None:
        """Frozen snapshots whose fold committed read the stored one from now on, and
        let their deleted epoch files go (the daemon's fold timer; reads look too)."""
        for key, view in list(self._frozen_views.items()):
            if view.check_folded():
                del self._frozen_views[key]

    def forget_rw(self, name: str) -> None:
        """The mount let go of volume `name`: its next lookup opens a new view."""
        self._rw.pop(name, None)
        self._rw_generation.pop(name, None)

    def subject(self, view: View) -> Subject | None:
        return self._subjects.get(id(view))

    # -- View --------------------------------------------------------------------

    def getattr(self, ino: InodeNo) -> Stat:
        self._dir_check(ino)
        subdirs = 3 if ino == ROOT_INO else self._count_subdirs(ino)
        return Stat(
            ino=ino,
            mode=stat.S_IFDIR | 0o555,
            nlink=2 + subdirs,
            uid=self._uid,
            gid=self._gid,
            atime_ns=self._now,
            mtime_ns=self._now,
            ctime_ns=self._now,
        )

    def lookup(self, parent: InodeNo, name: bytes) -> Stat:
        view, ino = self.resolve(parent, name)
        return view.getattr(ino)

    def readdir(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        for name, view, child, nxt in self.entries(ino, offset):
            yield name, view.getattr(child), nxt

    def readlink(self, ino: InodeNo) -> bytes:
        raise OSError(errno.EINVAL, "not a symlink")

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[ReadPiece]:
        raise OSError(errno.EISDIR, "a directory")

    def getxattr(self, ino: InodeNo, name: bytes) -> bytes:
        raise no_xattr(name)

    def listxattr(self, ino: InodeNo) -> list[bytes]:
        return []

    def forget(self, ino: InodeNo) -> None:
        pass

    def describe(self, ino: InodeNo) -> str:
        if ino in self._snapdir_name:
            return f"/snapshots/{self._snapdir_name[ino]}"
        names = {ROOT_INO: "/", IMAGES_INO: "/images", VOLUMES_INO: "/volumes", SNAPSHOTS_INO: "/snapshots"}
        return names.get(ino, f"<{ino}>")

    # -- the catalog -------------------------------------------------------------

    def _listing(self, ino: InodeNo) -> list[str]:
        now = time.monotonic()
        cached = self._listings.get(ino)
        if cached is not None and now - cached[0] < LISTING_TTL_S:
            return cached[1]
        conn = self.repo.conn
        if ino == IMAGES_INO:
            names = views.image_names(conn)
        elif ino in (VOLUMES_INO, SNAPSHOTS_INO):
            names = views.volume_names(conn)
        else:
            names = views.snapshot_names(conn, self._snapdir_name[ino])
        self._listings[ino] = (now, names)
        return names

    def _count_subdirs(self, ino: InodeNo) -> int:
        if ino == SNAPSHOTS_INO:
            return len(self._listing(ino))
        if ino == IMAGES_INO:
            return views.dir_images(self.repo.conn)
        if ino == VOLUMES_INO:
            return views.dir_volumes(self.repo.conn)
        return views.dir_snapshots(self.repo.conn, self._snapdir_name[ino])

    def _dir_check(self, ino: InodeNo) -> None:
        if ino not in (ROOT_INO, IMAGES_INO, VOLUMES_INO, SNAPSHOTS_INO) and ino not in self._snapdir_name:
            raise OSError(errno.ESTALE, f"unknown inode {ino}")

    def _snapdir(self, volume: str) -> InodeNo:
        ino = self._snapdir_ino.get(volume)
        if ino is None:
            ino = self._snapdir_ino[volume] = InodeNo(_FIRST_DYNAMIC_INO + len(self._snapdir_ino))
            self._snapdir_name[ino] = volume
        return ino

    def _remember(self, key: tuple[object, ...], subject: Subject, make: Callable[[], View]) -> View:
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = make()
            self._subjects[id(view)] = subject
        return view

    def _image(self, name: str) -> View:
        image = image_row(self.repo.conn, name)
        if image is None or image.phase != ImagePhase.READY or image.root is None:
            raise enoent(name)
        row = Root(image.kind, image.root, image.chunk_size, image.next_ino, image.created)
        return self._remember(
            ("image", name, row.root),
            Subject("image", name),
            lambda: _static(self.repo, row, f"images/{name}"),
        )

    def _volume(self, name: str) -> View:
        """A read/write volume is served by a view that claims it only when first
        changed (browsing claims nothing); one another live process holds is served
        read-only from its base, and its phase says who holds it."""
        row = volume_row(self.repo.conn, name)
        if row is None or row.phase in views.HIDDEN_PHASES:
            raise enoent(name)
        base = row.base
        rw = self._rw.get(name)
        if rw is not None and rw.claimed:
            return rw  # ours: its changes are the volume's
        pid = row.owner_pid
        held_elsewhere = row.phase != VolumePhase.READY and pid not in (None, os.getpid()) and alive(pid)
        open_rw = self.open_rw
        if row.mode == "rw" and open_rw is not None and not held_elsewhere:
            # An unclaimed view caches the catalog: a new one once the volume moved on.
            generation = (base, row.next_snapshot)
            if rw is None or self._rw_generation.get(name) != generation:
                opened = open_rw(name).rw
                assert opened is not None, "open_rw made a read-only view"
                rw = self._rw[name] = opened
                self._subjects[id(rw)] = Subject("volume", name)
                self._rw_generation[name] = generation
            return rw
        return self._remember(
            ("volume", name, base),
            Subject("volume", name),
            lambda: _static(
                self.repo, Root(row.kind, base, row.chunk_size, row.next_ino, row.created), f"volumes/{name}"
            ),
        )

    def _snapshot(self, volume: str, n: SnapshotNo) -> View:
        snap = snapshot_row(self.repo.conn, volume, n)
        if snap is None:
            return self._frozen(volume, n)
        # Folded: new lookups get it as stored (the kernel's open files keep the frozen view).
        self._frozen_views.pop((volume, n), None)
        row = Root(snap.kind, snap.root, snap.chunk_size, snap.next_ino, snap.created)
        label = f"snapshots/{volume}/{n}"
        return self._remember(
            ("snapshot", volume, n, row.root),
            Subject("snapshot", volume, n),
            lambda: _static(self.repo, row, label),
        )

    def _frozen(self, volume: str, n: SnapshotNo) -> View:
        """A snapshot taken while mounted whose fold has not committed: readable at once,
        its frozen epochs over its base, whichever process holds the volume."""
        key = (volume, n)
        if not pending_snapshot(self.repo.conn, volume, n):
            self._frozen_views.pop(key, None)
            if snapshot_row(self.repo.conn, volume, n) is None:
                raise enoent(f"{volume}@{n}")
            return self._snapshot(volume, n)  # (folded just now)
        view = self._frozen_views.get(key)
        if view is None:
            view = FrozenBlockView.open(self.repo, volume, n, f"snapshots/{volume}/{n}")
            if view is None:
                raise enoent(f"{volume}@{n}")
            if view.stored is not None:  # (folded while it opened)
                return self._snapshot(volume, n)
            self._frozen_views[key] = view
            self._subjects[id(view)] = Subject("snapshot", volume, n)
        return view


def resolve(view: View, parent: InodeNo, name: bytes) -> tuple[View, InodeNo, Stat]:
    """Look a name up, following a junction into another view (storeview.StoreView)."""
    if not isinstance(view, StoreView):
        st = view.lookup(parent, name)
        return view, st.ino, st
    child, ino = view.resolve(parent, name)
    return child, ino, child.getattr(ino)


def entries(view: View, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, View, InodeNo, Stat, int]]:
    """(name, view, inode, stat, next offset) from `offset` on, through junctions too."""
    if not isinstance(view, StoreView):
        for name, st, nxt in view.readdir(ino, offset):
            yield name, view, st.ino, st, nxt
        return
    for name, child, cino, nxt in view.entries(ino, offset):
        yield name, child, cino, child.getattr(cino), nxt


def _name(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise enoent(raw.decode(errors="replace")) from None
