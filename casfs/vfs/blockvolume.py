"""A mounted read/write block volume: one regular file (ROOT_INO) of a fixed size, a
base chunk map plus the overlay's chunks, with write-back. No names: the namespace
calls are refused as a regular file refuses them. Synchronous and trio-free, like
casfs.vfs.dirvolume."""

from __future__ import annotations

import errno
import stat
from collections.abc import Iterator

from casfs.catalog import overlay as rows
from casfs.ids import InodeNo
from casfs.kinds import VolumeKind
from casfs.snapshots import chunkmap
from casfs.snapshots.tree import Attrs
from casfs.vfs.api import ROOT_INO, RwView, Stat, fs_error
from casfs.vfs.overlay.data import Data
from casfs.vfs.overlay.fold import FoldJob, run_fold_block
from casfs.vfs.overlay.nodes import Node


class BlockVolume(Data, volume_kind=VolumeKind.BLOCK):
    fixed_size = True

    @property
    def rw(self) -> RwView:
        return self

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
        run_fold_block(self.repo, self.name, self.base, self.next_ino, job)

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
