"""What a fold of the overlay shares between the kinds (fold_dir.py, fold_block.py):
its capture (the overlay's nodes and chunks as they are right after a flush, when the
catalog matches memory) and its apply (the folded root is the new base; the overlay
keeps only the unlinked inodes still open)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from casfs.ids import ChunkNo, InodeNo, SnapshotNo
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.overlay.nodes import NO_LIMIT, Node
from casfs.vfs.rw.jobs.puts import NOT_YET

if TYPE_CHECKING:
    from casfs.vfs.rw.volume import RwVolume


@dataclass
class OverlayFold:
    vol: RwVolume
    label: str | None
    rows: dict[InodeNo, Node]
    chunk_ids: dict[InodeNo, dict[ChunkNo, BlobId]]
    logical: int
    base: BlobId
    next_ino: InodeNo
    new_root: BlobId = ZERO_ID
    snapshot: SnapshotNo = NOT_YET  # set by the run
    bases: dict[InodeNo, BlobId] = field(default_factory=dict)  # ino -> its id in the new root
    parents: dict[InodeNo, InodeNo] = field(default_factory=dict)  # ino -> a directory naming it there

    @staticmethod
    def capture(vol: RwVolume, label: str | None) -> OverlayFold:
        """Call right after a flush, with the lock held. The view is frozen until the
        fold is applied or aborted."""
        node_rows = {i: vol.nodes[i].copy() for i in vol.overlay if i in vol.nodes}
        chunk_ids = {i: dict(c) for i, c in vol.chunk_ids.items() if i in node_rows}
        vol.freeze()
        return OverlayFold(vol, label, node_rows, chunk_ids, vol.logical, vol.base, vol.next_ino)

    def applied(self) -> None:
        vol = self.vol
        vol.frozen = False
        vol.base = self.new_root
        for ino in list(vol.overlay):
            node = vol.nodes.get(ino)
            if node is None:
                continue
            if node.attrs.nlink == 0:
                continue  # unlinked but open: stays in memory only, its data still below
            node.base = self.bases.get(ino, node.base)
            # A file's parent goes stale when it moves or loses a name (only a directory's
            # is kept up to date); the next copy-up must materialize where it is now.
            node.parent = self.parents.get(ino, node.parent)
            node.base_limit = NO_LIMIT
            node.listing = None
        vol.overlay = {i for i in vol.overlay if i in vol.nodes and vol.nodes[i].attrs.nlink == 0}
        vol.chunk_ids = {i: c for i, c in vol.chunk_ids.items() if i in vol.overlay}
        vol.contents.clear()
        vol.kind.folded()
        vol.thaw()  # (a read during the fold is now of a base inode: no atime)

    def aborted(self) -> None:
        """The fold failed: its transaction did not commit, the overlay stays as it was."""
        self.vol.thaw()
