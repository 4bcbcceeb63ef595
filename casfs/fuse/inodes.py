"""The inode table: (view, view inode) <-> FUSE inode number, and lookup counts.

Every view gets an index when first seen (the mount's root view is 0) and its inode
numbers are shifted into a space of their own:

    fuse inode = view index << VIEW_SHIFT | view inode

so the mapping needs no table, a FUSE inode number is stable for the mount's lifetime
(even after the kernel forgets it and looks it up again), and a single-volume mount
shows the volume's own inode numbers unchanged. Views are never dropped while mounted.

Lookup counts (pyfuse3's contract, see Operations.forget): lookup, create, mkdir,
mknod, symlink, link and every accepted readdirplus entry add one; forget takes them
away. When an inode's count reaches zero the view's forget(ino) is called, which is
where a read/write view may release an unlinked inode's data.
"""

from __future__ import annotations

import errno
from typing import NewType

from casfs.ids import InodeNo
from casfs.vfs.api import ROOT_INO, View

VIEW_SHIFT = 40
_INO_MASK = (1 << VIEW_SHIFT) - 1

FuseIno = NewType("FuseIno", int)
ROOT = FuseIno(ROOT_INO)


class InodeTable:
    def __init__(self, root: View) -> None:
        self._views: list[View] = [root]
        self._index: dict[int, int] = {id(root): 0}
        self._lookups: dict[int, int] = {}

    def get(self, fino: int) -> tuple[View, InodeNo]:
        """The (view, view inode) a FUSE inode names."""
        index = fino >> VIEW_SHIFT
        if index >= len(self._views):
            raise OSError(errno.ESTALE, f"unknown inode {fino}")
        return self._views[index], InodeNo(fino & _INO_MASK)

    def fuse_ino(self, view: View, ino: InodeNo) -> FuseIno:
        """The FUSE inode of (view, ino), without taking a reference."""
        if ino > _INO_MASK:
            raise OSError(errno.EOVERFLOW, f"inode number {ino} is too large")
        index = self._index.get(id(view))
        if index is None:
            index = self._index[id(view)] = len(self._views)
            self._views.append(view)
        return FuseIno(index << VIEW_SHIFT | ino)

    def ref(self, view: View, ino: InodeNo) -> FuseIno:
        """Count one lookup of (view, ino): the kernel now holds it."""
        fino = self.fuse_ino(view, ino)
        self._lookups[fino] = self._lookups.get(fino, 0) + 1
        return fino

    def held(self, fino: int) -> bool:
        """Whether the kernel holds (view, ino) (a lookup not yet forgotten)."""
        return fino in self._lookups

    def forget(self, fino: int, n: int) -> None:
        left = self._lookups.get(fino, 0) - n
        if left > 0:
            self._lookups[fino] = left
            return
        self._lookups.pop(fino, None)
        if fino != ROOT:
            view, ino = self.get(fino)
            view.forget(ino)

    def release_unreferenced(self, view: View, ino: InodeNo) -> None:
        """A view remembered an inode the kernel did not take (readdirplus stopped
        early): let it forget, unless the kernel holds it from elsewhere."""
        fino = self.fuse_ino(view, ino)
        if fino not in self._lookups and fino != ROOT:
            view.forget(ino)
