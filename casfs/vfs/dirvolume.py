"""A mounted read/write directory volume: a base tree plus the overlay (names,
attributes, data), with write-back. Synchronous and trio-free: tests drive it without
a mount, the FUSE adapter through casfs.vfs.api.RwView."""

from __future__ import annotations

from casfs.catalog import overlay as rows
from casfs.kinds import BlobKind, VolumeKind
from casfs.snapshots import chunkmap
from casfs.vfs.api import ROOT_INO, RwView
from casfs.vfs.overlay.fold import FoldJob, run_fold_dir
from casfs.vfs.overlay.namespace import Namespace
from casfs.vfs.overlay.nodes import Node


class DirVolume(Namespace, volume_kind=VolumeKind.DIR):
    @property
    def rw(self) -> RwView:
        return self

    def _base_root(self, size: int) -> Node:
        return Node.from_tree(self._tree(self.base), self.base, ROOT_INO)

    def _content(self, node: Node) -> chunkmap.Content | chunkmap.ChunkMap:
        content = self._contents.get(node.ino)
        if content is None:
            mapped = rows.blob_kind(self.repo.conn, node.base) == BlobKind.MAP_ROOT
            content = chunkmap.Content(
                self.repo.get_meta, node.base, node.attrs.size, self.chunk_size, mapped
            )
            self._contents[node.ino] = content
        return content

    def run_fold(self, job: FoldJob) -> None:
        run_fold_dir(self.repo, self.name, self.base, self.chunk_size, self.next_ino, job)

    @property
    def size_bytes(self) -> int:
        return self.logical
