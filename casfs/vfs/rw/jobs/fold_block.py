"""A block volume's snapshot where it cannot freeze (chunks an older casfs flushed as
overlay rows changed the disk too): those chunks, then the written epoch's blocks over
them, into a new chunk map; snapshot n+1 and the new base in one transaction; the
epoch's files deleted once it has committed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from casfs.ids import ROOT_INO, SnapshotNo
from casfs.lifecycle.faults import fault_point
from casfs.snapshots import chunkmap
from casfs.vfs.overlay.upper import Upper
from casfs.vfs.rw.jobs.fold import OverlayFold
from casfs.vfs.rw.jobs.puts import publish_fold, put_all, upper_chunks

if TYPE_CHECKING:
    from casfs.vfs.rw.blockkind import BlockKind


@dataclass
class BlockFold:
    fold: OverlayFold
    kind: BlockKind
    upper: Upper | None  # the written epoch
    what: str = "snapshot"
    slot: bool = True
    stored_bytes: int = 0

    @staticmethod
    def capture(kind: BlockKind, label: str | None) -> BlockFold:
        kind.settle()
        return BlockFold(OverlayFold.capture(kind.vol, label), kind, kind.uppers.active)

    @property
    def snapshot(self) -> SnapshotNo:
        return self.fold.snapshot

    def run(self) -> None:
        assert not self.kind.uppers.frozen, "frozen epochs are folded before the written one"
        fold, upper = self.fold, self.upper
        repo, base = fold.vol.repo, fold.base
        with repo.batch() as batch:
            root = fold.rows.get(ROOT_INO)
            size = root.attrs.size if root else chunkmap.MapRoot.decode(repo.get_meta(base)).size
            changes = dict(fold.chunk_ids.get(ROOT_INO, {}))
            cmap = chunkmap.ChunkMap(repo.get_meta, base)
            if upper is not None:
                changes.update(put_all(batch, upper_chunks(repo, cmap, changes, upper, size)))
            fold.new_root = cmap.rewrite(batch.put_kind, changes, size)
            fault_point("fold:before-publish")
            # The disk file's attributes stay: no part of a snapshot (a chunk map).
            epoch = None if upper is None else upper.epoch
            fold.snapshot = publish_fold(
                batch, fold.vol.name, base, fold.next_ino, fold.new_root, size, fold.label, epoch, ROOT_INO
            )
            self.stored_bytes = batch.stored_bytes
        fold.bases[ROOT_INO] = fold.new_root
        if upper is not None:
            fault_point("fold:after-publish")
            upper.delete()

    def apply(self) -> None:
        self.fold.applied()
        self.kind.uppers.active = None  # (its files are gone; reads planned before keep it open)
        self.kind.upper_only = 0

    def abort(self) -> None:
        self.fold.aborted()
